// Data identity (DESIGN.md §6): a file source records each file's name, size, item count and
// sampled-block hashes in its state, and a restore on other data is refused, naming each file
// that differs. Runs for records, lines and tar, whose FileSource base holds the check.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "flowstate/config/inspect.h"
#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"
#include "flowstate/nodes/sources/file_source.h"
#include "flowstate/serialization/checkpoint.h"
#include "flowstate/serialization/pipeline_state.h"
#include "tests/serialization/checkpoint_testing.h"
#include "tests/support/formats.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

/// What a refusal of files only added or removed ends with: how to continue over them.
constexpr const char* kOptInHint =
    "\n(only files were added or removed: to continue over them, opt in with `flowstate run "
    "--data-changed continue`, LoaderOptions::on_data_change or load_state_dict(state, "
    "data_changed=\"continue\"))";

namespace fs = std::filesystem;
using testing::BatchTrace;
using testing::checkpoint_error;
using testing::drain;
using testing::TempDir;

/// One file source kind: how its files are written and its pipeline built.
struct Kind {
  std::string type;  ///< "records", "lines", "tar": also the node's name
  std::string ext;
  std::string unit;  ///< its items in messages
  std::uint64_t items_per_file;
};

std::ostream& operator<<(std::ostream& os, const Kind& k) { return os << k.type; }

const Kind kRecords{"records", ".bin", "records", 300};
const Kind kLines{"lines", ".txt", "lines", 300};
const Kind kTar{"tar", ".tar", "samples", 20};

/// Writes file `k` of `kind` with `n` items at `path`. Lines and tar samples hold uppercase
/// letters (which no tar header does), so a test can change data bytes without breaking the
/// format.
void write_data_file(const Kind& kind, const std::string& path, std::size_t k, std::uint64_t n) {
  if (kind.type == "records") {
    std::string bytes;
    for (std::uint64_t i = 0; i < n * 64; ++i)
      bytes.push_back(static_cast<char>((i * 131 + k * 7 + i / 64) & 0xff));
    testing::write_file(path, bytes);
  } else if (kind.type == "lines") {
    std::vector<std::string> lines;
    for (std::uint64_t i = 0; i < n; ++i)
      lines.push_back("line " + std::to_string(k) + "." + std::to_string(i) +
                      " ABCDEFGHIJKLMNOPQRSTUVWXYZ");
    testing::write_lines(path, lines);
  } else {
    std::vector<testing::TarEntry> members;
    for (std::uint64_t i = 0; i < n; ++i)
      members.push_back({"s" + std::to_string(i) + ".txt",
                         std::string(1000, static_cast<char>('A' + (i + k) % 26))});
    testing::write_tar(path, members);
  }
}

/// "part-00001.bin"
std::string part(const Kind& kind, std::size_t k) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "part-%05zu", k);
  return buf + kind.ext;
}

class CheckpointDataIdentity : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    fs::create_directories(root_ / "data");
    for (std::size_t k = 0; k < 3; ++k) write(k, kind().items_per_file);
    Loader l(make(), options_);
    full_ = drain(l);
    Loader first(make(), options_);
    before_ = drain(first, 3);
    first.save_checkpoint(root_ / "ckpt");
  }
  const Kind& kind() const { return GetParam(); }
  std::string file(std::size_t k) const { return root_ / ("data/" + part(kind(), k)); }
  void write(std::size_t k, std::uint64_t n) const { write_data_file(kind(), file(k), k, n); }

  /// The pipeline, its paths relative to `base` (the project directory).
  Pipeline make(const std::string& base = "", FileVerify verify = FileVerify::kSampled) const {
    const fs::path dir = base.empty() ? root_.path() : fs::path(base);
    const std::string glob = "data/part-*" + kind().ext;
    Pipeline::Builder b;
    b.seed(5).workers(1);
    if (kind().type == "records")
      b.records({.paths = {glob}, .record_bytes = 64, .base_dir = dir, .verify = verify});
    else if (kind().type == "lines")
      b.lines({.paths = {glob}, .base_dir = dir, .verify = verify});
    else
      b.tar({.paths = {glob}, .base_dir = dir, .verify = verify});
    return b.batch({.size = 10}).build();
  }
  /// The CheckpointError of restoring the checkpoint into a fresh loader.
  std::string refusal() const {
    Loader l(make(), options_);
    return checkpoint_error([&] { l.restore(root_ / "ckpt"); });
  }
  /// The message's first line, as Loader::restore words it.
  std::string prefix() const {
    return "cannot restore " + (root_ / "ckpt/step-000000000003") + ": " + kind().type + ": ";
  }
  std::string name(std::size_t k) const { return "data/" + part(kind(), k); }

  TempDir root_;
  LoaderOptions options_{.epochs = 2};
  std::vector<BatchTrace> full_, before_;
};

