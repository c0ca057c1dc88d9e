#include "flowstate/core/permutation.h"

#include <gtest/gtest.h>

#include <vector>

namespace flowstate {
namespace {

class FeistelBijection : public ::testing::TestWithParam<std::uint64_t> {};

TEST_P(FeistelBijection, IsAPermutationOfZeroToN) {
  const std::uint64_t n = GetParam();
  FeistelPermutation p(n, 0x5eed);
  std::vector<bool> hit(n, false);
  for (std::uint64_t i = 0; i < n; ++i) {
    std::uint64_t j = p(i);
    ASSERT_LT(j, n) << "image of " << i;
    ASSERT_FALSE(hit[j]) << j << " is hit twice";
    hit[j] = true;
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, FeistelBijection,
                         ::testing::Values(0, 1, 2, 3, 1000, 65537, (1u << 20) + 1));

TEST(FeistelPermutation, DependsOnTheKey) {
  FeistelPermutation a(1000, 1), b(1000, 2);
  int same = 0;
  for (std::uint64_t i = 0; i < 1000; ++i) same += a(i) == b(i);
  EXPECT_LT(same, 20);
}

TEST(FeistelPermutation, ActuallyShuffles) {
  FeistelPermutation p(100000, 99);
  int fixed = 0, ascending = 0;
  for (std::uint64_t i = 0; i + 1 < 100000; ++i) {
    fixed += p(i) == i;
    ascending += p(i) < p(i + 1);
  }
  EXPECT_LT(fixed, 50);
  EXPECT_NEAR(ascending, 50000, 1500);  // a random order ascends about half the time
}

}  // namespace
}  // namespace flowstate
