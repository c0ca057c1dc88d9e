// The lines source and its index cache. Over 600 lines: one source's many cases (files, line
// endings, JSON lines, restores, every error text) and the index cache's rebuild rules.
#include "flowstate/nodes/sources/lines.h"
#include "flowstate/nodes/builtin.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "flowstate/core/error.h"
#include "flowstate/nodes/sources/index_cache.h"
#include "tests/support/formats.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::TempDir;

std::string text(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::kUInt8);
  return {static_cast<const char*>(t.data()), t.nbytes()};
}

std::string text(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

/// Every record of `src`, in pull order, as the text of `field`.
std::vector<std::string> read_all(LinesSource& src, const std::string& field = "text") {
  src.start_epoch(0);
  std::vector<Ref> refs(src.size(0) + 1);
  refs.resize(src.pull(refs));
  std::vector<std::string> out;
  for (const Ref& r : refs) {
    Sample s;
    src.read(r, s);
    out.push_back(text(s.at(field)));
  }
  return out;
}

/// The DataError `fn` throws (fails the test when it throws none).
template <class Fn>
DataError data_error(Fn&& fn) {
  try {
    fn();
  } catch (const DataError& e) {
    return e;
  }
  ADD_FAILURE() << "no DataError";
  return DataError("", 0, "");
}

/// The message of the DataError reading record i of `src` throws.
std::string read_error(const LinesSource& src, std::uint64_t i) {
  Sample s;
  return data_error([&] { src.read(src.at(0, i), s); }).what();
}

// ---- index cache ----

/// A data file and a builder that counts its calls.
class IndexCacheTest : public ::testing::Test {
 protected:
  void SetUp() override { testing::write_file(data_, "0123456789"); }

  FileIndex<std::uint64_t> load(IndexOrigin& origin, std::string_view kind = "test/1") {
    MappedFile file(data_);
    return load_index<std::uint64_t>(
        file, kind,
        [&] {
          ++builds_;
          FileIndex<std::uint64_t> index;
          for (std::size_t i = 0; i < file.size(); i += 3) index.entries.push_back(i);
          index.strings = "size " + std::to_string(file.size());
          return index;
        },
        &origin);
  }

  TempDir dir_;
  std::string data_ = dir_ / "data.txt";
  std::string cache_ = index_cache_path(data_);
  int builds_ = 0;
};

TEST_F(IndexCacheTest, BuildsTheIndexAndCachesItBesideTheFile) {
  IndexOrigin origin{};
  auto index = load(origin);
  EXPECT_EQ(origin, IndexOrigin::kBuilt);
  EXPECT_EQ(builds_, 1);
  EXPECT_EQ(index.entries, (std::vector<std::uint64_t>{0, 3, 6, 9}));
  EXPECT_EQ(index.strings, "size 10");
  EXPECT_EQ(cache_, dir_ / "data.txt.fsidx");
  EXPECT_TRUE(fs::is_regular_file(cache_));
  // Written through a temporary file that is gone after the rename.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_.path())) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"data.txt", "data.txt.fsidx"}));
}

TEST_F(IndexCacheTest, ReusesAValidCacheWithoutRewritingIt) {
  IndexOrigin origin{};
  load(origin);
  // An old mtime on the cache: any rewrite would move it to now.
  const auto old = fs::file_time_type(std::chrono::seconds(1'000'000'000));
  fs::last_write_time(cache_, old);
  auto index = load(origin);
  EXPECT_EQ(origin, IndexOrigin::kCache);
  EXPECT_EQ(builds_, 1);
  EXPECT_EQ(index.entries, (std::vector<std::uint64_t>{0, 3, 6, 9}));
  EXPECT_EQ(index.strings, "size 10");
  EXPECT_EQ(fs::last_write_time(cache_), old);
}

TEST_F(IndexCacheTest, RebuildsWhenTheDataFileChangesSize) {
  IndexOrigin origin{};
  load(origin);
  testing::write_file(data_, "0123456789abc");
  auto index = load(origin);
  EXPECT_EQ(origin, IndexOrigin::kBuilt);
  EXPECT_EQ(builds_, 2);
  EXPECT_EQ(index.entries, (std::vector<std::uint64_t>{0, 3, 6, 9, 12}));
  load(origin);
  EXPECT_EQ(origin, IndexOrigin::kCache);  // the rewritten cache is valid
}

TEST_F(IndexCacheTest, RebuildsWhenTheDataFileChangesMtime) {
  IndexOrigin origin{};
  load(origin);
  const auto t = fs::last_write_time(data_);
  testing::write_file(data_, "abcdefghij");  // same size
  fs::last_write_time(data_, t + std::chrono::seconds(2));
  load(origin);
  EXPECT_EQ(origin, IndexOrigin::kBuilt);
  EXPECT_EQ(builds_, 2);
}

TEST_F(IndexCacheTest, RebuildsACorruptCache) {
  IndexOrigin origin{};
  load(origin);
  const std::string good = testing::read_file(cache_);
  // A flipped entry byte (the checksum catches it), a truncated file and an empty one.
  std::string flipped = good;
  flipped[64] ^= 1;
  for (const std::string& bad : {flipped, good.substr(0, good.size() - 3), std::string()}) {
    testing::write_file(cache_, bad);
    auto index = load(origin);
    EXPECT_EQ(origin, IndexOrigin::kBuilt);
    EXPECT_EQ(index.entries, (std::vector<std::uint64_t>{0, 3, 6, 9}));
    EXPECT_EQ(testing::read_file(cache_), good);
  }
  EXPECT_EQ(builds_, 4);
}

TEST_F(IndexCacheTest, RebuildsACacheOfAnotherKind) {
  IndexOrigin origin{};
  load(origin, "test/1");
  load(origin, "test/2");
  EXPECT_EQ(origin, IndexOrigin::kBuilt);
  load(origin, "test/2");
  EXPECT_EQ(origin, IndexOrigin::kCache);
  EXPECT_EQ(builds_, 2);
}

TEST_F(IndexCacheTest, KeepsTheIndexInMemoryWhenTheCacheCannotBeWritten) {
  // A directory where the cache belongs: the rename fails, whoever runs the test.
  fs::create_directory(cache_);
  IndexOrigin origin{};
  auto index = load(origin);
  EXPECT_EQ(origin, IndexOrigin::kInMemory);
  EXPECT_EQ(index.entries, (std::vector<std::uint64_t>{0, 3, 6, 9}));
  load(origin);
  EXPECT_EQ(origin, IndexOrigin::kInMemory);
  EXPECT_EQ(builds_, 2);
  EXPECT_TRUE(fs::is_empty(cache_));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_.path()), fs::directory_iterator()), 2)
      << "the temporary file is removed";
}

