#include "flowstate/nodes/sources/tar.h"
#include "flowstate/nodes/builtin.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <sstream>

#include "flowstate/core/error.h"
#include "tests/support/formats.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::TarEntry;
using testing::TarFormat;
using testing::TempDir;

using Fields = std::map<std::string, std::string>;

/// The fields of a sample, by name, as text.
Fields fields_of(const Sample& s) {
  Fields out;
  for (const auto& [id, t] : s) {
    EXPECT_EQ(t.dtype(), DType::kUInt8);
    EXPECT_EQ(t.shape().rank(), 1u);
    out[std::string(field_name(id))] = std::string(static_cast<const char*>(t.data()), t.nbytes());
  }
  return out;
}

/// Every record of `src` in pull order: its key and fields.
std::vector<std::pair<std::string, Fields>> read_all(TarSource& src) {
  src.start_epoch(0);
  std::vector<Ref> refs(src.size(0) + 1);
  refs.resize(src.pull(refs));
  std::vector<std::pair<std::string, Fields>> out;
  for (const Ref& r : refs) {
    Sample s;
    src.read(r, s);
    out.emplace_back(std::string(src.key(r)), fields_of(s));
  }
  return out;
}

/// The DataError opening a tar source on `path` with `options` throws.
DataError open_error(const std::string& path, TarOptions options = {}) {
  options.paths = {path};
  try {
    TarSource src("tar", options);
  } catch (const DataError& e) {
    return e;
  }
  ADD_FAILURE() << "no DataError";
  return DataError("", 0, "");
}

/// Expects opening `path` to fail at `offset` with "'PATH' byte OFFSET: what".
void expect_open_error(const std::string& path, std::uint64_t offset, const std::string& what,
                       TarOptions options = {}) {
  DataError e = open_error(path, std::move(options));
  EXPECT_EQ(e.file(), path);
  EXPECT_EQ(e.offset(), offset);
  EXPECT_EQ(std::string(e.what()), "'" + path + "' byte " + std::to_string(offset) + ": " + what);
}

// ---- grouping ----

TEST(TarSource, GroupsConsecutiveMembersByKey) {
  TempDir dir;
  testing::write_tar(dir / "s.tar", {{"dir/", "", '5'},
                                     {"dir/a.b.c", "1"},
                                     {"dir/a.txt", "2"},
                                     {"dir/b.txt", "3"},
                                     {"dir/README", "no extension"},
                                     {"dir/b.lnk", "", '2'},
                                     {"dir/.hidden", "no stem"},
                                     {"dir/b.cls", "4"},
                                     {"dir/a.txt", "5"},
                                     {"dir.x/c.y", "6"},
                                     {"dir.x/trailing.", "no extension"}});
  TarSource src("tar", {.paths = {dir / "s.tar"}});
  EXPECT_EQ(src.record_bytes(), 0u);
  EXPECT_EQ(read_all(src),
            (std::vector<std::pair<std::string, Fields>>{{"dir/a", {{"b.c", "1"}, {"txt", "2"}}},
                                                         {"dir/b", {{"txt", "3"}, {"cls", "4"}}},
                                                         {"dir/a", {{"txt", "5"}}},
                                                         {"dir.x/c", {{"y", "6"}}}}));
}

TEST(TarSource, ReadsAnEmptyArchive) {
  TempDir dir;
  testing::write_tar(dir / "empty.tar", {});
  testing::write_file(dir / "zero.tar", "");
  TarSource src("tar", {.paths = {dir / "empty.tar", dir / "zero.tar"}});
  EXPECT_EQ(src.size(0), 0u);
}

TEST(TarSource, RejectsTwoMembersWithOneExtension) {
  TempDir dir;
  auto at = testing::write_tar(dir / "s.tar", {{"a.txt", "1"}, {"a.cls", "2"}, {"a.txt", "3"}});
  expect_open_error(dir / "s.tar", at[2].start, "sample 'a' has two 'txt' members");
}

