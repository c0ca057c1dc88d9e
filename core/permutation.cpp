#include "flowstate/core/permutation.h"

#include <algorithm>
#include <cstddef>
#include <vector>

#include "flowstate/core/rng.h"

namespace flowstate {
namespace {

/// The network's rounds, tabled, over `Lanes` elements side by side: x[l] becomes its image
/// under one pass of the network (no cycle walking). One lane is `encrypt`; eight let one
/// element's dependent lookups overlap with the others' (`images`).
template <std::size_t Lanes>
void tabled_rounds(const std::uint16_t* table, unsigned half_bits, std::uint64_t* x) {
  const std::uint64_t values = std::uint64_t{1} << half_bits, half_mask = values - 1;
  std::uint64_t left[Lanes], right[Lanes];
  for (std::size_t l = 0; l < Lanes; ++l) {
    left[l] = x[l] >> half_bits;
    right[l] = x[l] & half_mask;
  }
  const std::uint16_t* f = table;
  for (int r = 0; r < FeistelPermutation::kRounds; ++r, f += values) {
    for (std::size_t l = 0; l < Lanes; ++l) {
      const std::uint64_t next = left[l] ^ f[right[l]];
      left[l] = right[l];
      right[l] = next;
    }
  }
  for (std::size_t l = 0; l < Lanes; ++l) x[l] = (left[l] << half_bits) | right[l];
}

}  // namespace

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
  if (!table_.empty()) {
    tabled_rounds<1>(table_.data(), half_bits_, &x);
    return x;
  }
  std::uint64_t left = x >> half_bits_, right = x & half_mask_;
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

void FeistelPermutation::images(std::uint64_t first, std::span<std::uint64_t> out) const {
  if (table_.empty()) {
    for (std::size_t j = 0; j < out.size(); ++j) out[j] = (*this)(first + j);
    return;
  }
  // Tabled: the chunk goes through the network eight elements side by side, then the ones
  // outside [0, n) (about a quarter) are gathered without a branch and go through again, side
  // by side, until none is left: cycle walking with no unpredictable branch per element.
  constexpr std::size_t kLanes = 8;
  auto rounds = [this](std::uint64_t* x) { tabled_rounds<kLanes>(table_.data(), half_bits_, x); };
  thread_local std::vector<std::uint32_t> walking;  // positions in `out` still >= n
  walking.resize(out.size() + kLanes);
  std::size_t left_over = 0;
  for (std::size_t j = 0; j < out.size(); j += kLanes) {
    std::uint64_t x[kLanes];
    const std::size_t lanes = std::min(kLanes, out.size() - j);
    for (std::size_t l = 0; l < kLanes; ++l) x[l] = first + j + (l < lanes ? l : 0);
    rounds(x);
    for (std::size_t l = 0; l < lanes; ++l) {
      out[j + l] = x[l];
      walking[left_over] = static_cast<std::uint32_t>(j + l);
      left_over += x[l] >= n_;
    }
  }
  while (left_over > 0) {
    std::size_t still = 0;
    for (std::size_t k = 0; k < left_over; k += kLanes) {
      std::uint64_t x[kLanes];
      const std::size_t lanes = std::min(kLanes, left_over - k);
      for (std::size_t l = 0; l < kLanes; ++l) x[l] = out[walking[k + (l < lanes ? l : 0)]];
      rounds(x);
      for (std::size_t l = 0; l < lanes; ++l) {
        const std::uint32_t at = walking[k + l];
        out[at] = x[l];
        walking[still] = at;  // still <= k + l: an entry already read
        still += x[l] >= n_;
      }
    }
    left_over = still;
  }
}

}  // namespace flowstate