TEST_F(IndexCacheTest, KeepsTheIndexInMemoryInAReadOnlyDirectory) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into read-only directories";
  fs::permissions(dir_.path(), fs::perms::owner_read | fs::perms::owner_exec);
  IndexOrigin origin{};
  auto index = load(origin);
  fs::permissions(dir_.path(), fs::perms::owner_all);
  EXPECT_EQ(origin, IndexOrigin::kInMemory);
  EXPECT_EQ(index.entries, (std::vector<std::uint64_t>{0, 3, 6, 9}));
  EXPECT_FALSE(fs::exists(cache_));
}

TEST_F(IndexCacheTest, WritesNoCacheWhenTheBuilderThrows) {
  MappedFile file(data_);
  EXPECT_THROW(load_index<std::uint64_t>(
                   file, "test/1",
                   []() -> FileIndex<std::uint64_t> { throw DataError("f", 0, "malformed"); }),
               DataError);
  EXPECT_FALSE(fs::exists(cache_));
}

// ---- text ----

TEST(LinesSource, NumbersLinesAcrossFilesInSortedOrder) {
  TempDir dir;
  testing::write_lines(dir / "b.txt", {"b0", "b1", "b2"});
  testing::write_lines(dir / "a.txt", {"a0", "a1"});
  LinesSource src("lines", {.paths = {dir / "*.txt"}});
  ASSERT_EQ(src.size(0), 5u);
  EXPECT_EQ(src.files(), (std::vector<std::string>{dir / "a.txt", dir / "b.txt"}));
  EXPECT_EQ(read_all(src), (std::vector<std::string>{"a0", "a1", "b0", "b1", "b2"}));
  EXPECT_EQ(src.at(0, 1), (Ref{0, 0, 1}));
  EXPECT_EQ(src.at(0, 2), (Ref{0, 1, 2}));
  EXPECT_EQ(src.record_bytes(), 0u);
}

