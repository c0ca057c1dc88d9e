// Local files too many to keep mapped (issue 23): a bounded set of mappings, opened as reads
// reach a file, never more than its limit held, a replaced file refused, a cut one reported;
// and a `records` source over more files than it maps gives the batches of one that maps them
// all, through checkpoints; so do `lines`, `tar` and `indexed` (each .idx then read into
// memory).
#include "flowstate/nodes/sources/mapped_file_set.h"

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"
#include "flowstate/nodes/sources/indexed.h"
#include "tests/support/formats.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::TempDir;

constexpr std::size_t kFileBytes = 80 * 1024;  // > kReadIntoMemoryBytes: mapped

/// Byte i of test file f.
char byte_of(std::size_t f, std::size_t i) { return static_cast<char>(1 + (i + 7 * f) % 251); }

void write_file(const std::string& p, std::size_t f, std::size_t n = kFileBytes) {
  std::vector<char> bytes(n);
  for (std::size_t i = 0; i < n; ++i) bytes[i] = byte_of(f, i);
  std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(n));
}

/// `n` files under `dir`, opened once as a source opens them, for a set.
std::vector<MappedFileSet::File> make_files(const TempDir& dir, std::size_t n) {
  std::vector<MappedFileSet::File> files;
  for (std::size_t f = 0; f < n; ++f) {
    const std::string p = dir / ("f" + std::to_string(f) + ".bin");
    write_file(p, f);
    MappedFile m(p);
    files.push_back({p, m.size(), m.stat()});
  }
  return files;
}

