// CUDA build of device_copy (FLOWSTATE_HAVE_CUDA): plain C++ on the CUDA runtime API, no
// kernels. The host-only build is device_copy.cpp; both define the same functions and must
// give the same messages for the same mistakes.
//
// Data path for a device target: the assembler collates into pinned host buffers (the staging
// pool); copy() issues one cudaMemcpyAsync per field on the node's own non-blocking stream into
// a pooled device buffer — and one per tensor a user value's ToDevice moves with to_device() —
// records one event, and returns the batch with a Fence on that event.
// The Fence owns the source tensors, so a pinned staging buffer goes back to its pool only once
// the DMA reading it is complete. Device buffers go back to their pool when the consumer drops
// the batch; a later copy may then overwrite them, so the consumer must have finished (or
// ordered before its own later work) every use of a batch's device memory before dropping it.
#include "flowstate/nodes/device_copy.h"

#include <cuda_runtime_api.h>

#include <charconv>
#include <mutex>
#include <new>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "flowstate/core/error.h"

namespace flowstate {
namespace {

constexpr char kKey[] = "device_copy.device";
// Events kept for reuse beyond those in flight; more are destroyed when returned.
constexpr std::size_t kMaxFreeEvents = 16;

[[noreturn]] void throw_cuda(const char* call, cudaError_t err) {
  // A non-sticky error stays readable through cudaGetLastError; clear it so it is not
  // reported again by an unrelated call.
  (void)cudaGetLastError();
  throw Error(std::string("CUDA error in ") + call + ": " + cudaGetErrorString(err) + " (" +
              cudaGetErrorName(err) + ")");
}

void check(cudaError_t err, const char* call) {
  if (err != cudaSuccess) throw_cuda(call, err);
}

/// Makes `device` current on this thread for the guard's lifetime and restores the previous
/// device afterwards, so flowstate does not change the current device of a caller's thread.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice");
  }
  /// The non-throwing form for destructors and deallocation: errors are ignored.
  DeviceGuard(int device, std::nothrow_t) {
    if (cudaGetDevice(&previous_) != cudaSuccess || previous_ == device) {
      previous_ = -1;
    } else if (cudaSetDevice(device) != cudaSuccess) {
      previous_ = -1;
    }
    (void)cudaGetLastError();
  }
  ~DeviceGuard() {
    int current = -1;
    if (previous_ >= 0 && cudaGetDevice(&current) == cudaSuccess && current != previous_)
      (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

/// cudaGetDeviceCount, asked once per process: the answer does not change, and without a
/// driver every call would retry loading it.
struct Probe {
  int count = 0;
  cudaError_t error = cudaSuccess;
};

const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    r.error = cudaGetDeviceCount(&r.count);
    if (r.error != cudaSuccess) {
      r.count = 0;
      (void)cudaGetLastError();
    }
    return r;
  }();
  return p;
}

/// N of "cuda:N" when the rest of `s` is a decimal index; nullopt otherwise.
std::optional<int> cuda_index(std::string_view s) {
  constexpr std::string_view kPrefix = "cuda:";
  if (!s.starts_with(kPrefix)) return std::nullopt;
  s.remove_prefix(kPrefix.size());
  if (s.empty() || s.front() < '0' || s.front() > '9') return std::nullopt;
  int n = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return n;
}

/// The target of `device`, or throws ConfigError.
Device resolve(const std::string& device) {
  if (device == "cpu") return Device{};
  if (device == "auto") return cuda_device_count() > 0 ? Device{MemoryKind::kDevice, 0} : Device{};
  std::optional<int> index = cuda_index(device);
  if (!index) throw ConfigError(kKey, "unknown device '" + device + "' (known: auto, cpu, cuda:N)");
  const Probe& p = probe();
  if (p.error != cudaSuccess)
    throw ConfigError(kKey, "device '" + device +
                                "' requested, but no CUDA device is usable: cudaGetDeviceCount "
                                "failed: " +
                                cudaGetErrorString(p.error) + " (" + cudaGetErrorName(p.error) +
                                ")");
  if (p.count == 0)
    throw ConfigError(kKey, "device '" + device + "' requested, but no CUDA device is present");
  if (*index >= p.count)
    throw ConfigError(kKey, "device '" + device + "' requested, but only " +
                                std::to_string(p.count) + " CUDA device" +
                                (p.count == 1 ? " is" : "s are") + " present (cuda:0" +
                                (p.count == 1 ? "" : "..cuda:" + std::to_string(p.count - 1)) +
                                "): " + cudaGetErrorString(cudaErrorInvalidDevice));
  return Device{MemoryKind::kDevice, *index};
}

/// The node's stream and a free list of events. Shared by the DeviceCopy and every Fence it
/// handed out, so a batch may outlive the node. Thread-safe: fences return events from the
/// consumer's thread while copy() takes them on the graph's.
class CopyStream {
 public:
  explicit CopyStream(int device) : device_(device) {
    DeviceGuard guard(device_);
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }
  ~CopyStream() {
    DeviceGuard guard(device_, std::nothrow);
    (void)cudaStreamSynchronize(stream_);
    for (cudaEvent_t e : free_) (void)cudaEventDestroy(e);
    (void)cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
  }
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  cudaStream_t get() const { return stream_; }

