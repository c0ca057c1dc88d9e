// A data file cut short while it is mapped: the read that finds its page gone must not kill
// the process (SIGBUS), and no batch made after it may leave the loader.
#include "flowstate/nodes/sources/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::TempDir;

void write_bytes(const std::string& p, std::size_t n) {
  std::vector<char> bytes(n);
  for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<char>(1 + i % 251);
  std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(n));
}

void truncate_to(const std::string& p, std::size_t n) {
  ASSERT_EQ(::truncate(p.c_str(), static_cast<off_t>(n)), 0) << std::strerror(errno);
}

TEST(MappedFile, AReadPastAnEndThatMovedGivesZerosAndTheCheckNamesFileAndOffset) {
  TempDir dir;
  const auto path = dir / "data.bin";
  write_bytes(path, 256 * 1024);  // more than kReadIntoMemoryBytes: mapped
  {
    MappedFile f(path);
    ASSERT_FALSE(f.in_memory());
    EXPECT_EQ(faulted_mappings(), 0u);
    EXPECT_NO_THROW(check_mappings());
    EXPECT_EQ(static_cast<int>(f.data()[40000]), 1 + 40000 % 251);
    truncate_to(path, 4096);
    // Without the guard this read ends the process with SIGBUS.
    const volatile std::byte* p = f.data();
    EXPECT_EQ(static_cast<int>(p[40000]), 0);
    EXPECT_EQ(static_cast<int>(p[50000]), 0);
    EXPECT_EQ(static_cast<int>(p[100]), 1 + 100);  // what the file still has reads as before
    EXPECT_EQ(f.fault_offset(), 40000u);
    EXPECT_EQ(faulted_mappings(), 1u);
    try {
      check_mappings();
      FAIL() << "no error";
    } catch (const DataError& e) {
      EXPECT_EQ(e.file(), path);
      EXPECT_EQ(e.offset(), 40000u);
      EXPECT_NE(std::string(e.what()).find("changed while it was read: byte 40000 is past its end "
                                           "(it had 262144 bytes when opened; it has 4096 bytes "
                                           "now)"),
                std::string::npos)
          << e.what();
    }
  }
  // The mapping is gone, and with it the fault: later runs in this process are not failed by it.
  EXPECT_EQ(faulted_mappings(), 0u);
  EXPECT_NO_THROW(check_mappings());
}

TEST(MappedFile, AFileRemovedAndCutIsNamedAsGone) {
  TempDir dir;
  const auto path = dir / "gone.bin";
  write_bytes(path, 128 * 1024);
  MappedFile f(path);
  ASSERT_FALSE(f.in_memory());
  truncate_to(path, 0);
  std::filesystem::remove(path);
  const volatile std::byte* p = f.data();
  EXPECT_EQ(static_cast<int>(p[8192]), 0);
  try {
    check_mappings();
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("it is gone now"), std::string::npos) << e.what();
  }
}

TEST(MappedFileDeathTest, ASigbusOutsideFlowstatesMappingsStillEndsTheProcess) {
  TempDir dir;
  const auto ours = dir / "ours.bin";
  write_bytes(ours, 2 * kReadIntoMemoryBytes);
  MappedFile installs_the_guard(ours);
  ASSERT_FALSE(installs_the_guard.in_memory());
  const auto other = dir / "other.bin";
  write_bytes(other, 16 * 1024);
  EXPECT_DEATH(
      {
        const int fd = ::open(other.c_str(), O_RDONLY);
        void* m = ::mmap(nullptr, 16 * 1024, PROT_READ, MAP_SHARED, fd, 0);
        if (::ftruncate(::open(other.c_str(), O_RDWR), 0) != 0) std::_Exit(0);
        const volatile char* p = static_cast<const char*>(m);
        (void)p[8192];
        std::_Exit(0);  // not reached: the guard leaves a mapping not its own to SIGBUS
      },
      "");
}

TEST(MappedFile, ASmallFileIsReadIntoMemoryHoldsNoMappingAndRecordsItsStat) {
  TempDir dir;
  const auto path = dir / "small.bin";
  write_bytes(path, kReadIntoMemoryBytes);
  const std::size_t mapped_before = live_mappings();
  MappedFile f(path);
  EXPECT_TRUE(f.in_memory());
  EXPECT_EQ(live_mappings(), mapped_before);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(f.stat().inode, static_cast<std::uint64_t>(st.st_ino));
  EXPECT_EQ(f.stat().device, static_cast<std::uint64_t>(st.st_dev));
  EXPECT_EQ(f.stat().mtime_ns, st.st_mtim.tv_sec * 1'000'000'000LL + st.st_mtim.tv_nsec);
  EXPECT_EQ(f.stat().ctime_ns, st.st_ctim.tv_sec * 1'000'000'000LL + st.st_ctim.tv_nsec);
  // Read once when opened: a cut afterwards changes nothing it holds, and faults nothing.
  truncate_to(path, 10);
  std::filesystem::remove(path);
  EXPECT_EQ(static_cast<int>(f.data()[kReadIntoMemoryBytes - 1]),
            1 + (kReadIntoMemoryBytes - 1) % 251);
  EXPECT_EQ(f.fault_offset(), MappedFile::kNoFault);
  EXPECT_NO_THROW(check_mappings());

  // One byte more is mapped.
  const auto big = dir / "big.bin";
  write_bytes(big, kReadIntoMemoryBytes + 1);
  MappedFile g(big);
  EXPECT_FALSE(g.in_memory());
  EXPECT_EQ(live_mappings(), mapped_before + 1);
}

TEST(MappedFile, ALoaderWhoseRecordsFileIsCutFailsNamingItAndDeliversNoZeros) {
  TempDir dir;
  constexpr std::size_t kRecordBytes = 1024, kRecords = 4096;
  const std::string glob = testing::write_records(dir.str(), kRecords, kRecordBytes, 1);
  const auto path = dir / "part-00000.bin";
  ASSERT_TRUE(std::filesystem::exists(path));
  Pipeline::Builder b;
  b.seed(7)
      .workers(2)
      .records({.paths = {glob}, .record_bytes = kRecordBytes})
      .shuffle({.mode = ShuffleMode::kGlobal})
      .batch({.size = 64});
  Loader loader(b.build(), {.epochs = 1, .prefetch = 2});
  std::optional<Batch> first = loader.next();
  ASSERT_TRUE(first.has_value());
  truncate_to(path, 64 * kRecordBytes);
  std::uint64_t delivered = 1;
  auto check_no_zeros = [&](const Batch& batch) {
    const Tensor& t = batch["data"];
    const auto* bytes = static_cast<const std::byte*>(t.data());
    for (std::int64_t i = 0; i < t.shape()[0]; ++i) {
      const std::byte* rec = bytes + i * kRecordBytes;
      bool all_zero = true;
      for (std::size_t k = 8; k < kRecordBytes && all_zero; ++k) all_zero = rec[k] == std::byte{0};
      ASSERT_FALSE(all_zero) << "batch " << batch.info.step << " row " << i << " is zeros";
    }
  };
  check_no_zeros(*first);
  try {
    while (std::optional<Batch> batch = loader.next()) {
      check_no_zeros(*batch);
      ++delivered;
    }
    FAIL() << "the loader read past the cut without an error";
  } catch (const DataError& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_GE(e.offset(), 64 * kRecordBytes);
    EXPECT_NE(
        std::string(e.what()).find("node 'records': '" + path + "' changed while it was read"),
        std::string::npos)
        << e.what();
  }
  EXPECT_LT(delivered, kRecords / 64);
}

}  // namespace
}  // namespace flowstate
