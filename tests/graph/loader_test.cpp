#include "graph/loader.h"

#include <gtest/gtest.h>

#include <set>

#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::drain;
using testing::record_index;
using testing::TempDir;

Pipeline w1_like(const std::string& glob, std::uint64_t batch, bool drop_last = false,
                 int workers = 2) {
  return Pipeline::Builder()
      .seed(1234)
      .workers(workers)
      .records({.paths = {glob}, .record_bytes = 64})
      .shuffle({.mode = ShuffleMode::kBuffer, .size = 100})
      .batch({.size = batch, .drop_last = drop_last})
      .prefetch({.depth = 3})
      .build();
}

TEST(Loader, DeliversEveryRecordOncePerEpoch) {
  TempDir dir;
  auto glob = testing::write_records(dir.str(), 1000, 64, 3);
  Loader loader(w1_like(glob, 64), {.epochs = 2});
  std::vector<std::multiset<std::uint64_t>> seen(2);
  std::uint64_t expect_step = 0;
  for (const Batch& b : loader) {
    EXPECT_EQ(b.info.step, expect_step++);
    const Tensor& t = b["data"];
    ASSERT_EQ(t.shape().rank(), 2u);
    for (std::int64_t i = 0; i < t.shape()[0]; ++i)
      seen[b.info.epoch].insert(record_index(static_cast<const std::byte*>(t.data()) + i * 64));
  }
  EXPECT_EQ(expect_step, 2u * 16u);
  for (auto& s : seen) {
    ASSERT_EQ(s.size(), 1000u);
    EXPECT_EQ(std::set<std::uint64_t>(s.begin(), s.end()).size(), 1000u);
  }
}

}  // namespace
}  // namespace flowstate