  /// An event from the free list, or a new one. The device must be current.
  cudaEvent_t acquire_event() {
    {
      std::lock_guard lock(mu_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }

  /// Returns an event whose work is complete (or failed). Never throws.
  void release_event(cudaEvent_t e) noexcept {
    {
      std::lock_guard lock(mu_);
      if (free_.size() < kMaxFreeEvents) {
        free_.push_back(e);
        return;
      }
    }
    DeviceGuard guard(device_, std::nothrow);
    (void)cudaEventDestroy(e);
  }

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

/// Completion of one batch's copies: an event recorded after them. Holds the source tensors
/// (and so their staging buffers) until the copy is known complete.
class CudaFence final : public Fence {
 public:
  CudaFence(std::shared_ptr<CopyStream> stream, cudaEvent_t event, std::vector<Tensor> sources)
      : stream_(std::move(stream)), event_(event), sources_(std::move(sources)) {}

  // Dropped without wait() (a batch discarded in flight): the DMA may still read the
  // sources, so wait for it before they can go back to their pool and be rewritten.
  ~CudaFence() override {
    (void)cudaEventSynchronize(event_);
    (void)cudaGetLastError();
    stream_->release_event(event_);
  }

  void wait() const override {
    cudaError_t err = cudaEventSynchronize(event_);
    if (err != cudaSuccess) throw_cuda("cudaEventSynchronize", err);
    std::lock_guard lock(mu_);
    sources_.clear();  // the copy is done: staging buffers may be reused now
  }

 private:
  std::shared_ptr<CopyStream> stream_;
  cudaEvent_t event_;
  mutable std::mutex mu_;
  mutable std::vector<Tensor> sources_;
};

std::shared_ptr<BufferPool> pinned_pool(int device) {
  return std::make_shared<BufferPool>(Allocator{
      Device{MemoryKind::kPinned, 0},
      [device](std::size_t size) {
        // The current device decides which context the allocation initialises; Portable
        // makes the memory pinned for every context.
        DeviceGuard guard(device);
        void* p = nullptr;
        check(cudaHostAlloc(&p, size == 0 ? 1 : size, cudaHostAllocPortable), "cudaHostAlloc");
        return p;
      },
      [](void* p) {
        (void)cudaFreeHost(p);
        (void)cudaGetLastError();
      }});
}

std::shared_ptr<BufferPool> device_pool(int device) {
  return std::make_shared<BufferPool>(Allocator{Device{MemoryKind::kDevice, device},
                                                [device](std::size_t size) {
                                                  DeviceGuard guard(device);
                                                  void* p = nullptr;
                                                  check(cudaMalloc(&p, size == 0 ? 1 : size),
                                                        "cudaMalloc");
                                                  return p;
                                                },
                                                [device](void* p) {
                                                  DeviceGuard guard(device, std::nothrow);
                                                  (void)cudaFree(p);
                                                  (void)cudaGetLastError();
                                                }});
}

}  // namespace

bool cuda_compiled() { return true; }
int cuda_device_count() { return probe().count; }

struct DeviceCopy::Impl {
  std::shared_ptr<BufferPool> device_pool;
  // Declared after the pool so that it is released first: its last owner synchronizes it
  // before the pool's blocks can be freed.
  std::shared_ptr<CopyStream> stream;
  // The sources of the batch copy() is moving while it runs the batch's user_to_device, so
  // that to_device() adds a user value's tensors to that batch's Fence; null otherwise.
  std::vector<Tensor>* pending = nullptr;

  /// Issues the copy of `t` (host, pinned, or another device) into a pooled buffer on
  /// `target` and keeps `t` in `sources` until the copy is known complete. The target device
  /// must be current.
  Tensor issue(const Tensor& t, const Device& target, std::vector<Tensor>& sources) {
    const std::size_t n = t.nbytes();
    std::shared_ptr<Buffer> dst =
        n == 0 ? std::make_shared<Buffer>(nullptr, 0, target, nullptr) : device_pool->acquire(n);
    if (n > 0) {
      // Host and pinned sources are host→device; a tensor on another device goes peer to
      // peer, which cudaMemcpyDefault resolves through unified addressing.
      cudaMemcpyKind kind =
          t.device().kind == MemoryKind::kDevice ? cudaMemcpyDefault : cudaMemcpyHostToDevice;
      check(cudaMemcpyAsync(dst->data(), t.data(), n, kind, stream->get()), "cudaMemcpyAsync");
    }
    sources.push_back(t);
    return Tensor(std::move(dst), 0, t.dtype(), t.shape());
  }
};

DeviceCopy::DeviceCopy(const DeviceCopyOptions& options) : target_(resolve(options.device)) {
  if (target_.kind == MemoryKind::kDevice) {
    try {
      impl_ = std::make_unique<Impl>(
          Impl{device_pool(target_.index), std::make_shared<CopyStream>(target_.index)});
    } catch (const Error& e) {
      if (options.device != "auto")
        throw ConfigError(kKey, "device '" + target_.to_string() + "' is not usable: " + e.what());
      // `auto` degrades to host memory when the device cannot be used (DESIGN.md §8).
      target_ = Device{};
    }
  }
  staging_ = impl_ ? pinned_pool(target_.index) : BufferPool::host();
}

DeviceCopy::~DeviceCopy() = default;

Batch DeviceCopy::copy(Batch batch) {
  if (!impl_) {
    if (batch.user_to_device && batch.user.has_value()) batch.user_to_device(batch.user, *this);
    return batch;
  }
  // Host work upstream must be complete before the DMA reads it.
  if (batch.fence) {
    batch.fence->wait();
    batch.fence.reset();
  }
  DeviceGuard guard(target_.index);
  cudaStream_t stream = impl_->stream->get();

  std::vector<Tensor> sources;
  sources.reserve(batch.fields.size());
  try {
    for (auto& [id, t] : batch.fields) {
      if (!t.defined() || t.device() == target_) continue;
      t = impl_->issue(t, target_, sources);
    }
    if (batch.user_to_device && batch.user.has_value()) {
      impl_->pending = &sources;
      struct Reset {
        Impl* impl;
        ~Reset() { impl->pending = nullptr; }
      } reset{impl_.get()};
      batch.user_to_device(batch.user, *this);
    }
    if (sources.empty()) return batch;
    cudaEvent_t event = impl_->stream->acquire_event();
    cudaError_t err = cudaEventRecord(event, stream);
    if (err != cudaSuccess) {
      impl_->stream->release_event(event);
      throw_cuda("cudaEventRecord", err);
    }
    batch.fence = std::make_shared<CudaFence>(impl_->stream, event, std::move(sources));
  } catch (...) {
    // Copies already issued may still read `sources`; finish them before they are released.
    (void)cudaStreamSynchronize(stream);
    (void)cudaGetLastError();
    throw;
  }
  return batch;
}

Tensor DeviceCopy::to_device(const Tensor& tensor) {
  if (!impl_ || !tensor.defined() || tensor.device() == target_) return tensor;
  // Inside copy(): the target is current and the batch's Fence will cover this copy.
  if (impl_->pending != nullptr) return impl_->issue(tensor, target_, *impl_->pending);
  // On its own: nothing else will wait for the copy, so it completes here, before the
  // source can be released.
  DeviceGuard guard(target_.index);
  cudaStream_t stream = impl_->stream->get();
  std::vector<Tensor> sources;
  try {
    Tensor out = impl_->issue(tensor, target_, sources);
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return out;
  } catch (...) {
    (void)cudaStreamSynchronize(stream);
    (void)cudaGetLastError();
    throw;
  }
}

}  // namespace flowstate