/// Sets an environment variable for the scope.
struct ScopedEnv {
  std::string name;
  ScopedEnv(std::string n, const std::string& value) : name(std::move(n)) {
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

TEST(MappedFileSet, HoldsAtMostItsLimitAndReadsEveryFileRightFromTwoThreads) {
  TempDir dir;
  const std::size_t before = live_mappings();
  MappedFileSet set(make_files(dir, 12), 3);
  EXPECT_EQ(live_mappings(), before);  // nothing mapped until read
  auto reader = [&](std::uint64_t seed, std::size_t* wrong, std::size_t* most) {
    std::mt19937_64 rng(seed);
    for (int r = 0; r < 4000; ++r) {
      const std::size_t f = rng() % 12, at = rng() % (kFileBytes - 16);
      const auto bytes = set.read(f, at, 16);
      for (std::size_t i = 0; i < 16; ++i)
        if (static_cast<char>(bytes[i]) != byte_of(f, at + i)) ++*wrong;
      *most = std::max(*most, set.mapped());
    }
  };
  std::size_t wrong_a = 0, wrong_b = 0, most_a = 0, most_b = 0;
  std::thread a(reader, 1, &wrong_a, &most_a), b(reader, 2, &wrong_b, &most_b);
  a.join();
  b.join();
  EXPECT_EQ(wrong_a + wrong_b, 0u);
  EXPECT_LE(std::max(most_a, most_b), 3u);
  EXPECT_EQ(set.mapped(), 3u);
  EXPECT_EQ(live_mappings(), before + 3);  // the threads' held mappings went with them
  EXPECT_GT(set.opens(), 12u);             // files were closed and mapped again
  // This thread's held mapping: a read of the same file twice maps it once.
  const std::uint64_t opens = set.opens();
  set.read(5, 0, 1);
  set.read(5, 100, 1);
  EXPECT_LE(set.opens(), opens + 1);
}

TEST(MappedFileSet, AFileReplacedSinceItWasOpenedIsADataErrorNamingIt) {
  TempDir dir;
  auto files = make_files(dir, 2);
  const std::string path = files[0].path;
  MappedFileSet set(std::move(files), 1);
  EXPECT_EQ(static_cast<char>(set.read(0, 10, 1)[0]), byte_of(0, 10));
  set.read(1, 0, 1);  // closes file 0
  // Replaced by a file of the same size and bytes: another inode.
  write_file(path + ".new", 0);
  std::filesystem::rename(path + ".new", path);
  try {
    set.read(0, 10, 1);
    FAIL() << "a replaced file was read";
  } catch (const DataError& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_NE(std::string(e.what()).find("'" + path + "' changed while it was read: it had " +
                                         std::to_string(kFileBytes) + " bytes"),
              std::string::npos)
        << e.what();
  }
}

TEST(MappedFileSet, AFileCutUnderAReadStaysMappedSoTheCheckNamesIt) {
  TempDir dir;
  auto files = make_files(dir, 3);
  const std::string path = files[0].path;
  {
    MappedFileSet set(std::move(files), 1);
    set.read(0, 0, 1);
    ASSERT_EQ(::truncate(path.c_str(), 4096), 0);
    const volatile std::byte* p = set.read(0, 50'000, 1).data();
    EXPECT_EQ(static_cast<int>(*p), 0);  // the guard's zeros, not SIGBUS
    // Other files read after it: the cut one is neither closed nor forgotten.
    set.read(1, 0, 1);
    set.read(2, 0, 1);
    try {
      check_mappings();
      FAIL() << "the cut file was forgotten";
    } catch (const DataError& e) {
      EXPECT_EQ(e.file(), path);
      EXPECT_EQ(e.offset(), 50'000u);
    }
  }
  EXPECT_NO_THROW(check_mappings());  // gone with the set
}

TEST(MappedFileSet, TheLimitComesFromTheEnvironmentOrTheKernel) {
  {
    ScopedEnv env("FLOWSTATE_MAPPED_FILES", "7");
    EXPECT_EQ(mapped_files_limit(), 7u);
  }
  {
    ScopedEnv env("FLOWSTATE_MAPPED_FILES", "0");
    EXPECT_THROW(mapped_files_limit(), ConfigError);
  }
  {
    ScopedEnv env("FLOWSTATE_MAPPED_FILES", "12x");
    try {
      mapped_files_limit();
      FAIL();
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.key(), "FLOWSTATE_MAPPED_FILES");
      EXPECT_NE(std::string(e.what()).find("'12x' is not a positive integer"), std::string::npos);
    }
  }
  std::size_t kernel = 0;
  std::ifstream("/proc/sys/vm/max_map_count") >> kernel;
  EXPECT_EQ(mapped_files_limit(), kernel / 4);
}

/// 20 records files of 80 records of 1 KiB (80 KiB each: mapped) under `dir`; the glob.
std::string write_twenty_files(const TempDir& dir) {
  return testing::write_records(dir.str(), 20 * 80, 1024, 20);
}

Pipeline records_pipeline(const std::string& glob) {
  return Pipeline::Builder()
      .seed(5)
      .workers(2)
      .records({.paths = {glob}, .record_bytes = 1024})
      .shuffle({.mode = ShuffleMode::kGlobal})
      .batch({.size = 32})
      .build();
}

std::vector<std::uint64_t> all_digests(Loader& loader) {
  std::vector<std::uint64_t> out;
  while (auto b = loader.next()) out.push_back(b->digest());
  return out;
}

/// The threads of this process now.
std::size_t thread_count() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

/// Runs `make()`'s pipeline for two epochs with every file mapped — `mapped` mappings held
/// while it runs — and with a set of `limit` (FLOWSTATE_MAPPED_FILES): the same batches, no
/// mapping kept at build, and at most the set's and two held by each thread that read (the
/// consumer's and TBB's workers: its own, and one more while it switches files) at once.
/// Returns the number of batches.
std::size_t expect_same_with_a_set(const std::function<Pipeline()>& make, std::size_t mapped,
                                   std::size_t limit) {
  const std::size_t before = live_mappings();
  std::vector<std::uint64_t> mapped_all;
  {
    Loader all(make(), {.epochs = 2});
    EXPECT_EQ(live_mappings(), before + mapped);
    mapped_all = all_digests(all);
  }
  EXPECT_GT(mapped_all.size(), 4u);
  ScopedEnv env("FLOWSTATE_MAPPED_FILES", std::to_string(limit));
  Loader bounded(make(), {.epochs = 2});
  EXPECT_EQ(live_mappings(), before);  // checked and closed when built
  std::vector<std::uint64_t> got;
  std::size_t most = 0, threads = 0;
  while (auto b = bounded.next()) {
    got.push_back(b->digest());
    // (Run after other tests in one process, threads that read an earlier set's files may
    // let go of its last mapping here: fewer than `before`.)
    const std::size_t now = live_mappings();
    most = std::max(most, now > before ? now - before : 0);
    threads = std::max(threads, thread_count());
  }
  EXPECT_EQ(got, mapped_all);
  EXPECT_GT(most, 0u);
  // (The Loader's arena may run more threads than the cores: each holds one, and a thread
  // switching files holds a second for a moment — its previous mapping, or the one its read
  // evicted from the set, closed after the set's lock — which this thread may count.)
  EXPECT_LE(most, limit + 2 * threads);
  return got.size();
}

TEST(RecordsSource, MoreFilesThanItMapsAreReadThroughABoundedSetWithTheSameBatches) {
  TempDir dir;
  const std::string glob = write_twenty_files(dir);
  EXPECT_EQ(expect_same_with_a_set([&] { return records_pipeline(glob); }, 20, 4),
            2u * 20 * 80 / 32);
}

TEST(RecordsSource, ABoundedSetOfMappedFilesPassesTheSaveRestoreOracle) {
  TempDir dir;
  const std::string glob = write_twenty_files(dir);
  ScopedEnv env("FLOWSTATE_MAPPED_FILES", "3");
  testing::expect_save_restore([&] { return records_pipeline(glob); }, {.epochs = 2},
                               {.epochs = 2});
}

TEST(LinesSource, MoreFilesThanItMapsAreReadThroughABoundedSetWithTheSameBatches) {
  TempDir dir;
  for (int f = 0; f < 6; ++f) {  // 2 000 lines of 40-odd bytes: ~85 KiB, mapped
    std::vector<std::string> lines;
    for (int i = 0; i < 2000; ++i)
      lines.push_back("file " + std::to_string(f) + " line " + std::to_string(i) +
                      std::string(static_cast<std::size_t>(20 + (i * 7 + f) % 17), 'x'));
    testing::write_lines(dir / ("t" + std::to_string(f) + ".txt"), lines);
  }
  // Pack reads views of mapped files and copies of the set's: the same rows either way.
  expect_same_with_a_set(
      [&] {
        return Pipeline::Builder()
            .seed(9)
            .workers(2)
            .lines({.paths = {dir / "*.txt"}})
            .shuffle({.mode = ShuffleMode::kGlobal})
            .pack({.length = 512, .field = "text", .separator = 10})
            .batch({.size = 8})
            .build();
      },
      6, 2);
}

TEST(TarSource, MoreFilesThanItMapsAreReadThroughABoundedSetWithTheSameBatches) {
  TempDir dir;
  for (int f = 0; f < 5; ++f) {  // 40 samples of ~2 KiB: ~100 KiB, mapped
    std::vector<testing::TarEntry> members;
    for (int i = 0; i < 40; ++i)
      members.push_back({"s" + std::to_string(f) + "_" + std::to_string(i) + ".tokens",
                         std::string(static_cast<std::size_t>(1500 + (i * 37 + f) % 900),
                                     static_cast<char>('a' + (i + f) % 26))});
    testing::write_tar(dir / ("w" + std::to_string(f) + ".tar"), members);
  }
  expect_same_with_a_set(
      [&] {
        return Pipeline::Builder()
            .seed(4)
            .workers(2)
            .tar({.paths = {dir / "*.tar"}, .fields = {"tokens"}})
            .shuffle({.mode = ShuffleMode::kGlobal})
            .pack({.length = 1024, .separator = 0})
            .batch({.size = 4})
            .build();
      },
      5, 2);
}

/// Under `dir`, `pairs` Megatron pairs p<k>.idx / p<k>.bin of 3 400 documents of 8 to 40
/// uint16 tokens: each .idx ~68 KiB and each .bin ~160 KiB, both mapped.
void write_indexed_pairs(const TempDir& dir, int pairs) {
  for (int k = 0; k < pairs; ++k) {
    std::vector<std::int32_t> lengths;
    std::string bin;
    for (int d = 0; d < 3400; ++d) {
      const int n = 8 + (d * 13 + k * 5) % 33;
      lengths.push_back(n);
      for (int t = 0; t < n; ++t) {
        const auto token = static_cast<std::uint16_t>(1 + (d * 31 + t * 7 + k) % 50000);
        bin.append(reinterpret_cast<const char*>(&token), 2);
      }
    }
    const std::string prefix = dir / ("p" + std::to_string(k));
    testing::write_file(prefix + ".idx", megatron_index(DType::kUInt16, lengths));
    testing::write_file(prefix + ".bin", bin);
  }
}

Pipeline indexed_pipeline(const TempDir& dir, IndexedUnit unit = IndexedUnit::kDocument) {
  return Pipeline::Builder()
      .seed(6)
      .workers(2)
      .add(indexed_node(), IndexedOptions{.paths = {dir / "*.idx"}, .unit = unit})
      .shuffle({.mode = ShuffleMode::kGlobal})
      .pack({.length = 256, .separator = 0})
      .batch({.size = 8})
      .build();
}

TEST(IndexedSource, MorePairsThanItMapsAreReadThroughABoundedSetWithTheSameBatches) {
  TempDir dir;
  write_indexed_pairs(dir, 10);
  // Every .idx and .bin mapped for the run (an index under 2 MiB is not copied); over a limit
  // of 4, each .idx read into memory and each .bin read through the set. Pack reads copies of
  // the set's documents where it viewed the mapped ones: the same rows.
  EXPECT_GT(expect_same_with_a_set([&] { return indexed_pipeline(dir); }, 20, 4), 50u);
}

TEST(IndexedSource, ABoundedSetOfMappedFilesPassesTheSaveRestoreOracle) {
  TempDir dir;
  write_indexed_pairs(dir, 4);
  ScopedEnv env("FLOWSTATE_MAPPED_FILES", "3");
  for (const IndexedUnit unit : {IndexedUnit::kDocument, IndexedUnit::kSequence})
    testing::expect_save_restore([&] { return indexed_pipeline(dir, unit); }, {.epochs = 2},
                                 {.epochs = 2});
}

}  // namespace
}  // namespace flowstate
