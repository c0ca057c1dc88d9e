// 16-bit floating-point tensor elements: IEEE binary16 (Float16, DType::kFloat16, numpy's
// float16, torch.float16) and bfloat16 (BFloat16, DType::kBFloat16, torch.bfloat16), with
// their conversions.
//
// Every conversion to a 16-bit type rounds once, to nearest, ties to even, from the exact value
// (a double goes straight to 16 bits, never through float): subnormals are produced, values
// past the largest finite one become ±inf, and NaN stays NaN with its sign and the top bits of
// its payload, quieted — what x86's F16C instructions (vcvtps2ph) do, which the bulk
// conversions below use where the CPU has them. Widening to float is exact.
#pragma once

#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>

namespace flowstate {

namespace detail {

/// `v` rounded to a binary format with `E` exponent and `M` stored mantissa bits (IEEE layout:
/// sign, biased exponent, mantissa), to nearest even; the result's bits.
template <int E, int M>
constexpr std::uint16_t narrow_bits(double v) {
  constexpr int kBias = (1 << (E - 1)) - 1;
  constexpr std::uint64_t kExpAll = (std::uint64_t{1} << E) - 1;
  constexpr int kShift = 52 - M;  // mantissa bits dropped from a double
  const auto d = std::bit_cast<std::uint64_t>(v);
  const auto sign = static_cast<std::uint16_t>((d >> 63) << (E + M));
  const std::uint64_t a = d & 0x7FFF'FFFF'FFFF'FFFFull;
  if (a >= 0x7FF0'0000'0000'0000ull) {  // inf, NaN
    if (a == 0x7FF0'0000'0000'0000ull) return static_cast<std::uint16_t>(sign | (kExpAll << M));
    const std::uint64_t payload = (a >> kShift) & ((std::uint64_t{1} << M) - 1);
    return static_cast<std::uint16_t>(sign | (kExpAll << M) | (std::uint64_t{1} << (M - 1)) |
                                      payload);
  }
  const int exp = static_cast<int>(a >> 52) - 1023;  // unbiased (subnormal doubles: -1023)
  if (exp > kBias) return static_cast<std::uint16_t>(sign | (kExpAll << M));  // overflow
  if (exp >= 1 - kBias) {  // a normal number of the target: rebias, round at bit kShift
    std::uint64_t m = a - (static_cast<std::uint64_t>(1023 - kBias) << 52);
    m += (std::uint64_t{1} << (kShift - 1)) - 1 + ((m >> kShift) & 1);
    m >>= kShift;  // a carry out of the mantissa bumps the exponent, up to inf: both correct
    return static_cast<std::uint16_t>(sign | m);
  }
  // A subnormal (or zero) of the target: count units of its smallest subnormal,
  // 2^(1 - bias - M). A double with exponent field e and significand s is s * 2^(e - 1075).
  const std::uint64_t field = a >> 52;
  const std::uint64_t sig =
      (a & 0x000F'FFFF'FFFF'FFFFull) | (field != 0 ? 0x0010'0000'0000'0000ull : 0);
  const std::int64_t shift =
      (1075 + 1 - kBias - M) - static_cast<std::int64_t>(field != 0 ? field : 1);
  if (shift > 53) return sign;  // below half the smallest subnormal: ±0
  std::uint64_t q = sig >> shift;
  const std::uint64_t rem = sig & ((std::uint64_t{1} << shift) - 1);
  const std::uint64_t half = std::uint64_t{1} << (shift - 1);
  if (rem > half || (rem == half && (q & 1) != 0)) ++q;  // may reach the smallest normal: fine
  return static_cast<std::uint16_t>(sign | q);
}

}  // namespace detail

/// The binary16 bits nearest `v` (ties to even); the portable conversion, bit for bit what F16C
/// gives.
constexpr std::uint16_t float16_bits(double v) { return detail::narrow_bits<5, 10>(v); }

/// The bfloat16 bits nearest `v` (ties to even).
constexpr std::uint16_t bfloat16_bits(double v) { return detail::narrow_bits<8, 7>(v); }

/// The value of binary16 `bits`, exactly (a NaN keeps its payload, quieted, as F16C does).
constexpr float float16_value(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exp = (bits >> 10) & 0x1Fu;
  std::uint32_t man = bits & 0x3FFu;
  if (exp == 0x1F)
    return std::bit_cast<float>(sign | 0x7F80'0000u | (man != 0 ? 0x0040'0000u : 0) | (man << 13));
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
  if (man == 0) return std::bit_cast<float>(sign);
  std::uint32_t e = 113;  // a subnormal: normalize the mantissa
  while ((man & 0x400u) == 0) {
    man <<= 1;
    --e;
  }
  return std::bit_cast<float>(sign | (e << 23) | ((man & 0x3FFu) << 13));
}

/// The value of bfloat16 `bits`, exactly.
constexpr float bfloat16_value(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

/// A DType::kFloat16 element: IEEE binary16 bits. Converts from any arithmetic value (rounded to
/// nearest even) and to float (exactly), so code written for float/double elements reads it.
struct Float16 {
  std::uint16_t bits;  ///< sign, 5 exponent bits, 10 mantissa bits

  Float16() = default;
  /// The nearest binary16 to `v`.
  constexpr explicit Float16(double v) : bits(float16_bits(v)) {}
  /// The nearest binary16 to `v` (exact up to 2048; past 65504, inf).
  template <std::integral I>
  constexpr explicit Float16(I v) : bits(float16_bits(static_cast<double>(v))) {}
  /// The element with these bits.
  static constexpr Float16 from_bits(std::uint16_t b) {
    Float16 h;
    h.bits = b;
    return h;
  }
  /// The value, exactly.
  constexpr operator float() const { return float16_value(bits); }
};

/// A DType::kBFloat16 element: the top 16 bits of a float32. As Float16, for bfloat16.
struct BFloat16 {
  std::uint16_t bits;  ///< sign, 8 exponent bits, 7 mantissa bits

  BFloat16() = default;
  /// The nearest bfloat16 to `v`.
  constexpr explicit BFloat16(double v) : bits(bfloat16_bits(v)) {}
  /// The nearest bfloat16 to `v` (exact up to 256).
  template <std::integral I>
  constexpr explicit BFloat16(I v) : bits(bfloat16_bits(static_cast<double>(v))) {}
  /// The element with these bits.
  static constexpr BFloat16 from_bits(std::uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
  /// The value, exactly.
  constexpr operator float() const { return bfloat16_value(bits); }
};

/// Whether T is Float16 or BFloat16.
template <class T>
inline constexpr bool is_half_v = std::same_as<T, Float16> || std::same_as<T, BFloat16>;

/// How the bulk conversions run: kAuto picks F16C when this CPU has it (checked once, at run
/// time); kPortable and kF16C force one (kF16C on a CPU without it throws std::runtime_error) —
/// for tests, which check that both give the same bits.
enum class HalfPath : std::uint8_t { kAuto, kPortable, kF16C };

/// Whether this CPU has the F16C instructions (x86-64; false elsewhere).
bool cpu_has_f16c();

/// out[i] = float16_bits(in[i]) for i < n.
void float_to_float16(const float* in, std::uint16_t* out, std::size_t n,
                      HalfPath path = HalfPath::kAuto);
/// out[i] = float16_value(in[i]) for i < n.
void float16_to_float(const std::uint16_t* in, float* out, std::size_t n,
                      HalfPath path = HalfPath::kAuto);

}  // namespace flowstate
