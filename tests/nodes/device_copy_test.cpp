// device_copy behaviour that holds in every build and on every machine: resolution of the
// `device` option, the exact error texts, and the host fallback. Tests that need a device are
// in tests/nodes/cuda (label `cuda`); the ones here that describe the no-device fallback skip
// when a device is present.
#include "flowstate/nodes/device_copy.h"
#include "flowstate/nodes/builtin.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kWithoutCuda[] =
    "' requested, but flowstate was built without CUDA (FLOWSTATE_WITH_CUDA=OFF or no toolkit)";

/// The ConfigError DeviceCopy throws for `device`; fails the test when it throws nothing.
ConfigError config_error(const std::string& device) {
  try {
    DeviceCopy copy({.device = device});
  } catch (const ConfigError& e) {
    return e;
  }
  ADD_FAILURE() << "DeviceCopy(" << device << ") did not throw";
  return ConfigError("", "");
}

/// A batch of two fields in `pool`'s memory with deterministic contents.
Batch make_batch(BufferPool& pool) {
  Batch b;
  auto bytes = pool.acquire(4 * 1000);
  for (std::size_t i = 0; i < bytes->size(); ++i)
    static_cast<std::uint8_t*>(bytes->data())[i] = static_cast<std::uint8_t>(i * 7 + 3);
  b.fields.set("data", Tensor(bytes, 0, DType::kUInt8, Shape{4, 1000}));
  auto floats = pool.acquire(4 * 3 * sizeof(float));
  for (std::size_t i = 0; i < 12; ++i) static_cast<float*>(floats->data())[i] = 0.5f * i;
  b.fields.set("label", Tensor(floats, 0, DType::kFloat32, Shape{4, 3}));
  b.info.step = 41;
  b.info.epoch = 2;
  b.info.num_samples = 4;
  return b;
}

Pipeline records_pipeline(const std::string& glob, std::optional<DeviceCopyOptions> copy) {
  Pipeline::Builder b;
  b.seed(99)
      .workers(2)
      .records({.paths = {glob}, .record_bytes = 48})
      .shuffle({.mode = ShuffleMode::kBuffer, .size = 64})
      .batch({.size = 32})
      .prefetch({.depth = 2});
  if (copy) b.device_copy(*copy);
  return b.build();
}

TEST(DeviceCopyOptions, DescribesDeviceAsFreeParameter) {
  NodeDescription d = device_copy_node().describe(DeviceCopyOptions{.device = "cuda:1"});
  EXPECT_EQ(d.type, "device_copy");
  ASSERT_EQ(d.params.size(), 1u);
  EXPECT_EQ(d.params[0].key, "device");
  EXPECT_EQ(d.params[0].value, "cuda:1");
  EXPECT_TRUE(d.params[0].free);
  EXPECT_EQ(device_copy_node().describe(DeviceCopyOptions{}).params[0].value, "auto");
}

TEST(DeviceCopy, DeviceCountIsZeroWithoutCuda) {
  if (!cuda_compiled()) {
    EXPECT_EQ(cuda_device_count(), 0);
  }
  EXPECT_GE(cuda_device_count(), 0);
}

TEST(DeviceCopy, CpuTargetReturnsTheBatchUnchanged) {
  DeviceCopy copy({.device = "cpu"});
  EXPECT_EQ(copy.target(), Device{});
  ASSERT_NE(copy.staging_pool(), nullptr);
  EXPECT_EQ(copy.staging_pool()->device(), Device{});
  Batch in = make_batch(*copy.staging_pool());
  const void* data = in["data"].data();
  const std::uint64_t digest = in.digest();
  Batch out = copy.copy(in);
  EXPECT_EQ(out["data"].data(), data);  // no copy at all
  EXPECT_EQ(out.digest(), digest);
  EXPECT_EQ(out.fence, nullptr);
  EXPECT_EQ(out.info.step, 41u);
  EXPECT_EQ(out.info.epoch, 2u);
}

TEST(DeviceCopy, AutoWithoutDeviceUsesHostMemory) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present (see DeviceCopyCuda)";
  DeviceCopy copy({});
  EXPECT_EQ(copy.target(), Device{});
  EXPECT_EQ(copy.staging_pool()->device().kind, MemoryKind::kHost);
  Batch in = make_batch(*copy.staging_pool());
  const std::uint64_t digest = in.digest();
  Batch out = copy.copy(in);
  EXPECT_EQ(out.fence, nullptr);
  EXPECT_EQ(out.digest(), digest);
  for (const auto& [id, t] : out.fields) EXPECT_EQ(t.device().kind, MemoryKind::kHost);
  std::vector<std::uint8_t> expect(4000);
  for (std::size_t i = 0; i < expect.size(); ++i) expect[i] = static_cast<std::uint8_t>(i * 7 + 3);
  EXPECT_EQ(std::memcmp(out["data"].data(), expect.data(), expect.size()), 0);
}

