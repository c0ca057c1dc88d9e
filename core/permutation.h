// FeistelPermutation: a keyed bijection on [0, n) in O(1) memory and O(1) expected time per
// element — the per-epoch order of a global shuffle. A balanced Feistel network on the
// smallest even number of bits covering n, with cycle walking back into [0, n).
#pragma once

#include <cstdint>

namespace flowstate {

/// A bijection on [0, n) chosen by `key`. Valid for every n, including 0 and 1.
class FeistelPermutation {
 public:
  FeistelPermutation(std::uint64_t n, std::uint64_t key);
  /// The image of i; requires i < n.
  std::uint64_t operator()(std::uint64_t i) const;
  std::uint64_t size() const { return n_; }

 private:
  std::uint64_t encrypt(std::uint64_t x) const;

  std::uint64_t n_;
  std::uint64_t key_;
  unsigned half_bits_ = 1;
  std::uint64_t half_mask_ = 1;
};

}  // namespace flowstate
