#include "flowstate/core/permutation.h"

#include "flowstate/core/rng.h"

namespace flowstate {

FeistelPermutation::FeistelPermutation(std::uint64_t n, std::uint64_t key) : n_(n), key_(key) {
  // Smallest even bit count 2h with 2^(2h) >= n, so cycle walking takes < 4 tries expected.
  unsigned bits = 2;
  while (bits < 64 && (std::uint64_t{1} << bits) < n) bits += 2;
  half_bits_ = bits / 2;
  half_mask_ = (std::uint64_t{1} << half_bits_) - 1;
  if (half_bits_ <= kTableHalfBits) {
    const std::uint64_t values = std::uint64_t{1} << half_bits_;
    table_.resize(kRounds * values);
    for (int r = 0; r < kRounds; ++r)
      for (std::uint64_t v = 0; v < values; ++v)
        table_[static_cast<std::uint64_t>(r) * values + v] = static_cast<std::uint16_t>(
            philox64(key_, static_cast<std::uint64_t>(r), v) & half_mask_);
  }
}

std::uint64_t FeistelPermutation::encrypt(std::uint64_t x) const {
  std::uint64_t left = x >> half_bits_, right = x & half_mask_;
  if (!table_.empty()) {
    const std::uint16_t* f = table_.data();
    for (int r = 0; r < kRounds; ++r, f += half_mask_ + 1) {
      const std::uint64_t next = left ^ f[right];
      left = right;
      right = next;
    }
    return (left << half_bits_) | right;
  }
  for (int r = 0; r < kRounds; ++r) {
    std::uint64_t f = philox64(key_, static_cast<std::uint64_t>(r), right) & half_mask_;
    std::uint64_t next = left ^ f;
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

std::uint64_t FeistelPermutation::operator()(std::uint64_t i) const {
  // Cycle walking: the Feistel network permutes [0, 2^(2h)); following the cycle from i until
  // it re-enters [0, n) gives a permutation of [0, n).
  std::uint64_t x = encrypt(i);
  while (x >= n_) x = encrypt(x);
  return x;
}

}  // namespace flowstate
