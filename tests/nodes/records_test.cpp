#include "flowstate/nodes/sources/records.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "flowstate/core/error.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::TempDir;

TEST(RecordsSource, NumbersRecordsAcrossFilesInSortedOrder) {
  TempDir dir;
  auto glob = testing::write_records(dir.str(), 100, 8, 3);
  RecordsSource src("records", {.paths = {glob}, .record_bytes = 8});
  ASSERT_EQ(src.size(0), 100u);
  ASSERT_EQ(src.files().size(), 3u);
  for (std::uint64_t i = 0; i < 100; ++i) {
    Ref r = src.at(0, i);
    EXPECT_EQ(r.index, i);
    EXPECT_EQ(testing::record_index(src.record(r).data()), i);
  }
  EXPECT_EQ(src.at(0, 0).shard, 0u);
  EXPECT_EQ(src.at(0, 99).shard, 2u);
}

TEST(RecordsSource, ReadsASampleAsACopy) {
  TempDir dir;
  auto glob = testing::write_records(dir.str(), 10, 16, 1);
  RecordsSource src("records", {.paths = {glob}, .record_bytes = 16, .field = "bytes"});
  Sample s;
  src.read(src.at(0, 7), s);
  const Tensor& t = s.at("bytes");
  EXPECT_EQ(t.shape(), (Shape{16}));
  EXPECT_EQ(testing::record_index(static_cast<const std::byte*>(t.data())), 7u);
  static_cast<std::byte*>(t.data())[0] = std::byte{0};  // writable
}

TEST(RecordsSource, RejectsAFileThatIsNotAMultipleOfTheRecordSize) {
  TempDir dir;
  testing::write_records(dir.str(), 10, 8, 1);
  { std::ofstream(dir / "part-00001.bin", std::ios::binary) << "12345"; }
  try {
    RecordsSource src("records", {.paths = {dir / "*.bin"}, .record_bytes = 8});
    FAIL();
  } catch (const DataError& e) {
    EXPECT_EQ(e.file(), dir / "part-00001.bin");
    EXPECT_EQ(e.offset(), 0u);
    EXPECT_NE(std::string(e.what()).find("(5 bytes) is not a multiple of record_bytes (8)"),
              std::string::npos)
        << e.what();
  }
}

TEST(RecordsSource, RejectsAnEmptyMatch) {
  TempDir dir;
  try {
    RecordsSource src("records", {.paths = {dir / "*.bin"}, .record_bytes = 8});
    FAIL();
  } catch (const DataError& e) {
    EXPECT_EQ(e.file(), dir / "*.bin");
    EXPECT_NE(std::string(e.what()).find("no file matches"), std::string::npos);
  }
}

TEST(RecordsSource, RejectsAnUnreadableFile) {
  TempDir dir;
  std::filesystem::create_directory(dir / "sub.bin");  // matches, but is no regular file
  try {
    RecordsSource src("records", {.paths = {dir / "sub.bin"}, .record_bytes = 8});
    FAIL();
  } catch (const DataError& e) {
    EXPECT_EQ(e.file(), dir / "sub.bin");
    EXPECT_NE(std::string(e.what()).find("is not a regular file"), std::string::npos);
  }
  if (::geteuid() != 0) {  // root reads anything
    testing::write_records((dir / "locked"), 4, 8, 1);
    std::filesystem::permissions(dir / "locked/part-00000.bin", std::filesystem::perms::none);
    EXPECT_THROW(RecordsSource("r", {.paths = {dir / "locked/*.bin"}, .record_bytes = 8}),
                 DataError);
  }
}

TEST(RecordsSource, RejectsAZeroRecordSize) {
  try {
    RecordsSource src("records", {.paths = {"x"}, .record_bytes = 0});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "records.record_bytes");
    EXPECT_STREQ(e.what(), "records.record_bytes: 0 is out of range (must be at least 1)");
  }
}

TEST(RecordsSource, AcceptsAnEmptyFile) {
  TempDir dir;
  { std::ofstream(dir / "empty.bin", std::ios::binary); }
  RecordsSource src("records", {.paths = {dir / "empty.bin"}, .record_bytes = 8});
  EXPECT_EQ(src.size(0), 0u);
}

}  // namespace
}  // namespace flowstate