TEST(DeviceCopy, CudaIndexWithoutDeviceIsConfigError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present (see DeviceCopyCuda)";
  for (const std::string device : {"cuda:0", "cuda:3"}) {
    ConfigError e = config_error(device);
    EXPECT_EQ(e.key(), "device_copy.device");
    if (!cuda_compiled()) {
      EXPECT_EQ(std::string(e.what()), "device '" + device + kWithoutCuda);
    } else {
      // The CUDA runtime's own reason follows (no driver, no device, ...).
      EXPECT_THAT(e.what(),
                  StartsWith("device '" + device + "' requested, but no CUDA device is "));
    }
  }
}

TEST(DeviceCopy, CudaBuildWithoutDeviceNamesTheCudaError) {
  if (!cuda_compiled()) GTEST_SKIP() << "built without CUDA";
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present (see DeviceCopyCuda)";
  ConfigError e = config_error("cuda:0");
  // Either cudaGetDeviceCount failed (no driver: its error string and name follow) or it
  // reported zero devices.
  const std::string what = e.what();
  if (what.find("usable") != std::string::npos) {
    EXPECT_THAT(what, HasSubstr("no CUDA device is usable: cudaGetDeviceCount failed: "));
    EXPECT_THAT(what, HasSubstr("(cudaError"));
  } else {
    EXPECT_EQ(what, "device 'cuda:0' requested, but no CUDA device is present");
  }
}

TEST(DeviceCopy, UnknownDeviceListsTheKnownForms) {
  for (const std::string device : {"gpu", "CPU", "cuda", "cuda:", "cuda:x", "cuda:-1", "cuda:1x",
                                   "cuda:+1", "cuda: 0", " auto", ""}) {
    ConfigError e = config_error(device);
    EXPECT_EQ(e.key(), "device_copy.device");
    EXPECT_EQ(std::string(e.what()), "unknown device '" + device + "' (known: auto, cpu, cuda:N)");
  }
}

TEST(DeviceCopy, AutoPipelineMatchesPipelineWithoutCopy) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present (see DeviceCopyCuda)";
  testing::TempDir dir;
  auto glob = testing::write_records(dir.str(), 300, 48, 3);
  Loader plain(records_pipeline(glob, std::nullopt), {.epochs = 2});
  Loader copied(records_pipeline(glob, DeviceCopyOptions{}), {.epochs = 2});
  std::vector<testing::BatchTrace> expect = testing::drain(plain);
  ASSERT_EQ(expect.size(), 2u * 10u);
  EXPECT_EQ(testing::drain(copied), expect);
}

TEST(DeviceCopy, CpuPipelineMatchesPipelineWithoutCopy) {
  testing::TempDir dir;
  auto glob = testing::write_records(dir.str(), 300, 48, 3);
  Loader plain(records_pipeline(glob, std::nullopt));
  Loader copied(records_pipeline(glob, DeviceCopyOptions{.device = "cpu"}));
  std::vector<testing::BatchTrace> expect = testing::drain(plain);
  ASSERT_EQ(expect.size(), 10u);
  EXPECT_EQ(testing::drain(copied), expect);
}

TEST(DeviceCopy, StreamHandoverOfHostBatchesIsAPlainNext) {
  testing::TempDir dir;
  auto glob = testing::write_records(dir.str(), 300, 48, 3);
  Loader plain(records_pipeline(glob, std::nullopt));
  Loader copied(records_pipeline(glob, DeviceCopyOptions{.device = "cpu"}));
  std::vector<testing::BatchTrace> expect = testing::drain(plain);
  int asked = 0;
  const Loader::StreamFor stream_for = [&](const Device&) {
    ++asked;
    return CudaStream{nullptr};
  };
  std::vector<testing::BatchTrace> got;
  while (auto b = copied.next(stream_for)) {
    EXPECT_EQ(b->fence, nullptr);
    b->wait();  // nothing to wait for
    b->wait(CudaStream{nullptr});
    got.push_back(testing::trace(*b));
  }
  EXPECT_EQ(got, expect);
  EXPECT_EQ(asked, 0);  // only a batch on a device asks for its consumer's stream
}

TEST(DeviceCopy, DeviceIsFreeInTheFingerprint) {
  testing::TempDir dir;
  auto glob = testing::write_records(dir.str(), 64, 48, 1);
  EXPECT_EQ(records_pipeline(glob, DeviceCopyOptions{.device = "cpu"}).fingerprint(),
            records_pipeline(glob, DeviceCopyOptions{.device = "cuda:3"}).fingerprint());
}

TEST(DeviceCopy, LoaderWithUnusableDeviceFailsWithConfigError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present (see DeviceCopyCuda)";
  testing::TempDir dir;
  auto glob = testing::write_records(dir.str(), 64, 48, 1);
  Pipeline p = records_pipeline(glob, DeviceCopyOptions{.device = "cuda:0"});
  try {
    Loader loader(p);
    loader.next();
    FAIL() << "a Loader copying to cuda:0 ran without a device";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "device_copy.device");
    EXPECT_THAT(e.what(), HasSubstr("device 'cuda:0' requested, but "));
  }
}

}  // namespace
}  // namespace flowstate
