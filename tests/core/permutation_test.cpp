#include "flowstate/core/permutation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "flowstate/core/rng.h"

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

// The permutation fixes the order of every global shuffle, and so what a checkpoint's cursor
// points at: the values a release computed must never change. These were computed by the
// Feistel network before its round functions were tabled (six Philox blocks per encryption).
TEST(FeistelPermutation, KeepsTheOrderOfEarlierReleases) {
  struct Case {
    std::uint64_t n, key;
    std::uint64_t images[5];  // of 0, 1, 2, n / 2, n - 1
  };
  const Case cases[] = {
      {10, 0x7, {7, 4, 0, 9, 3}},
      {200000, 0x9e3779b97f4a7c15, {75163, 82178, 2061, 28859, 48961}},
      {16777216, 0x3, {8055443, 8018756, 15061417, 11720811, 261154}},   // tabled, the widest
      {16777217, 0x3, {2143427, 12014170, 1318717, 5042942, 10782631}},  // computed per round
      {5000000000, 0x2a, {2352214493, 4121704398, 3881806143, 2304723398, 4003621929}},
  };
  for (const Case& c : cases) {
    FeistelPermutation p(c.n, c.key);
    const std::uint64_t at[] = {0, 1, 2, c.n / 2, c.n - 1};
    for (int k = 0; k < 5; ++k)
      EXPECT_EQ(p(at[k]), c.images[k]) << "n " << c.n << " key " << c.key << " i " << at[k];
  }
}

// Every tabled width gives the network computed round by round, as it was first written.
TEST(FeistelPermutation, TabledRoundsEqualTheNetworkComputedPerRound) {
  for (unsigned half = 1; half <= FeistelPermutation::kTableHalfBits; ++half) {
    const std::uint64_t n = (std::uint64_t{1} << (2 * half)) - 3;  // some cycle walking
    const std::uint64_t key = 0x5eed + half;
    const std::uint64_t mask = (std::uint64_t{1} << half) - 1;
    auto encrypt = [&](std::uint64_t x) {
      std::uint64_t left = x >> half, right = x & mask;
      for (int r = 0; r < FeistelPermutation::kRounds; ++r) {
        const std::uint64_t next =
            left ^ (philox64(key, static_cast<std::uint64_t>(r), right) & mask);
        left = right;
        right = next;
      }
      return (left << half) | right;
    };
    FeistelPermutation p(n, key);
    const std::uint64_t step = std::max<std::uint64_t>(1, n / 5000);
    for (std::uint64_t i = 0; i < n; i += step) {
      std::uint64_t x = encrypt(i);
      while (x >= n) x = encrypt(x);
      ASSERT_EQ(p(i), x) << "half width " << half << ", i " << i;
    }
  }
}

// A chunk's images computed side by side are the images one by one: tabled widths (eight
// elements a step, then the rest one by one) and the width computed per round, at any start.
TEST(FeistelPermutation, ImagesOfAChunkAreItsElementsImages) {
  for (const std::uint64_t n :
       {std::uint64_t{1}, std::uint64_t{7}, std::uint64_t{200000}, std::uint64_t{16777217}}) {
    FeistelPermutation p(n, 0xfee1 + n);
    for (const std::uint64_t first : {std::uint64_t{0}, std::uint64_t{3}, n / 2}) {
      for (const std::size_t count :
           {std::size_t{0}, std::size_t{1}, std::size_t{8}, std::size_t{29}}) {
        if (first + count > n) continue;
        std::vector<std::uint64_t> out(count, ~std::uint64_t{0});
        p.images(first, out);
        for (std::size_t j = 0; j < count; ++j)
          ASSERT_EQ(out[j], p(first + j)) << "n " << n << " first " << first << " j " << j;
      }
    }
  }
}

}  // namespace
}  // namespace flowstate
