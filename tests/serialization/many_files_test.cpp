// Issue 23, local reads at scale: a source over 100 000 files opens, runs and resumes (small
// files are read into memory, not mapped one mapping each), and a checkpoint stores the data
// identity once per checkpoint directory (blobs/, shared by the steps) while a state in memory
// stays self-contained.
#include <fcntl.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <set>

#include "flowstate/core/error.h"
#include "flowstate/core/state_blob.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"
#include "flowstate/nodes/sources/mapped_file.h"
#include "flowstate/nodes/sources/mapped_file_set.h"
#include "flowstate/nodes/sources/records.h"
#include "flowstate/serialization/checkpoint.h"
#include "flowstate/serialization/pipeline_state.h"
#include "tests/serialization/checkpoint_testing.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

namespace fs = std::filesystem;
using testing::checkpoint_error;
using testing::TempDir;
using testing::ThreadGroup;

/// The files of blobs/ under checkpoint directory `ck`.
std::set<std::string> blob_files(const std::string& ck) {
  std::set<std::string> out;
  if (!fs::is_directory(ck + "/blobs")) return out;
  for (const auto& e : fs::directory_iterator(ck + "/blobs")) out.insert(e.path().filename());
  return out;
}

/// Writes `files` records files of `per_file` synthetic records of `record_bytes` bytes under
/// `dir` (f-0000000.bin, ...): one open, write and close each.
void write_many_files(const std::string& dir, std::size_t files, std::size_t per_file,
                      std::size_t record_bytes) {
  fs::create_directories(dir);
  std::vector<std::byte> bytes(per_file * record_bytes);
  for (std::size_t f = 0; f < files; ++f) {
    for (std::size_t r = 0; r < per_file; ++r)
      fill_synthetic_record({bytes.data() + r * record_bytes, record_bytes}, f * per_file + r, 3);
    char name[32];
    std::snprintf(name, sizeof(name), "/f-%07zu.bin", f);
    const std::string path = dir + name;
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0) << path;
    ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  }
}

std::vector<std::uint64_t> digests(Loader& loader, std::size_t n = ~std::size_t{0}) {
  std::vector<std::uint64_t> out;
  while (out.size() < n)
    if (auto b = loader.next())
      out.push_back(b->digest());
    else
      break;
  return out;
}

TEST(ManyFiles, AHundredThousandFilesOpenRunAnEpochCheckpointAndResumeExactly) {
  // Two records of 16 bytes per file: 100 000 files, 200 000 records. One mapping per file
  // failed at the kernel's 65 530 with "Cannot allocate memory".
  constexpr std::size_t kFiles = 100'000, kPerFile = 2, kRecordBytes = 16;
  TempDir dir;
  write_many_files(dir / "data", kFiles, kPerFile, kRecordBytes);
  auto make = [&] {
    return Pipeline::Builder()
        .seed(11)
        .records({.paths = {"data/*.bin"}, .record_bytes = kRecordBytes, .base_dir = dir.path()})
        .shuffle({.mode = ShuffleMode::kGlobal})
        .batch({.size = 4096})
        .build();
  };
  const std::size_t mapped = live_mappings();
  Loader whole(make(), {.epochs = 1});
  EXPECT_EQ(live_mappings(), mapped);  // small files are read, not mapped
  const std::vector<std::uint64_t> all = digests(whole);
  ASSERT_EQ(all.size(), (kFiles * kPerFile + 4095) / 4096);

  const std::string ck = dir / "ck";
  std::vector<std::uint64_t> got;
  std::string in_memory;
  {
    Loader first(make(), {.epochs = 1});
    got = digests(first, 10);
    first.save_checkpoint(ck);
    in_memory = first.state();
  }
  // The state in memory holds every file's identity (self-contained); the checkpoint's own
  // state holds a reference to it, stored once in ck/blobs.
  EXPECT_GT(in_memory.size(), kFiles * 56);
  const auto state_bytes = fs::file_size(ck + "/step-000000000010/state.bin");
  EXPECT_LE(state_bytes, 64u << 10);
  RecordProperty("state_bin_bytes", std::to_string(state_bytes));
  RecordProperty("state_in_memory_bytes", std::to_string(in_memory.size()));
  EXPECT_EQ(blob_files(ck).size(), 1u);
  EXPECT_EQ(read_checkpoint(ck + "/step-000000000010").state, in_memory);
  {
    Loader second(make(), {.epochs = 1});
    ASSERT_TRUE(second.restore(ck));
    for (auto d : digests(second, 5)) got.push_back(d);
    second.save_checkpoint(ck, {.keep = 1});  // shares the blob; prunes step 10
  }
  EXPECT_EQ(blob_files(ck).size(), 1u);
  EXPECT_FALSE(fs::exists(ck + "/step-000000000010"));
  Loader third(make(), {.epochs = 1});
  ASSERT_TRUE(third.restore(ck));
  for (auto d : digests(third)) got.push_back(d);
  EXPECT_EQ(got, all);
}

