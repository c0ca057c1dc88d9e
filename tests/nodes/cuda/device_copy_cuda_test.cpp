// device_copy on a CUDA device. Built twice (tests/nodes/cuda/CMakeLists.txt):
// - nodes_cuda_tests (label `cuda`, suite DeviceCopyCuda) against the real runtime; every test
//   skips when no device is present;
// - nodes_cuda_fake_tests (label `nodes`, suite DeviceCopyFakeCuda) against fake_cudart.cpp,
//   which runs the CUDA code path everywhere, checks API use strictly, injects errors and
//   counts leaks (the tests under FLOWSTATE_FAKE_CUDART).
// The no-device behaviour is tested in tests/nodes/device_copy_test.cpp.
// Over 600 lines: one node's device path, every case of it, shared by the two builds above.
#include <cuda_runtime_api.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"
#include "flowstate/nodes/device_copy.h"
#include "flowstate/nodes/sources/iterable.h"
#include "tests/support/testing.h"

#ifdef FLOWSTATE_FAKE_CUDART
// Controls of fake_cudart.cpp.
extern "C" void fake_cuda_fail_next(const char* api, cudaError_t error, int after);
extern "C" void fake_cuda_live(int* device_blocks, int* pinned_blocks, int* streams, int* events);
struct FakeCudaCall {
  const char* api;
  void* stream;
  void* event;
};
extern "C" void fake_cuda_calls(const FakeCudaCall** calls, int* n);
extern "C" void fake_cuda_clear_calls(void);
#define FLOWSTATE_CUDA_SUITE DeviceCopyFakeCuda
#else
#define FLOWSTATE_CUDA_SUITE DeviceCopyCuda
#endif