TEST_P(CheckpointDataIdentity, ResumesExactlyOnTheSameData) {
  Loader l(make(), options_);
  ASSERT_TRUE(l.restore(root_ / "ckpt"));
  auto rest = drain(l);
  before_.insert(before_.end(), rest.begin(), rest.end());
  EXPECT_EQ(before_, full_);
}

TEST_P(CheckpointDataIdentity, RefusesADeletedFile) {
  fs::remove(file(2));
  EXPECT_EQ(refusal(), prefix() + name(2) + " was in the checkpoint and is gone" + kOptInHint);
}

TEST_P(CheckpointDataIdentity, RefusesAnAddedFile) {
  write(3, 5);
  EXPECT_EQ(refusal(), prefix() + name(3) + " is new (not in the checkpoint)" + kOptInHint);
}

TEST_P(CheckpointDataIdentity, RefusesAResizedFile) {
  const auto was = fs::file_size(file(1));
  write(1, kind().items_per_file + 1);
  EXPECT_EQ(refusal(), prefix() + name(1) + ": " + std::to_string(was) + " bytes in checkpoint, " +
                           std::to_string(fs::file_size(file(1))) + " now");
}

TEST_P(CheckpointDataIdentity, RefusesChangedContentOfTheSameSize) {
  // A data byte inside the first middle block sampled from file 1.
  std::string bytes = testing::read_file(file(1));
  const auto at = identity_offsets(name(1), bytes.size());
  std::size_t pos = at[1] + 100;
  if (kind().type != "records")
    while (!(bytes.at(pos) >= 'A' && bytes[pos] <= 'Z')) ++pos;
  bytes[pos] ^= 0x01;
  testing::overwrite_file(file(1), bytes);
  std::size_t j = 0;
  while (!(at[j] <= pos && pos < at[j] + kIdentityBlockBytes)) ++j;
  EXPECT_EQ(refusal(), prefix() + name(1) + ": content differs (sampled block at offset " +
                           std::to_string(at[j]) + ")");
}

TEST_P(CheckpointDataIdentity, ListsEveryDifferenceOnALineOfItsOwn) {
  fs::remove(file(0));
  write(3, 5);
  EXPECT_EQ(refusal(), prefix() + name(0) + " was in the checkpoint and is gone\n" + kind().type +
                           ": " + name(3) + " is new (not in the checkpoint)" + kOptInHint);
}

TEST_P(CheckpointDataIdentity, ResumesExactlyAfterTheProjectDirectoryWasRenamed) {
  // A rename on the same file system keeps every file (inode, mtime, ctime): names are
  // relative to the glob's root, so the identity still matches.
  TempDir other;
  const std::string moved = other / "project";
  fs::rename(root_.path(), moved);
  Loader l(make(moved), options_);
  ASSERT_TRUE(l.restore(moved + "/ckpt"));
  auto rest = drain(l);
  before_.insert(before_.end(), rest.begin(), rest.end());
  EXPECT_EQ(before_, full_);
  fs::rename(moved, root_.path());
}

TEST_P(CheckpointDataIdentity, ACopiedDataDirectoryIsRefusedSayingHowToAcceptIt) {
  // A copy has other inodes: under verify: sampled it cannot be told from replaced files.
  TempDir other;
  const std::string moved = other / "project";
  testing::copy_tree(root_.str(), moved);
  fs::remove_all(root_ / "data");
  Loader l(make(moved), options_);
  const std::string error = checkpoint_error([&] { l.restore(moved + "/ckpt"); });
  // The timestamps may agree with the original's (a coarse clock); the inode does not.
  EXPECT_THAT(error, ::testing::HasSubstr(kind().type + ": " + name(0) +
                                          ": not the file the checkpoint read (inode"));
  EXPECT_THAT(error, ::testing::HasSubstr(" changed), though its size and sampled blocks agree"));
  EXPECT_THAT(error, ::testing::HasSubstr("resume with verify: blocks"));
  // Accepted on the sampled blocks' word when the user says so.
  Loader blocks(make(moved, FileVerify::kBlocks), options_);
  ASSERT_TRUE(blocks.restore(moved + "/ckpt"));
  auto rest = drain(blocks);
  before_.insert(before_.end(), rest.begin(), rest.end());
  EXPECT_EQ(before_, full_);
}