TEST(TarSource, ReadsGnuLongNames) {
  TempDir dir;
  const std::string deep = "shards/" + std::string(150, 'd') + "/sample-000001";
  auto at = testing::write_tar(dir / "s.tar", {{deep + ".txt", "x"}, {deep + ".cls", "7"}},
                               {.format = TarFormat::kGnu});
  ASSERT_LT(at[0].start, at[0].header) << "a long-name header precedes the member";
  TarSource src("tar", {.paths = {dir / "s.tar"}});
  EXPECT_EQ(read_all(src),
            (std::vector<std::pair<std::string, Fields>>{{deep, {{"txt", "x"}, {"cls", "7"}}}}));
}

TEST(TarSource, ReadsPaxLongNames) {
  TempDir dir;
  const std::string deep = "shards/" + std::string(150, 'p') + "/sample-000001";
  auto at = testing::write_tar(dir / "s.tar", {{deep + ".txt", "x"}, {"short.txt", "y"}},
                               {.format = TarFormat::kPax});
  ASSERT_LT(at[0].start, at[0].header) << "a pax header precedes the member";
  TarSource src("tar", {.paths = {dir / "s.tar"}});
  EXPECT_EQ(read_all(src), (std::vector<std::pair<std::string, Fields>>{
                               {deep, {{"txt", "x"}}}, {"short", {{"txt", "y"}}}}));
}

TEST(TarSource, ReadsUstarPrefixedNames) {
  TempDir dir;
  const std::string deep = std::string(120, 'u') + "/sample-000001";
  auto at = testing::write_tar(dir / "s.tar", {{deep + ".txt", "x"}});
  ASSERT_EQ(at[0].start, at[0].header) << "the name is split into ustar's prefix and name";
  TarSource src("tar", {.paths = {dir / "s.tar"}});
  EXPECT_EQ(src.key(src.at(0, 0)), deep);
}

TEST(TarSource, HonoursPaxPathAndSize) {
  TempDir dir;
  // A hand-written pax header renames the next member and gives its size; the member's own
  // header says 0 bytes.
  auto at = testing::write_tar(
      dir / "s.tar", {{"PaxHeaders/x",
                       testing::pax_record("path", "renamed.txt") +
                           testing::pax_record("mtime", "1.5") + testing::pax_record("size", "5"),
                       'x'},
                      {"original.txt", "hello"},
                      {"renamed.cls", "1"}});
  testing::patch_tar_header(dir / "s.tar", at[1].header, testing::kTarSizeField, "00000000000");
  TarSource src("tar", {.paths = {dir / "s.tar"}});
  EXPECT_EQ(
      read_all(src),
      (std::vector<std::pair<std::string, Fields>>{{"renamed", {{"txt", "hello"}, {"cls", "1"}}}}));
  // The sample's raw bytes start at the pax header.
  auto raw = src.record(src.at(0, 0));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(raw.data()), raw.size()),
            testing::read_file(dir / "s.tar").substr(at[0].start, at[2].data + 1 - at[0].start));
}

TEST(TarSource, ReadsAGnuBase256Size) {
  TempDir dir;
  auto at = testing::write_tar(dir / "s.tar", {{"a.txt", "hello"}});
  // GNU writes sizes of 8 GiB and more in binary: a set high bit, then big-endian bytes.
  testing::patch_tar_header(dir / "s.tar", at[0].header, testing::kTarSizeField,
                            std::string("\x80\0\0\0\0\0\0\0\0\0\0\x04", 12));
  TarSource src("tar", {.paths = {dir / "s.tar"}});
  EXPECT_EQ(read_all(src), (std::vector<std::pair<std::string, Fields>>{{"a", {{"txt", "hell"}}}}));
}

TEST(TarSource, ReturnsTheRawBytesOfASample) {
  TempDir dir;
  auto at = testing::write_tar(dir / "s.tar",
                               {{"a.txt", "1"}, {"b.txt", "22"}, {"b.cls", "333"}, {"c.txt", "4"}},
                               {.format = TarFormat::kGnu});
  TarSource src("tar", {.paths = {dir / "s.tar"}});
  auto raw = src.record(src.at(0, 1));
  const std::string file = testing::read_file(dir / "s.tar");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(raw.data()), raw.size()),
            file.substr(at[1].start, at[2].data + 3 - at[1].start));
}

