// float16 and bfloat16: the portable conversions against the IEEE rules (every half, every tie,
// the subnormal and overflow edges), against F16C bit for bit, and the dtypes' table entries.
// (LibTorch's c10::Half/BFloat16 check them again in dlpack_torch_test.cpp; numpy's
// astype(float16) in tests/python/test_images.py.)
#include "flowstate/core/half.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "flowstate/core/collate.h"
#include "flowstate/core/dtype.h"
#include "flowstate/core/error.h"
#include "flowstate/core/tensor.h"

namespace flowstate {
namespace {

float f32(std::uint32_t bits) { return std::bit_cast<float>(bits); }
std::uint32_t bits32(float f) { return std::bit_cast<std::uint32_t>(f); }

bool half_is_nan(std::uint16_t h) { return (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0; }

TEST(Half, DTypeTableEntries) {
  EXPECT_EQ(dtype_size(DType::kFloat16), 2u);
  EXPECT_EQ(dtype_size(DType::kBFloat16), 2u);
  EXPECT_EQ(dtype_name(DType::kFloat16), "float16");
  EXPECT_EQ(dtype_name(DType::kBFloat16), "bfloat16");
  EXPECT_EQ(parse_dtype("float16"), DType::kFloat16);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::kBFloat16);
  EXPECT_EQ(to_dlpack(DType::kFloat16).code, kDLFloat);
  EXPECT_EQ(to_dlpack(DType::kFloat16).bits, 16);
  EXPECT_EQ(to_dlpack(DType::kBFloat16).code, kDLBfloat);
  EXPECT_EQ(to_dlpack(DType::kBFloat16).bits, 16);
  EXPECT_TRUE(dtype_is_float(DType::kFloat16));
  EXPECT_TRUE(dtype_is_float(DType::kBFloat16));
  EXPECT_FALSE(dtype_is_integer(DType::kFloat16));
  EXPECT_TRUE(dtype_is_integer(DType::kUInt16));
  EXPECT_FALSE(dtype_is_integer(DType::kBool));
  // Appended: the older types keep their values (a batch's hash includes them).
  EXPECT_EQ(static_cast<int>(DType::kBool), 10);
  EXPECT_EQ(static_cast<int>(DType::kFloat16), 11);
  try {
    parse_dtype("half", "cast.dtype");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("float16, bfloat16"), std::string::npos) << e.what();
  }
  EXPECT_EQ(dtype_of<Float16>(), DType::kFloat16);
  EXPECT_EQ(visit_dtype(DType::kBFloat16, []<class T>() { return sizeof(T); }), 2u);
}

TEST(Half, EveryFloat16WidensExactlyAndNarrowsBackToItself) {
  for (std::uint32_t h = 0; h <= 0xFFFF; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    const float f = float16_value(b);
    if (half_is_nan(b)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      ASSERT_EQ(float16_bits(f), b | 0x200u) << std::hex << h;  // quieted, payload kept
      continue;
    }
    ASSERT_EQ(float16_bits(f), b) << std::hex << h;
    ASSERT_EQ(float16_bits(static_cast<double>(f)), b) << std::hex << h;
  }
  EXPECT_EQ(float16_value(0x3C00), 1.0f);
  EXPECT_EQ(float16_value(0x7BFF), 65504.0f);
  EXPECT_EQ(float16_value(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(float16_value(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(float16_value(0xFC00), -std::numeric_limits<float>::infinity());
}

TEST(Half, EveryTieRoundsToEvenAndEverythingElseToTheNearest) {
  // Between consecutive non-negative halves a < b (the last pair: 65504 and 65536, where
  // rounding up gives inf): the midpoint goes to the one with an even mantissa, a float just
  // below it to a, just above it to b. Midpoints are exact in float.
  for (std::uint16_t a = 0; a < 0x7C00; ++a) {
    const auto b = static_cast<std::uint16_t>(a + 1);
    const float lo = float16_value(a);
    const float hi = b == 0x7C00 ? 65536.0f : float16_value(b);
    const float mid = (lo + hi) / 2;
    ASSERT_EQ(float16_bits(mid), (a & 1) == 0 ? a : b) << std::hex << a;
    ASSERT_EQ(float16_bits(std::nextafter(mid, 0.0f)), a) << std::hex << a;
    ASSERT_EQ(float16_bits(std::nextafter(mid, 1e9f)), b) << std::hex << a;
    ASSERT_EQ(float16_bits(-mid), ((a & 1) == 0 ? a : b) | 0x8000u) << std::hex << a;
  }
  EXPECT_EQ(float16_bits(65519.996f), 0x7BFF);
  EXPECT_EQ(float16_bits(65520.0f), 0x7C00);  // overflow: inf
  EXPECT_EQ(float16_bits(1e30), 0x7C00);
  EXPECT_EQ(float16_bits(-1e30f), 0xFC00);
  EXPECT_EQ(float16_bits(std::ldexp(1.0, -25)), 0x0000);  // half the smallest subnormal: even
  EXPECT_EQ(float16_bits(std::nextafter(std::ldexp(1.0, -25), 1.0)), 0x0001);
  EXPECT_EQ(float16_bits(std::ldexp(3.0, -26)), 0x0001);  // 0.75 units: 1
  EXPECT_EQ(float16_bits(std::ldexp(3.0, -25)), 0x0002);  // 1.5 units: even 2
  EXPECT_EQ(float16_bits(-0.0f), 0x8000);
  EXPECT_EQ(float16_bits(std::numeric_limits<double>::denorm_min()), 0x0000);
}

TEST(Half, ADoubleRoundsOnceNotThroughFloat) {
  // 1 + 2^-11 + 2^-40: just above the tie between 1 and 1 + 2^-10. Through float the 2^-40 is
  // lost and the tie goes to even (1.0); rounded once it is 1 + 2^-10.
  const double x = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  EXPECT_EQ(float16_bits(static_cast<float>(x)), 0x3C00);
  EXPECT_EQ(float16_bits(x), 0x3C01);
  EXPECT_EQ(Float16(x).bits, 0x3C01);
  EXPECT_EQ(bfloat16_bits(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40)), 0x3F81);
}

TEST(Half, NaNStaysNaNWithSignAndPayloadQuieted) {
  EXPECT_EQ(float16_bits(f32(0x7FC00000u)), 0x7E00);
  EXPECT_EQ(float16_bits(f32(0xFFC00000u)), 0xFE00);
  EXPECT_EQ(float16_bits(f32(0x7FA00000u)), 0x7F00);  // signalling: quieted, top payload kept
  EXPECT_EQ(float16_bits(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(bits32(float16_value(0x7C01)), 0x7FC02000u);
  EXPECT_EQ(bfloat16_bits(f32(0x7FC00000u)), 0x7FC0);
  EXPECT_EQ(bfloat16_bits(f32(0xFF800001u)), 0xFFC0);  // a payload below bfloat16's: still NaN
}

TEST(Half, BFloat16IsTheTopHalfOfAFloatRoundedToEven) {
  // The reference: torch's round_to_nearest_even, (bits + 0x7FFF + lsb) >> 16, for non-NaN.
  std::mt19937_64 rng(7);
  for (int i = 0; i < 1'000'000; ++i) {
    const auto u = static_cast<std::uint32_t>(rng());
    const float f = f32(u);
    if (std::isnan(f)) continue;
    const auto want = static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    ASSERT_EQ(bfloat16_bits(f), want) << std::hex << u;
  }
  for (std::uint32_t h = 0; h <= 0xFFFF; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    const float f = bfloat16_value(b);
    if (std::isnan(f)) continue;
    ASSERT_EQ(bits32(f), h << 16);
    ASSERT_EQ(bfloat16_bits(f), b);
  }
  EXPECT_EQ(BFloat16(1).bits, 0x3F80);
  EXPECT_EQ(static_cast<float>(BFloat16::from_bits(0xC000)), -2.0f);
}

/// Floats that probe every rounding path: a strided sweep of all 2^32 bit patterns, random
/// ones, and the neighbourhoods of the half boundaries.
std::vector<float> probe_floats() {
  std::vector<float> v;
  for (std::uint64_t u = 0; u <= 0xFFFFFFFFull; u += 4093)
    v.push_back(f32(static_cast<std::uint32_t>(u)));
  std::mt19937 rng(11);
  for (int i = 0; i < 500'000; ++i) v.push_back(f32(rng()));
  for (std::uint32_t edge : {0x33000000u, 0x33800000u, 0x387FC000u, 0x38800000u, 0x477FE000u,
                             0x477FF000u, 0x7F800000u, 0x3F802000u, 0x3F801000u})
    for (std::uint32_t d = 0; d < 4096; ++d) {
      v.push_back(f32(edge + d - 2048));
      v.push_back(f32((edge + d - 2048) | 0x80000000u));
    }
  return v;
}

TEST(Half, F16CAndThePortablePathGiveTheSameBits) {
  const std::vector<float> in = probe_floats();
  std::vector<std::uint16_t> portable(in.size()), hw(in.size());
  float_to_float16(in.data(), portable.data(), in.size(), HalfPath::kPortable);
  for (std::size_t i = 0; i < in.size(); i += 997)  // the bulk path is the scalar one
    ASSERT_EQ(portable[i], float16_bits(in[i]));
  std::vector<std::uint16_t> all(65536);
  for (std::uint32_t h = 0; h <= 0xFFFF; ++h) all[h] = static_cast<std::uint16_t>(h);
  std::vector<float> wide_portable(all.size()), wide_hw(all.size());
  float16_to_float(all.data(), wide_portable.data(), all.size(), HalfPath::kPortable);
  if (!cpu_has_f16c()) {
    EXPECT_THROW(float_to_float16(in.data(), hw.data(), 1, HalfPath::kF16C), std::runtime_error);
    GTEST_SKIP() << "this CPU has no F16C: the portable path alone is checked";
  }
  float_to_float16(in.data(), hw.data(), in.size(), HalfPath::kF16C);
  for (std::size_t i = 0; i < in.size(); ++i)
    ASSERT_EQ(portable[i], hw[i]) << "float bits " << std::hex << bits32(in[i]);
  // Lengths that leave every tail size (the 8-wide loop's remainder).
  for (std::size_t n = 0; n < 20; ++n) {
    std::vector<std::uint16_t> a(n), b(n);
    float_to_float16(in.data() + 1000, a.data(), n, HalfPath::kPortable);
    float_to_float16(in.data() + 1000, b.data(), n, HalfPath::kF16C);
    ASSERT_EQ(a, b) << n;
  }
  float16_to_float(all.data(), wide_hw.data(), all.size(), HalfPath::kF16C);
  for (std::size_t h = 0; h < all.size(); ++h)
    ASSERT_EQ(bits32(wide_portable[h]), bits32(wide_hw[h])) << std::hex << h;
}

TEST(Half, CollateStacksHalvesIntoTheirDType) {
  std::vector<Float16> v{Float16(1.5), Float16(-2), Float16(65504.0)};
  Tensor t = Collate<Float16>::collate(std::move(v));
  EXPECT_EQ(t.dtype(), DType::kFloat16);
  EXPECT_EQ(t.shape(), (Shape{3}));
  EXPECT_EQ(t.values<Float16>()[1].bits, 0xC000);
  Tensor b = Collate<std::array<BFloat16, 2>>::collate({{BFloat16(1), BFloat16(0.5)}});
  EXPECT_EQ(b.dtype(), DType::kBFloat16);
  EXPECT_EQ(b.shape(), (Shape{1, 2}));
  EXPECT_EQ(static_cast<float>(b.values<BFloat16>()[1]), 0.5f);
}

}  // namespace
}  // namespace flowstate