TEST_P(CheckpointDataIdentity, ACopiedDataDirectoryResumesExactlyUnderVerifyFull) {
  // The checkpoint written with verify: full holds every file's whole hash; the copy's agree.
  {
    Loader first(make("", FileVerify::kFull), options_);
    drain(first, 3);
    first.save_checkpoint(root_ / "ckpt-full");
  }
  TempDir other;
  const std::string moved = other / "project";
  testing::copy_tree(root_.str(), moved);
  fs::remove_all(root_ / "data");
  Loader l(make(moved, FileVerify::kFull), options_);
  ASSERT_TRUE(l.restore(moved + "/ckpt-full"));
  auto rest = drain(l);
  before_.insert(before_.end(), rest.begin(), rest.end());
  EXPECT_EQ(before_, full_);
  // Without verify: full now, the whole hash is not read, and the message says to ask for it.
  Loader sampled(make(moved), options_);
  EXPECT_THAT(checkpoint_error([&] { sampled.restore(moved + "/ckpt-full"); }),
              ::testing::HasSubstr("The checkpoint holds its whole-file hash: resume with "
                                   "verify: full"));
}

TEST_P(CheckpointDataIdentity, InspectShowsTheFiles) {
  const auto found = read_checkpoint(root_ / "ckpt/step-000000000003");
  const PipelineState s = PipelineState::decode(found.state);
  const auto nodes = nlohmann::json::parse(describe_node_states(s.spine, s.canonical, "ckpt"));
  const auto& files = nodes.at(0).at("state").at("files");
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(files[1]["name"], name(1));
  EXPECT_EQ(files[1]["bytes"], fs::file_size(file(1)));
  EXPECT_EQ(files[1]["items"], kind().items_per_file);
  EXPECT_EQ(files[1]["hash"].get<std::string>().size(), 16u);
}

/// Where one byte of a file of `bytes` bytes named `name` lies outside every sampled block.
std::size_t unsampled_offset(const std::string& name, std::size_t bytes) {
  const auto at = identity_offsets(name, bytes);
  for (std::size_t pos = 0; pos < bytes; pos += 512) {
    bool sampled = false;
    for (auto a : at) sampled = sampled || (a <= pos && pos < a + kIdentityBlockBytes);
    if (!sampled) return pos + 7;
  }
  throw std::runtime_error("every byte of " + name + " is sampled");
}

/// Replaces `path` atomically (a new file renamed over it) by `bytes`.
void replace_by_rename(const std::string& path, const std::string& bytes) {
  testing::write_file(path + ".new", bytes);
  fs::rename(path + ".new", path);
}

TEST(CheckpointDataIdentityRecords, AFileReplacedWithAChangeOutsideTheSampledBlocksIsRefused) {
  // Two sizes: a file read into memory when opened (48 KiB), and a mapped one (1 MiB).
  for (const std::size_t records : {std::size_t{768}, std::size_t{16384}}) {
    SCOPED_TRACE(records);
    TempDir root;
    const std::string glob = testing::write_records(root / "data", records * 2, 64, 2);
    auto make = [&](FileVerify verify) {
      return Pipeline::Builder()
          .records({.paths = {glob}, .record_bytes = 64, .verify = verify})
          .batch({.size = 10})
          .build();
    };
    for (const FileVerify verify : {FileVerify::kSampled, FileVerify::kFull}) {
      Loader first(make(verify), {.epochs = 1});
      drain(first, 2);
      first.save_checkpoint(root / ("ckpt-" + std::string(enum_name(verify))));
    }
    const std::string path = root / "data/part-00001.bin";
    std::string bytes = testing::read_file(path);
    // The glob is absolute: the name is the whole path.
    const std::size_t pos = unsampled_offset(path, bytes.size());
    bytes[pos] ^= 0x40;
    replace_by_rename(path, bytes);

    // verify: blocks, as flowstate checked before: the change is not seen.
    Loader blocks(make(FileVerify::kBlocks), {.epochs = 1});
    EXPECT_TRUE(blocks.restore(root / "ckpt-sampled"));
    Loader sampled(make(FileVerify::kSampled), {.epochs = 1});
    const std::string error = checkpoint_error([&] { sampled.restore(root / "ckpt-sampled"); });
    EXPECT_THAT(error, ::testing::StartsWith(
                           "cannot restore " + (root / "ckpt-sampled/step-000000000002") +
                           ": records: " + path + ": not the file the checkpoint read (inode"));
    EXPECT_THAT(error, ::testing::EndsWith(
                           " changed), though its size and sampled blocks agree: it was replaced, "
                           "changed in place, or copied. If the data directory was copied or "
                           "moved unchanged, resume with verify: blocks to accept it on the "
                           "sampled blocks (checkpoints written with verify: full accept a copy "
                           "whose whole content agrees)"));
    Loader full(make(FileVerify::kFull), {.epochs = 1});
    EXPECT_EQ(checkpoint_error([&] { full.restore(root / "ckpt-full"); }),
              "cannot restore " + (root / "ckpt-full/step-000000000002") + ": records: " + path +
                  ": content differs (whole-file hash)");
  }
}