// ---- fields ----

TEST(TarSource, FailsOnASampleMissingAField) {
  TempDir dir;
  auto at = testing::write_tar(dir / "s.tar", {{"a.txt", "1"},
                                               {"a.cls", "2"},
                                               {"b.txt", "3"},
                                               {"b.json", "{}"},
                                               {"c.txt", "4"},
                                               {"c.cls", "5"}});
  expect_open_error(dir / "s.tar", at[2].start, "sample 'b' has no 'cls' member",
                    {.fields = {"txt", "cls"}});
}

TEST(TarSource, SkipsASampleMissingAFieldWhenAsked) {
  TempDir dir;
  testing::write_tar(dir / "s.tar", {{"a.txt", "1"},
                                     {"a.cls", "2"},
                                     {"a.json", "{}"},
                                     {"b.txt", "3"},
                                     {"b.json", "{}"},
                                     {"c.cls", "5"},
                                     {"c.txt", "4"}});
  TarSource src(
      "tar",
      {.paths = {dir / "s.tar"}, .fields = {"txt", "cls"}, .on_missing = MissingField::kSkip});
  // b is no record; json members are not read.
  EXPECT_EQ(read_all(src),
            (std::vector<std::pair<std::string, Fields>>{{"a", {{"txt", "1"}, {"cls", "2"}}},
                                                         {"c", {{"txt", "4"}, {"cls", "5"}}}}));
  EXPECT_EQ(src.at(0, 1), (Ref{0, 0, 1}));
}

// ---- malformed archives ----

TEST(TarSource, RejectsABadChecksumWithFileAndOffset) {
  TempDir dir;
  auto at = testing::write_tar(dir / "s.tar", {{"a.txt", "1"}, {"b.txt", "2"}, {"c.txt", "3"}});
  testing::patch_file(dir / "s.tar", at[1].header, "x");  // the name changes, the checksum not
  expect_open_error(dir / "s.tar", at[1].header, "bad tar header checksum");
  // A checksum field that is no number at all.
  testing::write_tar(dir / "s.tar", {{"a.txt", "1"}, {"b.txt", "2"}});
  testing::patch_file(dir / "s.tar", at[1].header + testing::kTarChecksumField, "zz");
  expect_open_error(dir / "s.tar", at[1].header, "bad tar header checksum");
}

TEST(TarSource, RejectsANonOctalSize) {
  TempDir dir;
  auto at = testing::write_tar(dir / "s.tar", {{"a.txt", "1"}, {"b.txt", "2"}});
  testing::patch_tar_header(dir / "s.tar", at[1].header, testing::kTarSizeField, "0000000009");
  expect_open_error(dir / "s.tar", at[1].header, "tar header size field is not octal");
}

TEST(TarSource, RejectsAMemberRunningPastTheEnd) {
  TempDir dir;
  auto at = testing::write_tar(dir / "s.tar", {{"a.txt", "1"}, {"b.txt", "hello"}},
                               {.end_blocks = false});
  fs::resize_file(dir / "s.tar", at[1].data + 3);  // cut inside b's data
  expect_open_error(dir / "s.tar", at[1].header,
                    "member 'b.txt' (5 bytes) runs past the end of the file (1539 bytes)");
  // A size bigger than the file.
  testing::write_tar(dir / "s.tar", {{"a.txt", "1"}, {"b.txt", "hello"}});
  testing::patch_tar_header(dir / "s.tar", at[1].header, testing::kTarSizeField, "77777777777");
  expect_open_error(dir / "s.tar", at[1].header,
                    "member 'b.txt' (8589934591 bytes) runs past the end of the file (3072 "
                    "bytes)");
}