namespace flowstate {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

#define FLOWSTATE_REQUIRE_DEVICE()                                  \
  do {                                                              \
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (false)

void cuda_ok(cudaError_t err, const char* call) {
  ASSERT_EQ(err, cudaSuccess) << call << ": " << cudaGetErrorString(err);
}

/// The bytes of `t`, read back with a synchronous cudaMemcpy when it is in device memory.
std::vector<std::byte> bytes_of(const Tensor& t) {
  std::vector<std::byte> out(t.nbytes());
  if (out.empty()) return out;
  if (t.device().kind == MemoryKind::kDevice) {
    cuda_ok(cudaMemcpy(out.data(), t.data(), out.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
  } else {
    std::memcpy(out.data(), t.data(), out.size());
  }
  return out;
}

/// `b` with every field copied to host memory, so it can be digested.
Batch to_host(const Batch& b) {
  Batch h;
  h.info = b.info;
  h.stamp = b.stamp;
  for (const auto& [id, t] : b.fields) {
    Tensor c(t.dtype(), t.shape());
    std::vector<std::byte> bytes = bytes_of(t);
    if (!bytes.empty()) std::memcpy(c.data(), bytes.data(), bytes.size());
    h.fields.set(id, c);
  }
  return h;
}

cudaMemoryType memory_type(const void* p) {
  cudaPointerAttributes attr{};
  cudaError_t err = cudaPointerGetAttributes(&attr, p);
  EXPECT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
  return attr.type;
}

/// A one-field uint8 batch of `n` bytes from `pool`, every byte derived from `seed`.
Batch pattern_batch(BufferPool& pool, std::size_t n, std::uint32_t seed) {
  auto buf = pool.acquire(n);
  auto* p = static_cast<std::uint8_t*>(buf->data());
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::uint8_t>(seed * 131 + i * 7);
  Batch b;
  b.fields.set("data", Tensor(buf, 0, DType::kUInt8, Shape{static_cast<std::int64_t>(n)}));
  b.info.step = seed;
  return b;
}

bool has_pattern(const Tensor& t, std::uint32_t seed) {
  std::vector<std::byte> bytes = bytes_of(t);
  for (std::size_t i = 0; i < bytes.size(); ++i)
    if (bytes[i] != static_cast<std::byte>(seed * 131 + i * 7)) return false;
  return true;
}

TEST(FLOWSTATE_CUDA_SUITE, AutoPicksTheFirstDevice) {
  FLOWSTATE_REQUIRE_DEVICE();
  DeviceCopy copy({});
  EXPECT_EQ(copy.target(), (Device{MemoryKind::kDevice, 0}));
  EXPECT_EQ(copy.staging_pool()->device().kind, MemoryKind::kPinned);
}

/// Sets an environment variable for the scope, restoring what was there.
class EnvVar {
 public:
  EnvVar(const char* name, const std::string& value) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v;
    ::setenv(name, value.c_str(), 1);
  }
  ~EnvVar() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(FLOWSTATE_CUDA_SUITE, AutoPicksTheLaunchersLocalRank) {
  // Ranks of one node under torchrun (LOCAL_RANK), mpirun (OMPI_COMM_WORLD_LOCAL_RANK) or
  // srun (SLURM_LOCALID) each take their own device.
  FLOWSTATE_REQUIRE_DEVICE();
  const int n = cuda_device_count();
  for (const char* var : {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    SCOPED_TRACE(var);
    EnvVar local(var, std::to_string(n - 1));
    DeviceCopy copy({});
    EXPECT_EQ(copy.target(), (Device{MemoryKind::kDevice, n - 1}));
    EnvVar beyond(var, std::to_string(n));
    try {
      DeviceCopy too_many({});
      FAIL() << "local rank " << n << " was given a device";
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.key(), "device_copy.device");
      EXPECT_THAT(e.what(), HasSubstr("device auto picks cuda:" + std::to_string(n) +
                                      " for local rank " + std::to_string(n)));
    }
  }
}

TEST(FLOWSTATE_CUDA_SUITE, CpuStaysOnTheHostWithADevicePresent) {
  FLOWSTATE_REQUIRE_DEVICE();
  DeviceCopy copy({.device = "cpu"});
  EXPECT_EQ(copy.target(), Device{});
  Batch in = pattern_batch(*copy.staging_pool(), 1000, 1);
  Batch out = copy.copy(in);
  EXPECT_EQ(out.fence, nullptr);
  EXPECT_EQ(out["data"].data(), in["data"].data());
}

TEST(FLOWSTATE_CUDA_SUITE, OutOfRangeIndexIsConfigError) {
  FLOWSTATE_REQUIRE_DEVICE();
  const std::string device = "cuda:" + std::to_string(cuda_device_count());
  try {
    DeviceCopy copy({.device = device});
    FAIL() << device << " was accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "device_copy.device");
    EXPECT_THAT(e.what(), StartsWith("device '" + device + "' requested, but only " +
                                     std::to_string(cuda_device_count()) + " CUDA device"));
    EXPECT_THAT(e.what(), HasSubstr(cudaGetErrorString(cudaErrorInvalidDevice)));
  }
}

TEST(FLOWSTATE_CUDA_SUITE, StagingPoolIsPinnedHostMemory) {
  FLOWSTATE_REQUIRE_DEVICE();
  DeviceCopy copy({.device = "cuda:0"});
  auto buf = copy.staging_pool()->acquire(4096);
  EXPECT_EQ(buf->device().kind, MemoryKind::kPinned);
  EXPECT_EQ(memory_type(buf->data()), cudaMemoryTypeHost);
}

TEST(FLOWSTATE_CUDA_SUITE, BatchLandsInDeviceMemoryWithIdenticalBytes) {
  FLOWSTATE_REQUIRE_DEVICE();
  DeviceCopy copy({.device = "cuda:0"});
  // Two fields viewing one pinned buffer at different offsets, and one in pageable memory.
  auto shared = copy.staging_pool()->acquire(4096 + 12 * sizeof(float));
  auto* raw = static_cast<std::uint8_t*>(shared->data());
  for (std::size_t i = 0; i < 4096; ++i) raw[i] = static_cast<std::uint8_t>(i * 13 + 5);
  auto* floats = reinterpret_cast<float*>(raw + 4096);
  for (int i = 0; i < 12; ++i) floats[i] = 0.25f * i - 1.0f;
  Batch in;
  in.fields.set("tokens", Tensor(shared, 0, DType::kUInt16, Shape{4, 512}));
  in.fields.set("weights", Tensor(shared, 4096, DType::kFloat32, Shape{4, 3}));
  Tensor pageable(DType::kInt64, Shape{4});
  for (std::int64_t i = 0; i < 4; ++i) pageable.values<std::int64_t>()[i] = i * 1000 - 7;
  in.fields.set("ids", pageable);
  in.info.step = 17;
  in.info.epoch = 3;
  in.info.is_last_in_epoch = true;
  const std::uint64_t digest = in.digest();

  Batch out = copy.copy(in);
  ASSERT_NE(out.fence, nullptr);
  out.fence->wait();
  ASSERT_EQ(out.fields.size(), 3u);
  for (const auto& [id, t] : out.fields) {
    EXPECT_EQ(t.device(), (Device{MemoryKind::kDevice, 0})) << field_name(id);
    EXPECT_EQ(memory_type(t.data()), cudaMemoryTypeDevice) << field_name(id);
    EXPECT_EQ(bytes_of(t), bytes_of(*in.fields.find(id))) << field_name(id);
    EXPECT_EQ(t.dtype(), in.fields.at(id).dtype());
    EXPECT_EQ(t.shape(), in.fields.at(id).shape());
  }
  EXPECT_THROW(out.digest(), std::invalid_argument);  // device memory cannot be digested
  EXPECT_EQ(to_host(out).digest(), digest);
  EXPECT_EQ(out.info.step, 17u);
  EXPECT_EQ(out.info.epoch, 3u);
  EXPECT_TRUE(out.info.is_last_in_epoch);
}

TEST(FLOWSTATE_CUDA_SUITE, EmptyFieldBecomesEmptyDeviceTensor) {
  FLOWSTATE_REQUIRE_DEVICE();
  DeviceCopy copy({.device = "cuda:0"});
  Batch in;
  in.fields.set("empty", Tensor(DType::kFloat32, Shape{0, 4}));
  Batch out = copy.copy(in);
  if (out.fence) out.fence->wait();
  EXPECT_EQ(out["empty"].device().kind, MemoryKind::kDevice);
  EXPECT_EQ(out["empty"].shape(), (Shape{0, 4}));
  EXPECT_EQ(out["empty"].nbytes(), 0u);
}

TEST(FLOWSTATE_CUDA_SUITE, RecyclesDeviceAndStagingBuffers) {
  FLOWSTATE_REQUIRE_DEVICE();
  DeviceCopy copy({.device = "cuda:0"});
  std::set<const void*> device_blocks;
  for (std::uint32_t i = 0; i < 200; ++i) {
    Batch out = copy.copy(pattern_batch(*copy.staging_pool(), 64 * 1024, i));
    ASSERT_NE(out.fence, nullptr);
    out.fence->wait();
    device_blocks.insert(out["data"].data());
    ASSERT_TRUE(has_pattern(out["data"], i)) << "batch " << i;
  }
  // One batch in flight at a time: each block comes back before the next batch needs one.
  EXPECT_LE(device_blocks.size(), 2u);
  EXPECT_LE(copy.staging_pool()->allocated(), 2u);
}

TEST(FLOWSTATE_CUDA_SUITE, FenceHoldsTheStagingBufferUntilTheCopyIsComplete) {
  FLOWSTATE_REQUIRE_DEVICE();
  DeviceCopy copy({.device = "cuda:0"});
  auto& pool = *copy.staging_pool();
  constexpr std::size_t kBytes = 8 << 20;
  Batch out = copy.copy(pattern_batch(pool, kBytes, 5));
  ASSERT_NE(out.fence, nullptr);
  EXPECT_EQ(pool.allocated(), 1u);
  // The input batch is gone, but its staging block is still owned by the fence.
  { auto other = pool.acquire(kBytes); }
  EXPECT_EQ(pool.allocated(), 2u);
  out.fence->wait();
  out.fence->wait();  // waiting again is harmless
  // Now both blocks are free: acquiring two allocates nothing new.
  {
    auto a = pool.acquire(kBytes);
    auto b = pool.acquire(kBytes);
  }
  EXPECT_EQ(pool.allocated(), 2u);
  EXPECT_TRUE(has_pattern(out["data"], 5));
}

TEST(FLOWSTATE_CUDA_SUITE, ManyBatchesInFlightKeepTheirOwnBytes) {
  FLOWSTATE_REQUIRE_DEVICE();
  DeviceCopy copy({.device = "cuda:0"});
  std::deque<Batch> in_flight;
  std::uint32_t checked = 0;
  for (std::uint32_t i = 0; i < 64; ++i) {
    in_flight.push_back(copy.copy(pattern_batch(*copy.staging_pool(), 256 * 1024 + i, i)));
    if (in_flight.size() == 8 || i == 63) {
      while (!in_flight.empty()) {
        Batch& b = in_flight.front();
        b.fence->wait();
        EXPECT_TRUE(has_pattern(b["data"], static_cast<std::uint32_t>(b.info.step)))
            << "batch " << b.info.step;
        in_flight.pop_front();
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 64u);
}

TEST(FLOWSTATE_CUDA_SUITE, DroppingABatchWithoutWaitingIsSafe) {
  FLOWSTATE_REQUIRE_DEVICE();
  DeviceCopy copy({.device = "cuda:0"});
  for (std::uint32_t i = 0; i < 32; ++i) copy.copy(pattern_batch(*copy.staging_pool(), 1 << 20, i));
  Batch out = copy.copy(pattern_batch(*copy.staging_pool(), 1 << 20, 99));
  out.fence->wait();
  EXPECT_TRUE(has_pattern(out["data"], 99));
}

TEST(FLOWSTATE_CUDA_SUITE, BatchOutlivesTheNode) {
  FLOWSTATE_REQUIRE_DEVICE();
  Batch out;
  {
    DeviceCopy copy({.device = "cuda:0"});
    out = copy.copy(pattern_batch(*copy.staging_pool(), 1 << 20, 3));
  }
  ASSERT_NE(out.fence, nullptr);
  out.fence->wait();
  EXPECT_TRUE(has_pattern(out["data"], 3));
}

/// Records shuffled and batched by 32, copied to cuda:0 when `copy`: the pipeline whose
/// device run is compared with its host run.
Pipeline shuffled_records(const std::string& glob, bool copy) {
  Pipeline::Builder b;
  b.seed(5)
      .records({.paths = {glob}, .record_bytes = 64})
      .shuffle({.mode = ShuffleMode::kBuffer, .size = 100})
      .batch({.size = 32})
      .prefetch({.depth = 3});
  if (copy) b.device_copy({.device = "cuda:0"});
  return b.build();
}

TEST(FLOWSTATE_CUDA_SUITE, LoaderDeliversDeviceBatchesMatchingAHostRun) {
  FLOWSTATE_REQUIRE_DEVICE();
  testing::TempDir dir;
  auto glob = testing::write_records(dir.str(), 500, 64, 4);
  auto make = [&](bool copy) { return shuffled_records(glob, copy); };
  Loader host(make(false), {.epochs = 2});
  std::vector<testing::BatchTrace> expect = testing::drain(host);
  ASSERT_EQ(expect.size(), 2u * 16u);

  Loader device(make(true), {.epochs = 2});
  std::vector<testing::BatchTrace> got;
  while (auto b = device.next()) {
    EXPECT_EQ(b->fence, nullptr);  // the Loader waited on it
    for (const auto& [id, t] : b->fields) EXPECT_EQ(t.device().kind, MemoryKind::kDevice);
    got.push_back(testing::trace(to_host(*b)));
  }
  EXPECT_EQ(got, expect);
}

TEST(FLOWSTATE_CUDA_SUITE, CopiesToTheRequestedDeviceAndKeepsTheCallersDevice) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  cuda_ok(cudaSetDevice(0), "cudaSetDevice");
  {
    DeviceCopy copy({.device = "cuda:1"});
    EXPECT_EQ(copy.target(), (Device{MemoryKind::kDevice, 1}));
    Batch out = copy.copy(pattern_batch(*copy.staging_pool(), 4096, 8));
    out.fence->wait();
    EXPECT_EQ(out["data"].device(), (Device{MemoryKind::kDevice, 1}));
    cudaPointerAttributes attr{};
    cuda_ok(cudaPointerGetAttributes(&attr, out["data"].data()), "cudaPointerGetAttributes");
    EXPECT_EQ(attr.device, 1);
    EXPECT_TRUE(has_pattern(out["data"], 8));
  }
  int current = -1;
  cuda_ok(cudaGetDevice(&current), "cudaGetDevice");
  EXPECT_EQ(current, 0);
}

/// A pageable host tensor of `n` bytes with the pattern of `seed`.
Tensor pattern_tensor(std::size_t n, std::uint32_t seed) {
  Tensor t(DType::kUInt8, Shape{static_cast<std::int64_t>(n)});
  auto* p = static_cast<std::uint8_t*>(t.data());
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::uint8_t>(seed * 131 + i * 7);
  return t;
}

/// `b` with a user value of one Tensor, moved by ToDevice<Tensor> as from_range sets it up.
void set_user_tensor(Batch& b, Tensor t) {
  b.user = UserValue::make(std::move(t));
  b.user_to_device = [](UserValue& v, DeviceCopy& copy) {
    ToDevice<Tensor>::to_device(v.get<Tensor>(), copy);
  };
}

TEST(FLOWSTATE_CUDA_SUITE, UserTensorJoinsTheBatchFence) {
  FLOWSTATE_REQUIRE_DEVICE();
  DeviceCopy copy({.device = "cuda:0"});
  Batch out;
  {
    Batch in = pattern_batch(*copy.staging_pool(), 4096, 1);
    set_user_tensor(in, pattern_tensor(3000, 2));
    out = copy.copy(std::move(in));
  }  // the pageable user tensor now lives only in the fence
  ASSERT_NE(out.fence, nullptr);
  out.fence->wait();
  const Tensor& user = out.user.get<Tensor>();
  EXPECT_EQ(user.device(), (Device{MemoryKind::kDevice, 0}));
  EXPECT_EQ(user.shape(), (Shape{3000}));
  EXPECT_TRUE(has_pattern(user, 2));
  EXPECT_TRUE(has_pattern(out["data"], 1));
}

TEST(FLOWSTATE_CUDA_SUITE, BatchOfOnlyAUserValueGetsAFence) {
  FLOWSTATE_REQUIRE_DEVICE();
  DeviceCopy copy({.device = "cuda:0"});
  Batch in;
  set_user_tensor(in, pattern_tensor(100, 9));
  Batch out = copy.copy(std::move(in));
  ASSERT_NE(out.fence, nullptr);
  out.fence->wait();
  EXPECT_EQ(out.user.get<Tensor>().device().kind, MemoryKind::kDevice);
  EXPECT_TRUE(has_pattern(out.user.get<Tensor>(), 9));
}

TEST(FLOWSTATE_CUDA_SUITE, ToDeviceOutsideCopyIsCompleteWhenItReturns) {
  FLOWSTATE_REQUIRE_DEVICE();
  DeviceCopy copy({.device = "cuda:0"});
  Tensor out = copy.to_device(pattern_tensor(5000, 4));  // the source is gone right after
  EXPECT_EQ(out.device(), (Device{MemoryKind::kDevice, 0}));
  EXPECT_TRUE(has_pattern(out, 4));
  EXPECT_EQ(copy.to_device(out).data(), out.data());  // already there: unchanged
}

TEST(FLOWSTATE_CUDA_SUITE, ToDeviceOnAHostTargetReturnsTheTensor) {
  FLOWSTATE_REQUIRE_DEVICE();
  DeviceCopy copy({.device = "cpu"});
  Tensor t = pattern_tensor(10, 1);
  EXPECT_EQ(copy.to_device(t).data(), t.data());
  Batch in;
  set_user_tensor(in, t);
  Batch out = copy.copy(std::move(in));
  EXPECT_EQ(out.fence, nullptr);
  EXPECT_EQ(out.user.get<Tensor>().data(), t.data());
}

TEST(FLOWSTATE_CUDA_SUITE, LoaderMovesFromRangeBatchesToTheDevice) {
  FLOWSTATE_REQUIRE_DEVICE();
  std::vector<std::int32_t> values(10);
  for (int i = 0; i < 10; ++i) values[i] = i * 3;
  Loader loader(Pipeline::Builder()
                    .source(from_range(values, {.name = "ints"}))
                    .batch({.size = 4})
                    .device_copy({.device = "cuda:0"})
                    .build());
  std::vector<std::int32_t> got;
  while (auto b = loader.next()) {
    EXPECT_EQ(b->fence, nullptr);  // the Loader waited on it
    const Tensor& t = batch_value<std::int32_t>(*b);
    EXPECT_EQ(t.device().kind, MemoryKind::kDevice);
    std::vector<std::byte> bytes = bytes_of(t);
    std::vector<std::int32_t> v(bytes.size() / sizeof(std::int32_t));
    std::memcpy(v.data(), bytes.data(), bytes.size());
    got.insert(got.end(), v.begin(), v.end());
  }
  EXPECT_EQ(got, values);
}

/// A consumer's stream (non-blocking, as a trainer's side stream) and a device scratch buffer
/// its "kernel" — a device-to-device copy queued on it — writes. Declare it before the
/// batches it consumes: a stream must outlive the batches handed over to it.
class Consumer {
 public:
  explicit Consumer(std::size_t scratch_bytes) : n_(scratch_bytes) {
    cuda_ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_ok(cudaMalloc(&scratch_, n_), "cudaMalloc");
  }
  ~Consumer() {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
    (void)cudaFree(scratch_);
  }
  Consumer(const Consumer&) = delete;
  Consumer& operator=(const Consumer&) = delete;

  cudaStream_t stream() const { return stream_; }
  /// Queues a read of `t` (at most the scratch's size) on the stream, as a kernel would.
  void read(const Tensor& t) {
    ASSERT_LE(t.nbytes(), n_);
    cuda_ok(cudaMemcpyAsync(scratch_, t.data(), t.nbytes(), cudaMemcpyDefault, stream_),
            "cudaMemcpyAsync");
  }
  /// Waits on the host for the work queued on the stream.
  void finish() { cuda_ok(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }
  /// What the last read() saw: the first `n` scratch bytes, after the stream's work.
  std::vector<std::byte> seen(std::size_t n) {
    finish();
    std::vector<std::byte> out(n);
    cuda_ok(cudaMemcpy(out.data(), scratch_, n, cudaMemcpyDeviceToHost), "cudaMemcpy");
    return out;
  }

 private:
  std::size_t n_;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
};

bool is_pattern(const std::vector<std::byte>& bytes, std::uint32_t seed) {
  for (std::size_t i = 0; i < bytes.size(); ++i)
    if (bytes[i] != static_cast<std::byte>(seed * 131 + i * 7)) return false;
  return true;
}

TEST(FLOWSTATE_CUDA_SUITE, StreamWaitOrdersTheConsumersWorkAfterTheCopy) {
  FLOWSTATE_REQUIRE_DEVICE();
  constexpr std::size_t kBytes = 1 << 20;
  Consumer consumer(kBytes);
  DeviceCopy copy({.device = "cuda:0"});
  Batch out = copy.copy(pattern_batch(*copy.staging_pool(), kBytes, 7));
  ASSERT_NE(out.fence, nullptr);
  EXPECT_EQ(out.fence->device(), (Device{MemoryKind::kDevice, 0}));
  out.wait(consumer.stream());  // no host wait: the consumer's stream waits on the copy
  consumer.read(out["data"]);
  EXPECT_TRUE(is_pattern(consumer.seen(kBytes), 7));
}

TEST(FLOWSTATE_CUDA_SUITE, ReuseOfADeviceBufferWaitsForTheConsumersRelease) {
  FLOWSTATE_REQUIRE_DEVICE();
  constexpr std::size_t kBytes = 1 << 20;
  Consumer consumer(kBytes);
  DeviceCopy copy({.device = "cuda:0"});
  Batch first = copy.copy(pattern_batch(*copy.staging_pool(), kBytes, 1));
  first.wait(consumer.stream());
  const void* block = first["data"].data();
  consumer.read(first["data"]);  // queued; may run after the batch is dropped
  first = Batch{};               // dropped without any host wait
  // The next copy lands in the same pooled block, but only after the consumer's read.
  Batch second = copy.copy(pattern_batch(*copy.staging_pool(), kBytes, 2));
  EXPECT_EQ(second["data"].data(), block);
  second.wait();
  EXPECT_TRUE(is_pattern(consumer.seen(kBytes), 1));
  EXPECT_TRUE(has_pattern(second["data"], 2));
}

TEST(FLOWSTATE_CUDA_SUITE, LoaderHandsBatchesOverToTheConsumersStream) {
  FLOWSTATE_REQUIRE_DEVICE();
  testing::TempDir dir;
  auto glob = testing::write_records(dir.str(), 500, 64, 4);
  auto make = [&](bool copy) { return shuffled_records(glob, copy); };
  Loader host(make(false), {.epochs = 2});
  std::vector<testing::BatchTrace> expect = testing::drain(host);
  ASSERT_EQ(expect.size(), 2u * 16u);

  Consumer consumer(32 * 64);
  std::vector<testing::BatchTrace> got;
  {
    Loader device(make(true), {.epochs = 2});
    while (auto b = device.next(consumer.stream())) {
      ASSERT_NE(b->fence, nullptr);  // kept: the copy may still be running
      // What the consumer's stream reads, through its own queue.
      Batch seen;
      seen.info = b->info;
      seen.stamp = b->stamp;
      for (const auto& [id, t] : b->fields) {
        EXPECT_EQ(t.device().kind, MemoryKind::kDevice);
        consumer.read(t);
        std::vector<std::byte> bytes = consumer.seen(t.nbytes());
        Tensor h(t.dtype(), t.shape());
        std::memcpy(h.data(), bytes.data(), bytes.size());
        seen.fields.set(id, h);
      }
      got.push_back(testing::trace(seen));
    }
  }
  EXPECT_EQ(got, expect);
}

#ifdef FLOWSTATE_FAKE_CUDART

/// The fake's call log.
std::vector<FakeCudaCall> calls() {
  const FakeCudaCall* c = nullptr;
  int n = 0;
  fake_cuda_calls(&c, &n);
  return {c, c + n};
}

TEST(FLOWSTATE_CUDA_SUITE, StreamHandoverNeverBlocksTheHost) {
  testing::TempDir dir;
  auto glob = testing::write_records(dir.str(), 256, 64, 2);
  Consumer consumer(32 * 64);
  const void* s = consumer.stream();
  std::vector<FakeCudaCall> log;
  std::size_t batches = 0;
  {
    Loader loader(Pipeline::Builder()
                      .records({.paths = {glob}, .record_bytes = 64})
                      .batch({.size = 32})
                      .prefetch({.depth = 2})
                      .device_copy({.device = "cuda:0"})
                      .build(),
                  // More batches than can be in flight at once (5 messages of at most
                  // kGroupMax cheap batches, graph/loader_runtime_parts.h), so blocks are
                  // reused.
                  {.epochs = 40});
    fake_cuda_clear_calls();
    while (auto b = loader.next(consumer.stream())) {
      consumer.read((*b)["data"]);  // the consumer's kernel, queued after the wait
      ++batches;
    }
    log = calls();      // before the loader's destruction synchronizes its stream
    consumer.finish();  // the consumer's reads are done before the loader frees memory
  }
  ASSERT_EQ(batches, 40u * 8u);
  // Which stream each event was last recorded on, replayed along the log.
  std::map<const void*, const void*> recorded_on;
  std::size_t consumer_waits = 0, reuse_waits = 0, release_records = 0;
  for (const FakeCudaCall& c : log) {
    const std::string api = c.api;
    EXPECT_NE(api, "cudaEventSynchronize") << "a host wait on an event";
    EXPECT_NE(api, "cudaStreamSynchronize") << "a host wait on a stream";
    if (api == "cudaEventRecord") {
      recorded_on[c.event] = c.stream;
      release_records += c.stream == s;
    } else if (api == "cudaStreamWaitEvent") {
      ASSERT_TRUE(recorded_on.contains(c.event)) << "a wait on an event never recorded";
      if (c.stream == s) {
        // The consumer waits on a copy's event, recorded on the copy stream.
        EXPECT_NE(recorded_on[c.event], s);
        ++consumer_waits;
      } else {
        // The copy stream waits, before reusing a block, on the consumer's release event.
        EXPECT_EQ(recorded_on[c.event], s);
        ++reuse_waits;
      }
    }
  }
  EXPECT_EQ(consumer_waits, batches);
  // Every batch's block is released after the consumer's read, and a reused one is written
  // only after its release event.
  EXPECT_GE(release_records, batches);
  EXPECT_GT(reuse_waits, 0u);
}

TEST(FLOWSTATE_CUDA_SUITE, ReuseWaitsOnTheReleaseEventRecordedOnTheConsumersStream) {
  constexpr std::size_t kBytes = 4096;
  Consumer consumer(kBytes);
  DeviceCopy copy({.device = "cuda:0"});
  Batch first = copy.copy(pattern_batch(*copy.staging_pool(), kBytes, 1));
  first.wait(consumer.stream());
  consumer.read(first["data"]);
  fake_cuda_clear_calls();
  first = Batch{};
  std::vector<FakeCudaCall> released = calls();
  ASSERT_EQ(released.size(), 1u);
  EXPECT_STREQ(released[0].api, "cudaEventRecord");
  EXPECT_EQ(released[0].stream, consumer.stream());
  fake_cuda_clear_calls();
  Batch second = copy.copy(pattern_batch(*copy.staging_pool(), kBytes, 2));
  std::vector<FakeCudaCall> reused = calls();
  ASSERT_GE(reused.size(), 2u);
  // First the copy stream waits on the release event, then the copy's own event is recorded.
  EXPECT_STREQ(reused[0].api, "cudaStreamWaitEvent");
  EXPECT_EQ(reused[0].event, released[0].event);
  EXPECT_NE(reused[0].stream, consumer.stream());
  EXPECT_STREQ(reused.back().api, "cudaEventRecord");
  EXPECT_EQ(reused.back().stream, reused[0].stream);
  EXPECT_TRUE(is_pattern(consumer.seen(kBytes), 1));
}

TEST(FLOWSTATE_CUDA_SUITE, DroppedFenceKeepsItsStagingBufferUntilTheCopyCompletes) {
  DeviceCopy copy({.device = "cuda:0"});
  auto& pool = *copy.staging_pool();
  constexpr std::size_t kBytes = 4096;
  Batch out = copy.copy(pattern_batch(pool, kBytes, 5));
  Tensor data = out["data"];
  out = Batch{};  // the fence goes without a host wait while the copy has not run
  // The staging block is still the pending copy's: a new batch gets a new one.
  { auto other = pool.acquire(kBytes); }
  EXPECT_EQ(pool.allocated(), 2u);
  Batch next = copy.copy(pattern_batch(pool, kBytes, 6));
  next.wait();  // runs the stream: both copies complete
  EXPECT_TRUE(has_pattern(data, 5));
  EXPECT_TRUE(has_pattern(next["data"], 6));
  // The next copy() finds the first copy complete and releases its block.
  Batch last = copy.copy(pattern_batch(pool, kBytes, 7));
  last.wait();
  {
    auto a = pool.acquire(kBytes);
    auto b = pool.acquire(kBytes);
  }
  EXPECT_EQ(pool.allocated(), 2u);
}

TEST(FLOWSTATE_CUDA_SUITE, LoaderReportsAFailedStreamWaitAsTheNodesError) {
  testing::TempDir dir;
  auto glob = testing::write_records(dir.str(), 64, 64, 1);
  Consumer consumer(64);
  Loader loader(Pipeline::Builder()
                    .records({.paths = {glob}, .record_bytes = 64})
                    .batch({.size = 32})
                    .device_copy({.device = "cuda:0"})
                    .build());
  fake_cuda_fail_next("cudaStreamWaitEvent", cudaErrorLaunchFailure, 0);
  try {
    loader.next(consumer.stream());
    FAIL() << "the failed wait was not reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.node(), "device_copy");
    EXPECT_THAT(e.what(), HasSubstr("node 'device_copy': CUDA error in cudaStreamWaitEvent: "
                                    "unspecified launch failure"));
  }
}

TEST(FLOWSTATE_CUDA_SUITE, FailedCopyThrowsErrorNamingTheCallAndTheNodeRecovers) {
  DeviceCopy copy({.device = "cuda:0"});
  auto make = [&](std::uint32_t seed) {
    Batch b = pattern_batch(*copy.staging_pool(), 1000, seed);
    b.fields.set("more", b["data"]);
    return b;
  };
  // The second field's copy fails after the first one was issued.
  fake_cuda_fail_next("cudaMemcpyAsync", cudaErrorIllegalAddress, 1);
  try {
    copy.copy(make(1));
    FAIL() << "copy() did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "CUDA error in cudaMemcpyAsync: an illegal memory access was encountered "
              "(cudaErrorIllegalAddress)");
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // not left behind for an unrelated call
  Batch out = copy.copy(make(2));
  out.fence->wait();
  EXPECT_TRUE(has_pattern(out["data"], 2));
  EXPECT_TRUE(has_pattern(out["more"], 2));
}

TEST(FLOWSTATE_CUDA_SUITE, FenceWaitThrowsTheCudaError) {
  DeviceCopy copy({.device = "cuda:0"});
  Batch out = copy.copy(pattern_batch(*copy.staging_pool(), 1000, 4));
  fake_cuda_fail_next("cudaEventSynchronize", cudaErrorLaunchFailure, 0);
  try {
    out.fence->wait();
    FAIL() << "wait() did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "CUDA error in cudaEventSynchronize: unspecified launch failure "
              "(cudaErrorLaunchFailure)");
  }
}

TEST(FLOWSTATE_CUDA_SUITE, LoaderReportsAFailedCopyAsTheNodesError) {
  testing::TempDir dir;
  auto glob = testing::write_records(dir.str(), 256, 64, 2);
  Loader loader(Pipeline::Builder()
                    .records({.paths = {glob}, .record_bytes = 64})
                    .batch({.size = 32})
                    .device_copy({.device = "cuda:0"})
                    .build());
  fake_cuda_fail_next("cudaMemcpyAsync", cudaErrorIllegalAddress, 2);
  ASSERT_TRUE(loader.next().has_value());
  ASSERT_TRUE(loader.next().has_value());
  try {
    loader.next();
    FAIL() << "the failed copy was not reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.node(), "device_copy");
    EXPECT_THAT(e.what(), HasSubstr("node 'device_copy': CUDA error in cudaMemcpyAsync: "));
  }
}

TEST(FLOWSTATE_CUDA_SUITE, UnusableDeviceIsConfigError) {
  fake_cuda_fail_next("cudaStreamCreateWithFlags", cudaErrorMemoryAllocation, 0);
  try {
    DeviceCopy copy({.device = "cuda:0"});
    FAIL() << "DeviceCopy did not throw";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "device_copy.device");
    EXPECT_EQ(std::string(e.what()),
              "device 'cuda:0' is not usable: CUDA error in cudaStreamCreateWithFlags: out of "
              "memory (cudaErrorMemoryAllocation)");
  }
}

TEST(FLOWSTATE_CUDA_SUITE, AutoFallsBackToHostWhenTheDeviceIsUnusable) {
  fake_cuda_fail_next("cudaStreamCreateWithFlags", cudaErrorMemoryAllocation, 0);
  DeviceCopy copy({});
  EXPECT_EQ(copy.target(), Device{});
  EXPECT_EQ(copy.staging_pool()->device(), Device{});
  Batch in = pattern_batch(*copy.staging_pool(), 100, 1);
  Batch out = copy.copy(in);
  EXPECT_EQ(out.fence, nullptr);
  EXPECT_EQ(out["data"].data(), in["data"].data());
}

TEST(FLOWSTATE_CUDA_SUITE, FailedUserCopyThrowsAndTheNodeRecovers) {
  DeviceCopy copy({.device = "cuda:0"});
  // The field's copy is issued, then the user tensor's fails.
  fake_cuda_fail_next("cudaMemcpyAsync", cudaErrorIllegalAddress, 1);
  Batch in = pattern_batch(*copy.staging_pool(), 1000, 1);
  set_user_tensor(in, pattern_tensor(500, 1));
  try {
    copy.copy(std::move(in));
    FAIL() << "copy() did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "CUDA error in cudaMemcpyAsync: an illegal memory access was encountered "
              "(cudaErrorIllegalAddress)");
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  Batch again = pattern_batch(*copy.staging_pool(), 1000, 2);
  set_user_tensor(again, pattern_tensor(500, 3));
  Batch out = copy.copy(std::move(again));
  out.fence->wait();
  EXPECT_TRUE(has_pattern(out["data"], 2));
  EXPECT_TRUE(has_pattern(out.user.get<Tensor>(), 3));
}

TEST(FLOWSTATE_CUDA_SUITE, ThrowingUserToDeviceLeavesNoCopyInFlight) {
  DeviceCopy copy({.device = "cuda:0"});
  Batch in = pattern_batch(*copy.staging_pool(), 1000, 1);
  in.user = UserValue::make(pattern_tensor(64, 5));
  in.user_to_device = [](UserValue& v, DeviceCopy& c) {
    v.get<Tensor>() = c.to_device(v.get<Tensor>());
    throw std::runtime_error("user failure");
  };
  EXPECT_THROW(copy.copy(std::move(in)), std::runtime_error);
  // A later standalone to_device is not mistaken for part of the failed batch.
  Tensor out = copy.to_device(pattern_tensor(64, 6));
  EXPECT_TRUE(has_pattern(out, 6));
}

/// After every test: nothing device_copy allocated is left.
class NoLeaks : public ::testing::EmptyTestEventListener {
 public:
  void OnTestEnd(const ::testing::TestInfo& info) override {
    int device = 0, pinned = 0, streams = 0, events = 0;
    fake_cuda_live(&device, &pinned, &streams, &events);
    EXPECT_EQ(device, 0) << info.name() << " left device memory allocated";
    EXPECT_EQ(pinned, 0) << info.name() << " left pinned memory allocated";
    EXPECT_EQ(streams, 0) << info.name() << " left a stream";
    EXPECT_EQ(events, 0) << info.name() << " left an event";
  }
};

const bool kNoLeaksInstalled = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new NoLeaks);
  return true;
}();

#endif  // FLOWSTATE_FAKE_CUDART

}  // namespace
}  // namespace flowstate