TEST(CheckpointDataIdentityRecords, AStateOfIdentityVersion1HasNoStatToCompare) {
  // DataIdentity version 1 (before issue 23) carries no file-system identity: a copy of the
  // data resumes on the sampled blocks, as it did.
  FileIdentity f{.name = "a.bin", .bytes = 10, .items = 1, .blocks = {1, 2, 3, 4}};
  DataIdentity v1{{f}};
  FileIdentity now = f;
  now.stat = FileStat{1, 2, 3, 4};
  EXPECT_TRUE(
      identity_differences(v1, DataIdentity{{now}}, "records", FileVerify::kSampled).empty());
  // Written as version 2 and read back: every field survives.
  DataIdentity v2{{now}};
  v2.files[0].full = 99;
  std::ostringstream os(std::ios::binary);
  {
    OutArchive ar(os);
    ar(v2);
  }
  std::istringstream is(os.str(), std::ios::binary);
  InArchive ar(is);
  DataIdentity back;
  ar(back);
  EXPECT_EQ(back.files, v2.files);
}

INSTANTIATE_TEST_SUITE_P(Sources, CheckpointDataIdentity, ::testing::Values(kRecords, kLines, kTar),
                         [](const auto& info) { return info.param.type; });

TEST(CheckpointDataIdentityLines, RefusesAFileWithOtherLinesOfTheSameSize) {
  TempDir root;
  fs::create_directories(root / "data");
  for (std::size_t k = 0; k < 2; ++k)
    write_data_file(kLines, root / ("data/" + part(kLines, k)), k, 300);
  auto make = [&] {
    return Pipeline::Builder()
        .lines({.paths = {"data/*.txt"}, .base_dir = root.path()})
        .batch({.size = 10})
        .build();
  };
  {
    Loader first(make(), {.epochs = 1});
    drain(first, 2);
    first.save_checkpoint(root / "ckpt");
  }  // gone before its file is rewritten under its mapping
  // A letter becomes a newline: same size, one line more.
  const std::string path = root / "data/part-00001.txt";
  std::string bytes = testing::read_file(path);
  bytes[bytes.find('Q')] = '\n';
  testing::overwrite_file(path, bytes);
  Loader l(make(), {.epochs = 1});
  EXPECT_EQ(checkpoint_error([&] { l.restore(root / "ckpt"); }),
            "cannot restore " + (root / "ckpt/step-000000000002") +
                ": lines: data/part-00001.txt: 300 lines in checkpoint, 301 now");
}

/// A snapshot that writes a stamp entry's bytes back as they were.
class EntrySnapshot final : public NodeSnapshot {
 public:
  explicit EntrySnapshot(std::string bytes) : bytes_(std::move(bytes)) {}
  // The entry's own archive begins with its endianness byte, which `ar` wrote already.
  void save(OutArchive& ar) const override {
    ar(cereal::binary_data(bytes_.data() + 1, bytes_.size() - 1));
  }

 private:
  std::string bytes_;
};

TEST(CheckpointDataIdentityRecords, AStateWithoutAnIdentityRestoresWithNothingToCompare) {
  // A version-1 entry (a CursorState alone, as flowstate wrote before data identity) on data
  // that changed since: nothing was recorded, so nothing is compared.
  TempDir root;
  const std::string glob = testing::write_records(root / "data", 100, 16, 2);
  auto make = [&] {
    return Pipeline::Builder()
        .records({.paths = {glob}, .record_bytes = 16})
        .batch({.size = 10})
        .build();
  };
  PipelineState s;
  {
    // The loader is gone before its files are rewritten: a file truncated under a live
    // mapping is SIGBUS for whichever thread still reads it.
    Loader l(make());
    drain(l, 1);
    s = PipelineState::decode(l.state());
  }
  auto entries = parse_stamp(s.spine);
  ASSERT_TRUE(entries);
  ASSERT_EQ((*entries)[0].name, "records");
  FileSourceState now;
  {
    std::istringstream is{(*entries)[0].bytes, std::ios::binary};
    InArchive in(is);
    in(now);
  }
  ASSERT_TRUE(now.identity);
  EXPECT_EQ(now.identity->files.size(), 2u);
  StampData stamp;
  for (const auto& e : *entries) {
    stamp.node_names.push_back(e.name);
    stamp.snapshots.push_back(std::make_shared<EntrySnapshot>(e.bytes));
  }
  stamp.snapshots[0] =
      std::make_shared<StateSnapshot<CursorState>>(CursorState{now.epoch, now.cursor});
  s.spine = serialize_stamp(stamp);

  testing::write_records(root / "data", 120, 16, 2);
  Loader other(make());
  other.load_state(s.encode());
  auto b = other.next();
  ASSERT_TRUE(b);
  EXPECT_EQ(b->info.step, 1u);
  EXPECT_EQ(b->info.refs.front().index, 10u);
}

}  // namespace
}  // namespace flowstate
