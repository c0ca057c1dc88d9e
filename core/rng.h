// Counter-based random numbers (Philox4x32-10). A value is a pure function of (key, counter),
// so results never depend on thread count or timing, and a generator's state is two integers.
//
//   ElementRng rng(key_for(seed, node_id), stream_for(epoch, ref.index));
//   std::uniform_int_distribution<int> d(0, 9);  int x = d(rng);
#pragma once

#include <array>
#include <cstdint>
#include <limits>

namespace flowstate {

/// One Philox4x32-10 block: 128 random bits for (counter, key).
std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> counter,
                                        std::array<std::uint32_t, 2> key);

/// 64 random bits for (key, stream, counter). Pure function.
std::uint64_t philox64(std::uint64_t key, std::uint64_t stream, std::uint64_t counter);

/// 128-bit unsigned arithmetic (a GCC/Clang extension) for overflow-free products.
__extension__ using Uint128 = unsigned __int128;

/// A uniform value in [0, bound) from 64 random bits (Lemire's multiply-shift; bias < 2^-32
/// for bounds below 2^32).
inline std::uint64_t bounded(std::uint64_t bits, std::uint64_t bound) {
  return static_cast<std::uint64_t>((static_cast<Uint128>(bits) * bound) >> 64);
}

/// A UniformRandomBitGenerator over philox64 with a running counter; its whole state is
/// (key, stream, counter).
class ElementRng {
 public:
  using result_type = std::uint64_t;
  ElementRng(std::uint64_t key, std::uint64_t stream, std::uint64_t counter = 0)
      : key_(key), stream_(stream), counter_(counter) {}
  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return std::numeric_limits<result_type>::max(); }
  result_type operator()() { return philox64(key_, stream_, counter_++); }
  /// Uniform in [0, bound).
  std::uint64_t below(std::uint64_t bound) { return bounded((*this)(), bound); }
  std::uint64_t counter() const { return counter_; }

 private:
  std::uint64_t key_;
  std::uint64_t stream_;
  std::uint64_t counter_;
};

}  // namespace flowstate