TEST(LinesSource, HandlesCrlfAndMissingFinalNewline) {
  TempDir dir;
  testing::write_lines(dir / "crlf.txt", {"one", "two", "three"},
                       {.crlf = true, .final_newline = false});
  testing::write_lines(dir / "lf.txt", {"four", "five"}, {.final_newline = false});
  LinesSource src("lines", {.paths = {dir / "crlf.txt", dir / "lf.txt"}});
  EXPECT_EQ(read_all(src), (std::vector<std::string>{"one", "two", "three", "four", "five"}));
  EXPECT_EQ(text(src.record(src.at(0, 1))), "two");
}

TEST(LinesSource, KeepsEmptyLinesAsEmptyRecords) {
  TempDir dir;
  testing::write_file(dir / "a.txt", "\nx\n\r\n  \n\n");
  LinesSource src("lines", {.paths = {dir / "a.txt"}});
  EXPECT_EQ(read_all(src), (std::vector<std::string>{"", "x", "", "  ", ""}));
  Sample s;
  src.read(src.at(0, 0), s);
  EXPECT_EQ(s.at("text").shape(), (Shape{0}));
}

TEST(LinesSource, SkipsEmptyLinesWhenAsked) {
  TempDir dir;
  testing::write_file(dir / "a.txt", "\nx\n\r\n  \n\ny");
  LinesSource src("lines", {.paths = {dir / "a.txt"}, .skip_empty = true});
  EXPECT_EQ(read_all(src), (std::vector<std::string>{"x", "  ", "y"}));
}

TEST(LinesSource, ReadsAnEmptyFileAsNoRecords) {
  TempDir dir;
  testing::write_file(dir / "a.txt", "");
  LinesSource src("lines", {.paths = {dir / "a.txt"}});
  EXPECT_EQ(src.size(0), 0u);
}

TEST(LinesSource, ReadsALineOfSeveralMiB) {
  TempDir dir;
  std::string big(5 << 20, 'x');
  for (std::size_t i = 0; i < big.size(); i += 4099) big[i] = static_cast<char>('a' + i % 26);
  testing::write_lines(dir / "a.txt", {"short", big, "end"}, {.crlf = true});
  LinesSource src("lines", {.paths = {dir / "a.txt"}, .field = "line"});
  auto lines = read_all(src, "line");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1].size(), big.size());
  EXPECT_TRUE(lines[1] == big);
  EXPECT_EQ(lines[2], "end");
}

TEST(LinesSource, RandomAccessEqualsSequentialPull) {
  TempDir dir;
  for (int f = 0; f < 3; ++f) {
    std::vector<std::string> lines;
    for (int i = 0; i < 20 + f; ++i)
      lines.push_back(std::to_string(f) + ":" + std::string(i % 5, 'z') + std::to_string(i));
    testing::write_lines(dir / ("part-" + std::to_string(f) + ".txt"), lines,
                         {.crlf = f == 1, .final_newline = f != 2});
  }
  LinesSource src("lines", {.paths = {dir / "part-*.txt"}}, 3);
  src.start_epoch(0);
  std::vector<Ref> pulled;
  std::array<Ref, 7> chunk;
  while (std::size_t n = src.pull(chunk))
    pulled.insert(pulled.end(), chunk.begin(), chunk.begin() + n);
  ASSERT_EQ(pulled.size(), 63u);
  for (std::uint64_t i = pulled.size(); i-- > 0;) {  // backwards: no dependence on reading order
    EXPECT_EQ(src.at(0, i), pulled[i]);
    EXPECT_EQ(pulled[i].source, 3u);
    EXPECT_EQ(text(src.record(src.at(1, i))), text(src.record(pulled[i])));
  }
  EXPECT_EQ(text(src.record(pulled[62])), "2:z21");
}

