#include "flowstate/core/rng.h"

namespace flowstate {

std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> c,
                                        std::array<std::uint32_t, 2> k) {
  constexpr std::uint32_t kM0 = 0xD2511F53, kM1 = 0xCD9E8D57;
  constexpr std::uint32_t kW0 = 0x9E3779B9, kW1 = 0xBB67AE85;
  for (int round = 0; round < 10; ++round) {
    std::uint64_t p0 = static_cast<std::uint64_t>(kM0) * c[0];
    std::uint64_t p1 = static_cast<std::uint64_t>(kM1) * c[2];
    std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

std::uint64_t philox64(std::uint64_t key, std::uint64_t stream, std::uint64_t counter) {
  auto r =
      philox4x32({static_cast<std::uint32_t>(counter), static_cast<std::uint32_t>(counter >> 32),
                  static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)},
                 {static_cast<std::uint32_t>(key), static_cast<std::uint32_t>(key >> 32)});
  return (static_cast<std::uint64_t>(r[0]) << 32) | r[1];
}

}  // namespace flowstate