TEST(TarSource, RejectsATruncatedHeaderOrTrailingGarbage) {
  TempDir dir;
  auto at = testing::write_tar(dir / "s.tar", {{"a.txt", "1"}}, {.end_blocks = false});
  const std::string tar = testing::read_file(dir / "s.tar");
  testing::write_file(dir / "s.tar", tar + std::string(100, 'g'));
  expect_open_error(dir / "s.tar", 1024, "truncated tar header (the file ends 100 bytes into it)");
  testing::write_file(dir / "s.tar", tar + std::string(512, 'g'));
  expect_open_error(dir / "s.tar", 1024, "bad tar header checksum");
  testing::write_file(dir / "s.tar", tar.substr(0, at[0].header + 300));
  expect_open_error(dir / "s.tar", 0, "truncated tar header (the file ends 300 bytes into it)");
}

TEST(TarSource, AcceptsAnArchiveWithoutEndBlocksOrWithPadding) {
  TempDir dir;
  testing::write_tar(dir / "a.tar", {{"a.txt", "1"}, {"b.txt", "2"}}, {.end_blocks = false});
  testing::write_tar(dir / "b.tar", {{"c.txt", "3"}});
  // tar pads archives to whole records of 10 KiB; what follows the end blocks is not read.
  const std::string b = testing::read_file(dir / "b.tar");
  testing::write_file(dir / "b.tar", b + std::string(10240 - b.size(), '\0') + "trailing");
  TarSource src("tar", {.paths = {dir / "*.tar"}});
  EXPECT_EQ(src.size(0), 3u);
  EXPECT_EQ(src.key(src.at(0, 2)), "c");
}

TEST(TarSource, RejectsAnArchiveEndingAfterALongNameHeader) {
  TempDir dir;
  auto at = testing::write_tar(dir / "s.tar", {{std::string(120, 'n') + ".txt", "1"}},
                               {.format = TarFormat::kGnu, .end_blocks = false});
  fs::resize_file(dir / "s.tar", at[0].header);
  expect_open_error(dir / "s.tar", 0, "the archive ends after an extended header");
}

TEST(TarSource, RejectsAMalformedPaxHeader) {
  TempDir dir;
  auto at = testing::write_tar(dir / "s.tar", {{std::string(120, 'n') + ".txt", "1"}},
                               {.format = TarFormat::kPax});
  testing::patch_file(dir / "s.tar", at[0].start + 512, "9");  // the record's length is wrong
  expect_open_error(dir / "s.tar", at[0].start, "malformed pax header");
}

// ---- access, cache, checkpoints ----

/// Writes `files` tar shards of `samples` samples each: "%06d.txt" (8 bytes), "%06d.cls"
/// (4 bytes) and "%06d.json" (varying); returns their glob.
std::string write_shards(const TempDir& dir, int files, int samples) {
  for (int f = 0; f < files; ++f) {
    std::vector<TarEntry> members;
    for (int i = 0; i < samples; ++i) {
      char key[16];
      std::snprintf(key, sizeof(key), "%06d", f * samples + i);
      members.push_back({std::string(key) + ".txt", "txt" + std::string(key).substr(1)});
      members.push_back({std::string(key) + ".cls", std::to_string(1000 + i % 7)});
      members.push_back({std::string(key) + ".json", std::string(i % 5, '{')});
    }
    testing::write_tar(dir / ("shard-" + std::to_string(f) + ".tar"), members,
                       {.format = f % 2 == 0 ? TarFormat::kUstar : TarFormat::kGnu});
  }
  return dir / "shard-*.tar";
}

TEST(TarSource, RandomAccessEqualsSequentialPull) {
  TempDir dir;
  TarSource src("tar", {.paths = {write_shards(dir, 3, 25)}}, 2);
  auto sequential = read_all(src);
  ASSERT_EQ(sequential.size(), 75u);
  EXPECT_EQ(sequential[30].first, "000030");
  EXPECT_EQ(sequential[30].second,
            (Fields{{"txt", "txt00030"}, {"cls", "1005"}, {"json", std::string(0, '{')}}));
  for (std::uint64_t i = 75; i-- > 0;) {  // backwards: no dependence on reading order
    Ref r = src.at(1, i);
    EXPECT_EQ(r, (Ref{2, static_cast<std::uint32_t>(i / 25), i}));
    Sample s;
    src.read(r, s);
    EXPECT_EQ(s.ref, r);
    EXPECT_EQ(std::string(src.key(r)), sequential[i].first);
    EXPECT_EQ(fields_of(s), sequential[i].second);
  }
}

