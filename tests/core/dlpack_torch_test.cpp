// Tensor::to_dlpack() read by LibTorch's at::fromDLPack, the consumer the export is for: a view
// that does not start at its buffer's beginning must arrive with its own bytes (PyTorch 1.13
// ignores DLPack's byte_offset), without a copy, and keep its buffer alive.
#include <ATen/DLConvertor.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "flowstate/core/buffer.h"
#include "flowstate/core/half.h"
#include "flowstate/core/tensor.h"

namespace flowstate {
namespace {

TEST(TensorDLPack, LibTorchReadsAViewsOwnBytesWithoutACopy) {
  auto buffer = Buffer::allocate(64);
  auto* bytes = static_cast<std::uint8_t*>(buffer->data());
  for (int i = 0; i < 64; ++i) bytes[i] = static_cast<std::uint8_t>(i);
  Tensor view(buffer, 40, DType::kUInt8, Shape{2, 3});  // bytes 40..45

  at::Tensor t = at::fromDLPack(view.to_dlpack());
  ASSERT_EQ(t.dim(), 2);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(1), 3);
  EXPECT_EQ(t.scalar_type(), at::kByte);
  EXPECT_EQ(t.data_ptr(), view.data()) << "shared, not copied";
  EXPECT_EQ(t[0][0].item<std::uint8_t>(), 40);
  EXPECT_EQ(t[1][2].item<std::uint8_t>(), 45);
}

TEST(TensorDLPack, LibTorchKeepsTheBufferAliveAfterFlowstateDropsIt) {
  std::weak_ptr<Buffer> alive;
  at::Tensor t;
  {
    Tensor f(DType::kFloat32, Shape{4});
    auto v = f.values<float>();
    for (int i = 0; i < 4; ++i) v[static_cast<std::size_t>(i)] = 0.5f * static_cast<float>(i);
    alive = f.buffer();
    t = at::fromDLPack(Tensor(f.buffer(), 4, DType::kFloat32, Shape{3}).to_dlpack());
  }
  EXPECT_FALSE(alive.expired());
  EXPECT_EQ(t[0].item<float>(), 0.5f);
  EXPECT_EQ(t[2].item<float>(), 1.5f);
  t = at::Tensor();
  EXPECT_TRUE(alive.expired()) << "the last torch tensor released the buffer";
}

TEST(TensorDLPack, Float16AndBFloat16ArriveAsTorchsHalfAndBFloat16) {
  Tensor h(DType::kFloat16, Shape{2, 2});
  const float values[4] = {1.5f, -2.0f, 65504.0f, std::ldexp(1.0f, -24)};
  for (int i = 0; i < 4; ++i) h.values<Float16>()[static_cast<std::size_t>(i)] = Float16(values[i]);
  at::Tensor t = at::fromDLPack(h.to_dlpack());
  EXPECT_EQ(t.scalar_type(), at::kHalf);
  EXPECT_EQ(t.data_ptr(), h.data());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(t.flatten()[i].item<float>(), values[i]);

  Tensor b(DType::kBFloat16, Shape{3});
  for (int i = 0; i < 3; ++i)
    b.values<BFloat16>()[static_cast<std::size_t>(i)] = BFloat16(0.25 * (i + 1));
  at::Tensor u = at::fromDLPack(b.to_dlpack());
  EXPECT_EQ(u.scalar_type(), at::kBFloat16);
  EXPECT_EQ(u[2].item<float>(), 0.75f);
}

TEST(TensorDLPack, OurRoundingIsTorchsForAMillionRandomFloats) {
  // c10::Half(float) and c10::BFloat16(float) round to nearest even too; NaN payloads differ
  // (torch's bfloat16 NaN is 0x7FC0 whatever the input's), so NaNs are compared as NaNs.
  std::mt19937 rng(3);
  for (int i = 0; i < 1'000'000; ++i) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
    const std::uint16_t h = c10::Half(f).x;
    const std::uint16_t bf = c10::BFloat16(f).x;
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(float16_value(float16_bits(f))));
      ASSERT_TRUE(std::isnan(bfloat16_value(bfloat16_bits(f))));
      continue;
    }
    ASSERT_EQ(float16_bits(f), h) << f;
    ASSERT_EQ(bfloat16_bits(f), bf) << f;
  }
}

}  // namespace
}  // namespace flowstate
