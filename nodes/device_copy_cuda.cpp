// CUDA build of device_copy (FLOWSTATE_HAVE_CUDA): plain C++ on the CUDA runtime API, no
// kernels. The host-only build is device_copy.cpp; both define the same functions and must
// give the same messages for the same mistakes.
//
// Data path for a device target: the assembler collates into pinned host buffers (the staging
// pool); copy() issues one cudaMemcpyAsync per field on the node's own non-blocking stream into
// a pooled device buffer — and one per tensor a user value's ToDevice moves with to_device() —
// records one event, and returns the batch with a Fence on that event.
//
// The stream handover (DECISIONS.md, "The CUDA stream handover"):
// - The Fence owns the source tensors, so a pinned staging buffer goes back to its pool only
//   once the DMA reading it is complete: when wait() has returned, or, for a fence dropped
//   without a host wait, when its event is found complete (cudaEventQuery at its destruction,
//   else at a later copy(), else when the stream is destroyed) — never by blocking the host.
// - Fence::wait(stream) calls cudaStreamWaitEvent(stream, event) and notes `stream` as one of
//   the batch's consumers. Each device buffer of the batch is a view of a pooled block whose
//   release, when the last tensor on it is dropped, records an event on every consumer stream;
//   the next copy into that block first makes the copy stream wait on those events
//   (cudaStreamWaitEvent), so a copy cannot overwrite memory the consumer's queued work still
//   reads, and no one blocks the host.
// - A batch whose consumer never named a stream (Loader::next() waits on the host) keeps the
//   older contract: the consumer must have finished every use of its device memory before
//   dropping it, since a later copy may then overwrite it.
#include "flowstate/nodes/device_copy.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <charconv>
#include <iterator>
#include <list>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "flowstate/core/error.h"
#include "flowstate/core/launcher.h"

namespace flowstate {
namespace {

constexpr char kKey[] = "device_copy.device";
// Events kept for reuse beyond those in flight; more are destroyed when returned.
constexpr std::size_t kMaxFreeEvents = 64;

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
  if (device == "auto") {
    const int count = cuda_device_count();
    if (count == 0) return Device{};
    // One device per rank on a node: the launcher's local rank picks it.
    const LaunchEnv env = launch_env(std::string(kKey));
    const std::uint64_t local = env.local_rank.value_or(0);
    if (local >= static_cast<std::uint64_t>(count))
      throw ConfigError(kKey, "device auto picks cuda:" + std::to_string(local) +
                                  " for local rank " + std::to_string(local) + ", but there are " +
                                  std::to_string(count) +
                                  " CUDA devices; start fewer ranks per node or name the device");
    return Device{MemoryKind::kDevice, static_cast<int>(local)};
  }
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

/// The streams a batch's consumer made wait on its copy (Fence::wait(stream)): the release
/// of each of the batch's device buffers is ordered after the work queued on them by then.
class ConsumerStreams {
 public:
  void add(cudaStream_t s) {
    std::lock_guard lock(mu_);
    if (std::find(streams_.begin(), streams_.end(), s) == streams_.end()) streams_.push_back(s);
  }
  std::vector<cudaStream_t> get() const {
    std::lock_guard lock(mu_);
    return streams_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<cudaStream_t> streams_;
};

/// The node's stream, a free list of events, the sources of dropped fences whose copies may
/// still run, and the consumer events each released device block must wait for before it is
/// written again. Shared by the DeviceCopy, every Fence and every device buffer it handed out,
/// so a batch may outlive the node. Thread-safe: fences and buffers are dropped on the
/// consumer's threads while copy() runs on the graph's.
class CopyStream {
 public:
  explicit CopyStream(int device) : device_(device) {
    DeviceGuard guard(device_);
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }
  ~CopyStream() {
    DeviceGuard guard(device_, std::nothrow);
    (void)cudaStreamSynchronize(stream_);
    // The stream is idle: every retired copy is complete, so their sources may go.
    for (Retired& r : retired_) (void)cudaEventDestroy(r.event);
    retired_.clear();
    for (auto& [block, events] : reuse_after_)
      for (cudaEvent_t e : events) (void)cudaEventDestroy(e);
    for (cudaEvent_t e : free_) (void)cudaEventDestroy(e);
    (void)cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
  }
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }

