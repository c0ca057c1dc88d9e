// Tensor::to_dlpack() read by LibTorch's at::fromDLPack, the consumer the export is for: a view
// that does not start at its buffer's beginning must arrive with its own bytes (PyTorch 1.13
// ignores DLPack's byte_offset), without a copy, and keep its buffer alive.
#include <ATen/DLConvertor.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <memory>

#include "flowstate/core/buffer.h"
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

}  // namespace
}  // namespace flowstate