TEST(LinesSource, CachesItsIndexBesideEachFile) {
  TempDir dir;
  testing::write_lines(dir / "a.txt", {"x", "", "y"});
  const std::string cache = index_cache_path(dir / "a.txt");
  { LinesSource src("lines", {.paths = {dir / "a.txt"}}); }
  ASSERT_TRUE(fs::is_regular_file(cache));
  const auto old = fs::file_time_type(std::chrono::seconds(1'000'000'000));
  fs::last_write_time(cache, old);
  {
    LinesSource src("lines", {.paths = {dir / "a.txt"}});
    EXPECT_EQ(read_all(src), (std::vector<std::string>{"x", "", "y"}));
    EXPECT_EQ(fs::last_write_time(cache), old) << "the cache was reused, not rewritten";
  }
  // Skipping empty lines makes another index: the cache is rebuilt for it.
  LinesSource skipping("lines", {.paths = {dir / "a.txt"}, .skip_empty = true});
  EXPECT_EQ(read_all(skipping), (std::vector<std::string>{"x", "y"}));
  EXPECT_NE(fs::last_write_time(cache), old);
  // The data file changed: a stale cache is not trusted.
  testing::write_lines(dir / "a.txt", {"x", "", "y", "z"});
  LinesSource changed("lines", {.paths = {dir / "a.txt"}, .skip_empty = true});
  EXPECT_EQ(read_all(changed), (std::vector<std::string>{"x", "y", "z"}));
}

TEST(LinesSource, WorksWhenTheCacheCannotBeWritten) {
  TempDir dir;
  testing::write_lines(dir / "a.txt", {"x", "y"});
  fs::create_directory(index_cache_path(dir / "a.txt"));
  LinesSource src("lines", {.paths = {dir / "a.txt"}});
  EXPECT_EQ(read_all(src), (std::vector<std::string>{"x", "y"}));
}

// ---- JSON Lines ----

TEST(LinesSource, ReadsSelectedJsonFieldsOfEveryType) {
  TempDir dir;
  testing::write_lines(dir / "a.jsonl",
                       {R"({"i": -7, "u": 18446744073709551, "f": 2.5, "b": true, "s": "héllo",)"
                        R"( "ints": [1, 2, 3], "mixed": [1, 2.5], "empty": [], "other": {}})",
                        R"({"i": 0, "u": 1, "f": -1e-3, "b": false, "s": "", "ints": [],)"
                        R"( "mixed": [0.5], "empty": []})"});
  LinesSource src("lines", {.paths = {dir / "a.jsonl"},
                            .format = LinesFormat::kJsonl,
                            .json_fields = {"i", "u", "f", "b", "s", "ints", "mixed", "empty"}});
  Sample s;
  src.read(src.at(0, 0), s);
  EXPECT_EQ(s.size(), 8u);
  EXPECT_EQ(s.find("text"), nullptr);
  EXPECT_EQ(s.find("other"), nullptr);
  EXPECT_EQ(s.at("i").shape().rank(), 0u);
  EXPECT_EQ(s.at("i").values<std::int64_t>()[0], -7);
  EXPECT_EQ(s.at("u").values<std::int64_t>()[0], 18446744073709551);
  EXPECT_EQ(s.at("f").shape().rank(), 0u);
  EXPECT_EQ(s.at("f").values<double>()[0], 2.5);
  EXPECT_EQ(s.at("b").shape().rank(), 0u);
  EXPECT_EQ(s.at("b").values<std::uint8_t>()[0], 1);
  EXPECT_EQ(text(s.at("s")), "héllo");
  EXPECT_EQ(s.at("ints").shape(), (Shape{3}));
  auto ints = s.at("ints").values<std::int64_t>();
  EXPECT_EQ(std::vector<std::int64_t>(ints.begin(), ints.end()),
            (std::vector<std::int64_t>{1, 2, 3}));
  auto mixed = s.at("mixed").values<double>();
  EXPECT_EQ(std::vector<double>(mixed.begin(), mixed.end()), (std::vector<double>{1.0, 2.5}));
  EXPECT_EQ(s.at("empty").dtype(), DType::kInt64);
  EXPECT_EQ(s.at("empty").shape(), (Shape{0}));

  Sample t;
  src.read(src.at(0, 1), t);
  EXPECT_EQ(t.at("b").values<std::uint8_t>()[0], 0);
  EXPECT_EQ(t.at("f").values<double>()[0], -1e-3);
  EXPECT_EQ(t.at("s").shape(), (Shape{0}));
  EXPECT_EQ(t.at("ints").dtype(), DType::kInt64);
  EXPECT_EQ(t.at("mixed").dtype(), DType::kFloat64);
}

TEST(LinesSource, ChecksWholeJsonLinesAndKeepsTheirBytes) {
  TempDir dir;
  testing::write_lines(dir / "a.jsonl", {R"({"a": 1})", "[1, 2]", "\"s\"", "{ bad"},
                       {.crlf = true});
  LinesSource src("lines", {.paths = {dir / "a.jsonl"}, .format = LinesFormat::kJsonl});
  Sample s;
  src.read(src.at(0, 1), s);
  EXPECT_EQ(text(s.at("text")), "[1, 2]");
  EXPECT_THAT(read_error(src, 3), HasSubstr("line 4 (byte 23): invalid JSON: "));
}

TEST(LinesSource, ReportsInvalidJsonWithFileOffsetAndLine) {
  TempDir dir;
  testing::write_lines(dir / "a.jsonl", {R"({"a": 1})", "", R"({"a": 2)"});
  LinesSource src(
      "lines", {.paths = {dir / "a.jsonl"}, .format = LinesFormat::kJsonl, .json_fields = {"a"}});
  DataError e = data_error([&] {
    Sample s;
    src.read(src.at(0, 2), s);
  });
  EXPECT_EQ(e.file(), dir / "a.jsonl");
  EXPECT_EQ(e.offset(), 10u);
  EXPECT_EQ(std::string(e.what()),
            "'" + dir / "a.jsonl" +
                "' line 3 (byte 10): invalid JSON: [json.exception.parse_error.101] parse error "
                "at line 1, column 8: syntax error while parsing object - unexpected end of "
                "input; expected '}'");
  // An empty line is no JSON either, unless skipped.
  EXPECT_THAT(read_error(src, 1), HasSubstr("' line 2 (byte 9): invalid JSON: "));
  LinesSource skipping("lines", {.paths = {dir / "a.jsonl"},
                                 .format = LinesFormat::kJsonl,
                                 .skip_empty = true,
                                 .json_fields = {"a"}});
  EXPECT_EQ(skipping.size(0), 2u);
  EXPECT_THAT(read_error(skipping, 1), HasSubstr("' line 3 (byte 10): invalid JSON"));
}

TEST(LinesSource, ReportsAMissingJsonKey) {
  TempDir dir;
  testing::write_lines(dir / "a.jsonl", {R"({"a": 1, "b": 2})", R"({"a": 1})"});
  LinesSource src(
      "lines",
      {.paths = {dir / "a.jsonl"}, .format = LinesFormat::kJsonl, .json_fields = {"a", "b"}});
  EXPECT_EQ(read_error(src, 1), "'" + dir / "a.jsonl" + "' line 2 (byte 17): key 'b' is missing");
}

TEST(LinesSource, ReportsJsonValuesOfUnsupportedTypes) {
  TempDir dir;
  testing::write_lines(
      dir / "a.jsonl",
      {R"({"v": {"x": 1}})", R"({"v": null})", R"({"v": [1, "two"]})", R"({"v": [[1]]})",
       R"({"v": 18446744073709551615})", R"({"v": [1, 9223372036854775808]})", R"([1])"});
  LinesSource src(
      "lines", {.paths = {dir / "a.jsonl"}, .format = LinesFormat::kJsonl, .json_fields = {"v"}});
  const std::string supported = " (supported: integer, float, boolean, string, array of numbers)";
  EXPECT_THAT(read_error(src, 0),
              HasSubstr("' line 1 (byte 0): key 'v' has unsupported type object" + supported));
  EXPECT_THAT(read_error(src, 1),
              HasSubstr("' line 2 (byte 16): key 'v' has unsupported type null" + supported));
  EXPECT_THAT(read_error(src, 2),
              HasSubstr("' line 3 (byte 28): key 'v' is an array with an element of type string; "
                        "arrays must hold numbers only"));
  EXPECT_THAT(read_error(src, 3),
              HasSubstr("line 4 (byte 46): key 'v' is an array with an "
                        "element of type array; arrays must hold numbers only"));
  EXPECT_THAT(read_error(src, 4), HasSubstr("line 5 (byte 59): key 'v' holds "
                                            "18446744073709551615, outside the int64 range"));
  EXPECT_THAT(read_error(src, 5), HasSubstr("line 6 (byte 87): key 'v' holds "
                                            "9223372036854775808, outside the int64 range"));
  EXPECT_THAT(read_error(src, 6),
              HasSubstr("line 7 (byte 119): the line is a JSON array, not an object"));
}

TEST(LinesSource, ReadsJsonIntegersExactlyOrRefusesThem) {
  // An integer beyond 64 bits is refused with its place, never read as an inexact double
  // that would also turn its whole array into float64.
  TempDir dir;
  testing::write_lines(
      dir / "a.jsonl",
      {R"({"v": [9007199254740993, 1], "s": "123456789012345678901234567890"})",
       R"({"v": [9007199254740993, 18446744073709551616], "s": ""})",
       R"({"s": "x", "v": -9223372036854775809})",
       R"({"v": [1.5, -9223372036854775808], "s": "99999999999999999999"})",
       R"({"v": [18446744073709551615, 0.5], "s": ""})", R"({"v": [1, 0.5, "x"], "s": ""})"});
  LinesSource src(
      "lines",
      {.paths = {dir / "a.jsonl"}, .format = LinesFormat::kJsonl, .json_fields = {"v", "s"}});
  Sample s;
  src.read(src.at(0, 0), s);
  ASSERT_EQ(s.at("v").dtype(), DType::kInt64);
  EXPECT_EQ(s.at("v").values<std::int64_t>()[0], 9007199254740993);
  EXPECT_EQ(read_error(src, 1),
            "'" + dir / "a.jsonl" +
                "' line 2 (byte 68): the integer 18446744073709551616 at byte 25 of the line does "
                "not fit in 64 bits (integers are read exactly or not at all)");
  EXPECT_THAT(read_error(src, 2),
              HasSubstr("line 3 (byte 125): the integer -9223372036854775809 at byte 16 of the "
                        "line does not fit in 64 bits"));
  Sample f;
  src.read(src.at(0, 3), f);  // a float makes the array float64; its integer fits
  ASSERT_EQ(f.at("v").dtype(), DType::kFloat64);
  EXPECT_EQ(f.at("v").values<double>()[1], -9223372036854775808.0);
  // An unsigned integer beyond int64 in an array of floats is a float, as in any float array;
  // after a float, the rest of the array is still checked.
  Sample g;
  src.read(src.at(0, 4), g);
  ASSERT_EQ(g.at("v").dtype(), DType::kFloat64);
  EXPECT_EQ(g.at("v").values<double>()[0], 18446744073709551615.0);
  EXPECT_EQ(g.at("v").values<double>()[1], 0.5);
  EXPECT_THAT(read_error(src, 5), HasSubstr("key 'v' is an array with an element of type string"));
}

// ---- opening ----

TEST(LinesSource, RejectsAnEmptyMatch) {
  TempDir dir;
  DataError e = data_error([&] { LinesSource("lines", {.paths = {dir / "*.txt"}}); });
  EXPECT_EQ(e.file(), dir / "*.txt");
  EXPECT_EQ(std::string(e.what()), "no file matches '" + dir / "*.txt" + "'");
}

TEST(LinesSource, RejectsAnUnreadableFile) {
  TempDir dir;
  fs::create_directory(dir / "sub.txt");
  DataError e = data_error([&] { LinesSource("lines", {.paths = {dir / "sub.txt"}}); });
  EXPECT_EQ(e.file(), dir / "sub.txt");
  EXPECT_THAT(e.what(), HasSubstr("is not a regular file"));
}

TEST(LinesSource, RejectsOptionsThatDoNotFitTogether) {
  auto key_of = [](const LinesOptions& o) {
    try {
      LinesSource("lines", o);
    } catch (const ConfigError& e) {
      return e.key() + ": " + e.what();
    }
    return std::string("no error");
  };
  EXPECT_EQ(key_of({}), "lines.paths: lines.paths must name at least one file or glob");
  EXPECT_EQ(key_of({.paths = {"x"}, .field = ""}), "lines.field: field must not be empty");
  EXPECT_EQ(key_of({.paths = {"x"}, .json_fields = {"a"}}),
            "lines.json_fields: json_fields needs format jsonl");
  EXPECT_EQ(key_of({.paths = {"x"}, .format = LinesFormat::kJsonl, .json_fields = {"a", "a"}}),
            "lines.json_fields: json_fields lists 'a' twice");
  EXPECT_EQ(key_of({.paths = {"x"}, .format = LinesFormat::kJsonl, .json_fields = {""}}),
            "lines.json_fields: json_fields has an empty name");
}

TEST(LinesSource, ParsesAndNamesItsFormats) {
  EXPECT_EQ(parse_lines_format("jsonl"), LinesFormat::kJsonl);
  EXPECT_EQ(lines_format_name(parse_lines_format("text")), "text");
  try {
    parse_lines_format("csv");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "lines.format");
    EXPECT_STREQ(e.what(), "unknown lines format 'csv' (known: text, jsonl)");
  }
}

TEST(LinesSource, DescribesItsOptions) {
  LinesOptions o{.paths = {"a/*.jsonl", "b.jsonl"},
                 .format = LinesFormat::kJsonl,
                 .skip_empty = true,
                 .json_fields = {"x", "y"}};
  EXPECT_EQ(lines_node().describe(o).to_string(),
            "lines(paths=a/*.jsonl,b.jsonl, format=jsonl, field=text, skip_empty=true, "
            "json_fields=x,y)");
}

// ---- checkpoints ----

TEST(LinesSource, RestoreRejectsACursorPastTheEnd) {
  TempDir dir;
  testing::write_lines(dir / "a.txt", {"x", "y"});
  LinesSource src("lines", {.paths = {dir / "a.txt"}});
  std::ostringstream os(std::ios::binary);
  {
    OutArchive ar(os);
    ar(CursorState{0, 3});
  }
  std::istringstream is(os.str(), std::ios::binary);
  InArchive ar(is);
  try {
    src.restore(ar);
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_STREQ(e.what(), "lines cursor 3 is past the source's 2 records");
  }
}

TEST(LinesSource, SurvivesSaveAndRestoreOfTextLines) {
  TempDir dir;
  for (int f = 0; f < 3; ++f) {
    std::vector<std::string> lines;
    for (int i = 0; i < 70; ++i) {
      char line[16];
      std::snprintf(line, sizeof(line), "line-%d-%05d", f, i);  // equal lengths: they stack
      lines.push_back(line);
    }
    testing::write_lines(dir / ("part-" + std::to_string(f) + ".txt"), lines, {.crlf = f == 1});
  }
  LinesOptions o{.paths = {dir / "part-*.txt"}};
  auto make = [&] {
    return Pipeline::Builder()
        .seed(11)
        .lines(o)
        .shuffle({.mode = ShuffleMode::kGlobal})
        .batch({.size = 16})
        .build();
  };
  testing::expect_save_restore(make, {.epochs = 2, .workers = 1}, {.epochs = 2, .workers = 2});
}

TEST(LinesSource, SurvivesSaveAndRestoreOfJsonLinesWithAMap) {
  TempDir dir;
  std::vector<std::string> lines;
  for (int i = 0; i < 150; ++i)
    lines.push_back(R"({"id": )" + std::to_string(i) + R"(, "text": ")" + std::string(i % 13, 'a') +
                    R"(", "w": [)" + std::to_string(i * 0.5) + "]}");
  testing::write_lines(dir / "a.jsonl", lines);
  LinesOptions o{.paths = {dir / "a.jsonl"},
                 .format = LinesFormat::kJsonl,
                 .json_fields = {"id", "text", "w"}};
  // Texts vary in length: a map pads them to 16 bytes so the batch can stack them.
  auto pad = [](Sample& s, MapContext&) {
    Tensor padded(DType::kUInt8, Shape{16});
    std::memset(padded.data(), 0, 16);
    const Tensor& t = s.at("text");
    std::memcpy(padded.data(), t.data(), std::min<std::size_t>(16, t.nbytes()));
    s.set("text", padded);
  };
  auto make = [&] {
    return Pipeline::Builder()
        .seed(5)
        .lines(o)
        .shuffle({.mode = ShuffleMode::kGlobal})
        .map(pad, {.name = "pad16"})
        .batch({.size = 32})
        .build();
  };
  testing::expect_save_restore(make, {.epochs = 2, .workers = 1}, {.epochs = 2, .workers = 2});
}

TEST(LinesSource, AGlobOfEveryFileSkipsTheIndexCaches) {
  TempDir dir;
  testing::write_lines(dir / "a.txt", {"one", "two"});
  testing::write_lines(dir / "b.txt", {"three"});
  LinesSource first("lines", {.paths = {dir / "*"}});  // writes a.txt.fsidx and b.txt.fsidx
  ASSERT_TRUE(fs::exists(dir / "a.txt.fsidx"));
  LinesSource again("lines", {.paths = {dir / "*"}});
  EXPECT_EQ(again.files(), (std::vector<std::string>{dir / "a.txt", dir / "b.txt"}));
  EXPECT_EQ(again.size(0), 3u);
}

}  // namespace
}  // namespace flowstate