  /// An event from the free list, or a new one. The device must be current.
  cudaEvent_t acquire_event() {
    if (cudaEvent_t e = pop_free()) return e;
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return e;
  }

  /// Returns an event nothing will wait on or record again. Never throws.
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

  /// Keeps `sources` until `event` (recorded after the copies reading them) is complete, then
  /// releases both: a dropped fence whose copy may still run. Never throws or blocks.
  void retire(cudaEvent_t event, std::vector<Tensor> sources) noexcept {
    if (cudaEventQuery(event) == cudaSuccess) {
      release_event(event);
      return;  // `sources` go now
    }
    (void)cudaGetLastError();
    std::lock_guard lock(mu_);
    retired_.push_back({event, std::move(sources)});
  }

  /// Releases the retired sources whose copies are complete (or failed). Never throws.
  void collect() noexcept {
    std::list<Retired> done;
    {
      std::lock_guard lock(mu_);
      for (auto it = retired_.begin(); it != retired_.end();) {
        const cudaError_t err = cudaEventQuery(it->event);
        if (err == cudaErrorNotReady) {
          ++it;
          continue;
        }
        auto following = std::next(it);
        done.splice(done.end(), retired_, it);
        it = following;
      }
      (void)cudaGetLastError();
    }
    for (Retired& r : done) release_event(r.event);
  }

  /// Called when the device block at `block` is released while `consumers` may still read it:
  /// records an event on each consumer stream, which the next copy into the block waits for.
  /// Never throws; a stream that cannot record (destroyed) is skipped.
  void released(void* block, const ConsumerStreams& consumers) noexcept {
    const std::vector<cudaStream_t> streams = consumers.get();
    if (streams.empty()) return;
    DeviceGuard guard(device_, std::nothrow);
    std::vector<cudaEvent_t> events;
    for (cudaStream_t s : streams) {
      cudaEvent_t e = pop_free();
      if (e == nullptr && cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError();
        continue;
      }
      if (cudaEventRecord(e, s) != cudaSuccess) {
        (void)cudaGetLastError();
        release_event(e);
        continue;
      }
      events.push_back(e);
    }
    std::lock_guard lock(mu_);
    auto& pending = reuse_after_[block];
    pending.insert(pending.end(), events.begin(), events.end());
  }

  /// Orders the copy stream's next work after the consumer events of the block at `block`
  /// (see released()), before a copy writes it again. The device must be current.
  void before_reuse(void* block) {
    std::vector<cudaEvent_t> events;
    {
      std::lock_guard lock(mu_);
      auto it = reuse_after_.find(block);
      if (it == reuse_after_.end()) return;
      events = std::move(it->second);
      reuse_after_.erase(it);
    }
    cudaError_t err = cudaSuccess;
    for (cudaEvent_t e : events) {
      // The wait captures the event's state now: the event may be recorded again later.
      if (err == cudaSuccess) err = cudaStreamWaitEvent(stream_, e, 0);
      release_event(e);
    }
    if (err != cudaSuccess) throw_cuda("cudaStreamWaitEvent", err);
  }

 private:
  struct Retired {
    cudaEvent_t event;
    std::vector<Tensor> sources;
  };

  cudaEvent_t pop_free() {
    std::lock_guard lock(mu_);
    if (free_.empty()) return nullptr;
    cudaEvent_t e = free_.back();
    free_.pop_back();
    return e;
  }

  int device_;
  cudaStream_t stream_ = nullptr;
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
  std::list<Retired> retired_;
  std::map<void*, std::vector<cudaEvent_t>> reuse_after_;
};

/// Completion of one batch's copies: an event recorded after them. Holds the source tensors
/// (and so their staging buffers) until the copy is known complete.
class CudaFence final : public Fence {
 public:
  CudaFence(std::shared_ptr<CopyStream> stream, cudaEvent_t event, std::vector<Tensor> sources,
            std::shared_ptr<ConsumerStreams> consumers)
      : stream_(std::move(stream)),
        event_(event),
        sources_(std::move(sources)),
        consumers_(std::move(consumers)) {}