TEST(TarSource, CachesItsMemberIndex) {
  TempDir dir;
  const std::string glob = write_shards(dir, 1, 10);
  const std::string cache = index_cache_path(dir / "shard-0.tar");
  std::vector<std::pair<std::string, Fields>> first;
  {
    TarSource src("tar", {.paths = {glob}});
    first = read_all(src);
  }
  ASSERT_TRUE(fs::is_regular_file(cache));
  const auto old = fs::file_time_type(std::chrono::seconds(1'000'000'000));
  fs::last_write_time(cache, old);
  {
    TarSource src("tar", {.paths = {glob}});
    EXPECT_EQ(read_all(src), first);
    // Field selection applies after the index: the same cache serves it.
    TarSource selected("tar", {.paths = {glob}, .fields = {"cls"}});
    EXPECT_EQ(read_all(selected)[3].second, (Fields{{"cls", "1003"}}));
    EXPECT_EQ(fs::last_write_time(cache), old) << "the cache was reused, not rewritten";
  }
  // A corrupt cache is rebuilt.
  std::string bytes = testing::read_file(cache);
  bytes[100] ^= 0x40;
  testing::write_file(cache, bytes);
  TarSource src("tar", {.paths = {glob}});
  EXPECT_EQ(read_all(src), first);
  EXPECT_NE(testing::read_file(cache), bytes);
}

TEST(TarSource, RestoreRejectsACursorPastTheEnd) {
  TempDir dir;
  TarSource src("tar", {.paths = {write_shards(dir, 1, 4)}});
  std::ostringstream os(std::ios::binary);
  {
    OutArchive ar(os);
    ar(CursorState{0, 9});
  }
  std::istringstream is(os.str(), std::ios::binary);
  InArchive ar(is);
  try {
    src.restore(ar);
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_STREQ(e.what(), "tar cursor 9 is past the source's 4 records");
  }
}

TEST(TarSource, SurvivesSaveAndRestore) {
  TempDir dir;
  TarOptions o{.paths = {write_shards(dir, 3, 50)}, .fields = {"txt", "cls"}};
  auto make = [&] {
    return Pipeline::Builder()
        .seed(17)
        .tar(o)
        .shuffle({.mode = ShuffleMode::kGlobal})
        .batch({.size = 16})
        .build();
  };
  testing::expect_save_restore(make, {.epochs = 2, .workers = 1}, {.epochs = 2, .workers = 2});
}

// ---- options ----

TEST(TarSource, RejectsBadOptions) {
  auto error_of = [](const TarOptions& o) {
    try {
      TarSource("tar", o);
    } catch (const ConfigError& e) {
      return e.key() + ": " + e.what();
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of({}), "tar.paths: tar.paths must name at least one file or glob");
  EXPECT_EQ(error_of({.paths = {"x"}, .fields = {"txt", "txt"}}),
            "tar.fields: fields lists 'txt' twice");
  EXPECT_EQ(error_of({.paths = {"x"}, .fields = {""}}),
            "tar.fields: fields has an empty extension");
  try {
    parse_missing_field("ignore");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "tar.on_missing");
    EXPECT_STREQ(e.what(), "unknown on_missing 'ignore' (known: error, skip)");
  }
  EXPECT_EQ(parse_missing_field(missing_field_name(MissingField::kSkip)), MissingField::kSkip);
}

TEST(TarSource, RejectsAnEmptyMatch) {
  TempDir dir;
  DataError e = open_error(dir / "*.tar");
  EXPECT_EQ(e.file(), dir / "*.tar");
  EXPECT_EQ(std::string(e.what()), "no file matches '" + dir / "*.tar" + "'");
}

TEST(TarSource, DescribesItsOptions) {
  TarOptions o{.paths = {"a/*.tar"}, .fields = {"jpg", "cls"}, .on_missing = MissingField::kSkip};
  EXPECT_EQ(tar_node().describe(o).to_string(),
            "tar(paths=a/*.tar, fields=jpg,cls, on_missing=skip)");
}

}  // namespace
}  // namespace flowstate