TEST(ManyFiles, AHundredThousandFilesOfMoreThan64KiBRunThroughABoundedSetOfMappings) {
  // 100 000 files of one 68 KiB record each (more than kReadIntoMemoryBytes: mapped), sparse
  // but for their first 8 bytes, the file's number. One mapping per file kept for the run
  // failed at the kernel's 65 531st with "Cannot allocate memory"; now a source with more
  // files than mapped_files_limit() maps them as reads reach them, that many at once.
  constexpr std::size_t kFiles = 100'000, kRecordBytes = 17 * 4096;
  ASSERT_LT(mapped_files_limit(), kFiles);
  TempDir dir;
  fs::create_directories(dir / "data");
  for (std::uint64_t f = 0; f < kFiles; ++f) {
    char name[32];
    std::snprintf(name, sizeof(name), "/f-%07llu.bin", static_cast<unsigned long long>(f));
    const std::string path = dir / "data" + name;
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0) << path;
    ASSERT_EQ(::pwrite(fd, &f, sizeof f, 0), static_cast<ssize_t>(sizeof f));
    ASSERT_EQ(::ftruncate(fd, kRecordBytes), 0);
    ::close(fd);
  }
  auto make = [&] {
    return Pipeline::Builder()
        .seed(3)
        .workers(2)
        .records({.paths = {"data/*.bin"}, .record_bytes = kRecordBytes, .base_dir = dir.path()})
        .shuffle({.mode = ShuffleMode::kGlobal})
        .batch({.size = 64})
        .build();
  };
  const std::size_t mapped = live_mappings();
  std::vector<std::uint64_t> all;
  std::set<std::uint64_t> seen;
  {
    Loader whole(make(), {.epochs = 1});
    EXPECT_EQ(live_mappings(), mapped);  // opened, checked and closed when built
    for (int i = 0; i < 12; ++i) {
      std::optional<Batch> b = whole.next();
      ASSERT_TRUE(b.has_value());
      all.push_back(b->digest());
      const auto* bytes = static_cast<const std::byte*>((*b)["data"].data());
      for (std::size_t r = 0; r < 64; ++r) {
        std::uint64_t file = 0;
        std::memcpy(&file, bytes + r * kRecordBytes, sizeof file);
        EXPECT_LT(file, kFiles);
        EXPECT_TRUE(seen.insert(file).second) << "file " << file << " twice";
      }
      EXPECT_LE(live_mappings(), mapped + mapped_files_limit() + 8);
    }
  }
  const std::string ck = dir / "ck";
  std::vector<std::uint64_t> got;
  {
    Loader first(make(), {.epochs = 1});
    got = digests(first, 6);
    first.save_checkpoint(ck);
  }
  Loader second(make(), {.epochs = 1});
  ASSERT_TRUE(second.restore(ck));
  for (auto d : digests(second, 6)) got.push_back(d);
  EXPECT_EQ(got, all);
}

/// A file source over `files` small files under `dir`/data, as a pipeline.
Pipeline small_pipeline(const TempDir& dir) {
  return Pipeline::Builder()
      .seed(2)
      .records({.paths = {"data/*.bin"}, .record_bytes = 8, .base_dir = dir.path()})
      .batch({.size = 16})
      .build();
}

TEST(IdentityBlobs, AMissingBlobIsACheckpointErrorNamingIt) {
  TempDir dir;
  write_many_files(dir / "data", 200, 4, 8);  // ~20 KB of identity: stored as a blob
  const std::string ck = dir / "ck";
  {
    Loader l(small_pipeline(dir), {.epochs = 1});
    digests(l, 3);
    l.save_checkpoint(ck);
  }
  const auto blobs = blob_files(ck);
  ASSERT_EQ(blobs.size(), 1u);
  const std::string blob = ck + "/blobs/" + *blobs.begin();
  fs::remove(blob);
  Loader l(small_pipeline(dir), {.epochs = 1});
  const std::string error = checkpoint_error([&] { l.restore(ck); });
  EXPECT_THAT(error, ::testing::HasSubstr("'" + blob + "' is missing: '" + ck +
                                          "/step-000000000003/state.bin' refers to it"));
  EXPECT_THAT(checkpoint_error([&] { read_checkpoint(ck + "/step-000000000003"); }),
              ::testing::HasSubstr("is missing"));
}