  // Dropped without a host wait (a stream handover, or a batch discarded in flight): the DMA
  // may still read the sources, so they go back to their pool only once it is complete.
  ~CudaFence() override {
    if (waited_) {
      stream_->release_event(event_);
      return;
    }
    stream_->retire(event_, std::move(sources_));
  }

  void wait() const override {
    cudaError_t err = cudaEventSynchronize(event_);
    if (err != cudaSuccess) throw_cuda("cudaEventSynchronize", err);
    std::lock_guard lock(mu_);
    sources_.clear();  // the copy is done: staging buffers may be reused now
    waited_ = true;
  }

  void wait(CudaStream stream) const override {
    auto s = static_cast<cudaStream_t>(stream);
    cudaError_t err = cudaStreamWaitEvent(s, event_, 0);
    if (err != cudaSuccess) throw_cuda("cudaStreamWaitEvent", err);
    consumers_->add(s);
  }

  Device device() const override { return Device{MemoryKind::kDevice, stream_->device()}; }

 private:
  std::shared_ptr<CopyStream> stream_;
  cudaEvent_t event_;
  mutable std::mutex mu_;
  mutable std::vector<Tensor> sources_;
  mutable bool waited_ = false;
  std::shared_ptr<ConsumerStreams> consumers_;
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
  // The sources and consumers of the batch copy() is moving while it runs the batch's
  // user_to_device, so that to_device() adds a user value's tensors to that batch's Fence;
  // null otherwise.
  std::vector<Tensor>* pending = nullptr;
  std::shared_ptr<ConsumerStreams> pending_consumers;

  /// Issues the copy of `t` (host, pinned, or another device) into a pooled buffer on
  /// `target` and keeps `t` in `sources` until the copy is known complete. The buffer's
  /// release is ordered after the work of `consumers`' streams (when given). The target device
  /// must be current.
  Tensor issue(const Tensor& t, const Device& target, std::vector<Tensor>& sources,
               const std::shared_ptr<ConsumerStreams>& consumers) {
    const std::size_t n = t.nbytes();
    std::shared_ptr<Buffer> dst;
    if (n == 0) {
      dst = std::make_shared<Buffer>(nullptr, 0, target, nullptr);
    } else {
      std::shared_ptr<Buffer> block = device_pool->acquire(n);
      // A consumer's stream may still read the block's previous batch.
      stream->before_reuse(block->data());
      if (consumers) {
        // A view of the block whose release, before the block goes back to the pool, records
        // the consumers' events for its next copy to wait on.
        void* data = block->data();
        dst =
            std::make_shared<Buffer>(data, n, target,
                                     [copy = stream, consumers, block = std::move(block)](
                                         void* p, std::size_t) { copy->released(p, *consumers); });
      } else {
        dst = std::move(block);
      }
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
  // Staging buffers of fences dropped before their copies completed.
  impl_->stream->collect();

  std::vector<Tensor> sources;
  sources.reserve(batch.fields.size());
  auto consumers = std::make_shared<ConsumerStreams>();
  try {
    for (auto& [id, t] : batch.fields) {
      if (!t.defined() || t.device() == target_) continue;
      t = impl_->issue(t, target_, sources, consumers);
    }
    if (batch.user_to_device && batch.user.has_value()) {
      impl_->pending = &sources;
      impl_->pending_consumers = consumers;
      struct Reset {
        Impl* impl;
        ~Reset() {
          impl->pending = nullptr;
          impl->pending_consumers.reset();
        }
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
    batch.fence =
        std::make_shared<CudaFence>(impl_->stream, event, std::move(sources), std::move(consumers));
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
  if (impl_->pending != nullptr)
    return impl_->issue(tensor, target_, *impl_->pending, impl_->pending_consumers);
  // On its own: nothing else will wait for the copy, so it completes here, before the
  // source can be released.
  DeviceGuard guard(target_.index);
  cudaStream_t stream = impl_->stream->get();
  std::vector<Tensor> sources;
  try {
    Tensor out = impl_->issue(tensor, target_, sources, nullptr);
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return out;
  } catch (...) {
    (void)cudaStreamSynchronize(stream);
    (void)cudaGetLastError();
    throw;
  }
}

}  // namespace flowstate
