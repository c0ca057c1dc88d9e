#include "tests/support/testing.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>

#include "flowstate/core/rng.h"

namespace flowstate::testing {

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "flowstate-test-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string write_records(const std::string& dir, std::uint64_t records, std::size_t record_bytes,
                          std::size_t shards, std::uint64_t seed) {
  std::filesystem::create_directories(dir);
  std::vector<char> rec(record_bytes);
  for (std::size_t s = 0; s < shards; ++s) {
    char name[32];
    std::snprintf(name, sizeof(name), "part-%05zu.bin", s);
    std::ofstream out(std::filesystem::path(dir) / name, std::ios::binary);
    std::uint64_t begin = records * s / shards, end = records * (s + 1) / shards;
    for (std::uint64_t i = begin; i < end; ++i) {
      for (std::size_t b = 0; b < record_bytes; b += 8) {
        std::uint64_t v = b == 0 ? i : philox64(seed, i, b / 8);
        std::memcpy(rec.data() + b, &v, std::min<std::size_t>(8, record_bytes - b));
      }
      out.write(rec.data(), static_cast<std::streamsize>(record_bytes));
    }
  }
  return (std::filesystem::path(dir) / "part-*.bin").string();
}

std::uint64_t record_index(const std::byte* record) {
  std::uint64_t v;
  std::memcpy(&v, record, 8);
  return v;
}

void expect_save_restore(const std::function<Pipeline()>& make, LoaderOptions options,
                         LoaderOptions restore_options) {
  const OracleReport report = check_save_restore(make, options, restore_options);
  EXPECT_TRUE(report.ok()) << report.summary();
}

}  // namespace flowstate::testing