/// An encoded PipelineState whose spine holds `blobs` (inline blobs) between other bytes.
std::string state_with(const std::vector<std::string>& blobs, std::uint64_t tag) {
  PipelineState s;
  s.canonical = {{"seed", "1"}};
  s.fingerprint = fingerprint_of(s.canonical);
  s.last_step = tag;
  s.last_epoch = 0;
  s.spine = "head" + std::to_string(tag);
  for (const auto& b : blobs) s.spine += wrap_blob(b) + "mid";
  return s.encode();
}

TEST(IdentityBlobs, StepsShareABlobAndReadBackExactlyAndPruningCollectsTheUnused) {
  TempDir dir;
  const std::string ck = dir / "ck";
  const std::string a(10'000, 'a'), b(20'000, 'b'), small(100, 's');
  // Two steps with the same blob: one file; a blob under kMinExternalBlobBytes stays inline.
  const std::string s1 = state_with({a, small}, 1), s2 = state_with({a, a}, 2);
  write_checkpoint(ck, 1, s1);
  write_checkpoint(ck, 2, s2);
  EXPECT_EQ(blob_files(ck).size(), 1u);
  EXPECT_LT(fs::file_size(ck + "/step-000000000002/state.bin"), 200u);
  EXPECT_EQ(read_checkpoint(ck + "/step-000000000001").state, s1);
  EXPECT_EQ(read_checkpoint(ck + "/step-000000000002").state, s2);
  // Step 3 holds another blob; keeping 1 prunes steps 1 and 2, and `a` with them.
  const std::string s3 = state_with({b}, 3);
  write_checkpoint(ck, 3, s3, {.keep = 1});
  EXPECT_EQ(blob_files(ck), std::set<std::string>{hex64(hash64(b)) + ".blob"});
  EXPECT_EQ(find_latest_checkpoint(ck)->state, s3);
  // A state that holds a reference marker of its own is stored as it is.
  std::string odd = state_with({}, 4);
  PipelineState p = PipelineState::decode(odd);
  p.spine += std::string(kBlobRefMagic) + std::string(16, '\x01') + wrap_blob(a);
  odd = p.encode();
  write_checkpoint(ck, 4, odd);
  EXPECT_EQ(read_checkpoint(ck + "/step-000000000004").state, odd);
  EXPECT_GT(fs::file_size(ck + "/step-000000000004/state.bin"), a.size());
  // A damaged blob is refused, naming it.
  const std::string blob = ck + "/blobs/" + hex64(hash64(b)) + ".blob";
  testing::flip_byte(blob, 5000);
  EXPECT_THAT(checkpoint_error([&] { read_checkpoint(ck + "/step-000000000003"); }),
              ::testing::HasSubstr("'" + blob + "' is corrupt"));
  remove_checkpoints(ck);
  EXPECT_FALSE(fs::exists(ck + "/blobs"));
}

TEST(IdentityBlobs, TheRanksOfAGroupCheckpointShareOneBlob) {
  TempDir dir;
  const std::string ck = dir / "ck";
  const std::string shared(30'000, 'x');
  ThreadGroup group(3);
  std::vector<std::string> states(3);
  for (std::uint64_t r = 0; r < 3; ++r)
    states[r] = state_with({shared, std::string(5000, static_cast<char>('a' + r))}, 7);
  const auto errors = group.run([&](std::uint64_t r, std::shared_ptr<Coordinator> c) {
    write_group_checkpoint(ck, 7, states[r], *c);
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(blob_files(ck).size(), 4u);  // the shared one, and each rank's own
  const auto found = group.run([&](std::uint64_t r, std::shared_ptr<Coordinator> c) {
    auto f = find_group_checkpoint(ck, *c);
    ASSERT_TRUE(f);
    EXPECT_EQ(f->state, states[r]);
  });
  for (const auto& e : found) EXPECT_EQ(e, "");
}

}  // namespace
}  // namespace flowstate
