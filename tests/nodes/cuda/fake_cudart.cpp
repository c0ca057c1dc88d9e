// A fake CUDA runtime for testing device_copy on machines without a GPU: the subset of the
// runtime API that nodes/device_copy_cuda.cpp and the CUDA tests call, over host memory.
// Linked into nodes_cuda_fake_tests instead of a device; never into the library.
//
// It is stricter than a real device where that finds bugs:
// - work on a stream runs only when something synchronizes with it (an event recorded after
//   it, or the stream), so a copy reads its source as late as the API allows: a source that is
//   recycled or freed too early shows up as wrong bytes (or an ASan report);
// - "device" memory is only reachable through the API, and every copy, free and event checks
//   that its pointers are live, on the right device, and of the right kind;
// - cudaMemcpy does not wait for non-blocking streams (as on a device), so a test that forgets
//   the fence reads stale bytes;
// - every allocation, stream and event is counted, so tests can check nothing leaks.
// FAKE_CUDA_DEVICES sets the device count (default 2); fake_cuda_fail_next() injects errors,
// fake_cuda_live() counts what is allocated, and fake_cuda_calls() returns the log of the
// synchronizing calls (cudaEventRecord, cudaStreamWaitEvent, cudaEventSynchronize,
// cudaStreamSynchronize) with their stream and event handles, in order.
// cudaStreamWaitEvent(s, e) queues on `s` an operation that runs `e`'s stream up to `e`, so
// work ordered after an event sees what the work before it wrote, and nothing else does.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace {

struct Allocation {
  std::size_t size;
  int device;  // -1 for pinned host memory
};

struct FakeStream {
  int device;
  std::uint64_t issued = 0;     // operations queued so far
  std::uint64_t completed = 0;  // operations run so far
  std::vector<std::function<cudaError_t()>> pending;
};

struct FakeEvent {
  int device;
  FakeStream* stream = nullptr;  // where it was last recorded; null when never recorded
  std::uint64_t position = 0;    // complete when stream->completed >= position
};

/// One logged call (see fake_cuda_calls).
struct FakeCudaCall {
  const char* api;
  void* stream;  // null for the event-only calls
  void* event;   // null for cudaStreamSynchronize
};

struct Runtime {
  std::recursive_mutex mu;
  std::vector<FakeCudaCall> calls;
  int devices = 2;
  std::map<const char*, Allocation, std::less<>> allocations;  // by base address
  std::vector<FakeStream*> streams;
  std::vector<FakeEvent*> events;
  std::string fail_api;
  int fail_after = 0;
  cudaError_t fail_error = cudaSuccess;

  Runtime() {
    if (const char* n = std::getenv("FAKE_CUDA_DEVICES")) devices = std::atoi(n);
  }
};

Runtime& rt() {
  static Runtime* r = new Runtime;  // never destroyed: buffers may be freed during exit
  return *r;
}

thread_local int current_device = 0;
thread_local cudaError_t last_error = cudaSuccess;

[[noreturn]] void misuse(const std::string& what) {
  std::fprintf(stderr, "fake_cudart: API misuse: %s\n", what.c_str());
  std::abort();
}

cudaError_t result(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}

/// The injected error for `api`, once.
bool injected(const char* api, cudaError_t* e) {
  Runtime& r = rt();
  if (r.fail_api.empty() || r.fail_api != api) return false;
  if (r.fail_after-- > 0) return false;
  *e = r.fail_error;
  r.fail_api.clear();
  return true;
}

/// The live allocation containing [p, p + n), or misuse.
const Allocation& find(const void* p, std::size_t n, const char* what) {
  Runtime& r = rt();
  auto c = static_cast<const char*>(p);
  auto it = r.allocations.upper_bound(c);
  if (it == r.allocations.begin()) misuse(std::string(what) + ": pointer is not allocated");
  --it;
  if (c + n > it->first + it->second.size)
    misuse(std::string(what) + ": range is outside its allocation (freed or too short)");
  return it->second;
}

bool is_device_ptr(const void* p) {
  Runtime& r = rt();
  auto c = static_cast<const char*>(p);
  auto it = r.allocations.upper_bound(c);
  if (it == r.allocations.begin()) return false;
  --it;
  return c < it->first + it->second.size && it->second.device >= 0;
}

void log_call(const char* api, void* stream, void* event) {
  rt().calls.push_back({api, stream, event});
}

cudaError_t run_until(FakeStream* s, std::uint64_t position) {
  while (s->completed < position) {
    auto op = std::move(s->pending.front());
    s->pending.erase(s->pending.begin());
    ++s->completed;
    cudaError_t e = op();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

void* alloc(std::size_t size, int device) {
  void* p = std::malloc(size == 0 ? 1 : size);
  rt().allocations.emplace(static_cast<const char*>(p), Allocation{size == 0 ? 1 : size, device});
  return p;
}

cudaError_t release(void* p, bool device, const char* api) {
  if (p == nullptr) return cudaSuccess;
  Runtime& r = rt();
  auto it = r.allocations.find(static_cast<const char*>(p));
  if (it == r.allocations.end() || (it->second.device >= 0) != device)
    misuse(std::string(api) + ": pointer was not allocated by its allocator (double free?)");
  r.allocations.erase(it);
  std::free(p);
  return cudaSuccess;
}

}  // namespace

extern "C" {

/// Makes the call of `api` after the next `after` ones fail with `error` (tests only).
void fake_cuda_fail_next(const char* api, cudaError_t error, int after) {
  std::lock_guard lock(rt().mu);
  rt().fail_api = api;
  rt().fail_after = after;
  rt().fail_error = error;
}

/// Live device allocations, pinned allocations, streams and events (tests only).
void fake_cuda_live(int* device_blocks, int* pinned_blocks, int* streams, int* events) {
  std::lock_guard lock(rt().mu);
  *device_blocks = *pinned_blocks = 0;
  for (const auto& [p, a] : rt().allocations) ++(a.device >= 0 ? *device_blocks : *pinned_blocks);
  *streams = static_cast<int>(rt().streams.size());
  *events = static_cast<int>(rt().events.size());
}

/// The calls logged since the last fake_cuda_clear_calls() (tests only): `*n` entries of
/// {api name, stream, event}, valid until the next CUDA call.
void fake_cuda_calls(const FakeCudaCall** calls, int* n) {
  std::lock_guard lock(rt().mu);
  *calls = rt().calls.data();
  *n = static_cast<int>(rt().calls.size());
}

/// Empties the call log (tests only).
void fake_cuda_clear_calls(void) {
  std::lock_guard lock(rt().mu);
  rt().calls.clear();
}

cudaError_t cudaGetLastError(void) { return std::exchange(last_error, cudaSuccess); }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorIllegalAddress:
      return "cudaErrorIllegalAddress";
    default:
      return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    default:
      return "unknown error";
  }
}

cudaError_t cudaGetDeviceCount(int* count) {
  std::lock_guard lock(rt().mu);
  *count = rt().devices;
  return rt().devices > 0 ? cudaSuccess : result(cudaErrorNoDevice);
}

cudaError_t cudaGetDevice(int* device) {
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  std::lock_guard lock(rt().mu);
  cudaError_t e;
  if (injected("cudaSetDevice", &e)) return result(e);
  if (device < 0 || device >= rt().devices) return result(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, std::size_t size) {
  std::lock_guard lock(rt().mu);
  cudaError_t e;
  if (injected("cudaMalloc", &e)) return result(e);
  *p = alloc(size, current_device);
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  std::lock_guard lock(rt().mu);
  if (p != nullptr && find(p, 0, "cudaFree").device != current_device)
    misuse("cudaFree of another device's memory: cudaSetDevice first");
  return release(p, true, "cudaFree");
}

cudaError_t cudaHostAlloc(void** p, std::size_t size, unsigned int flags) {
  std::lock_guard lock(rt().mu);
  cudaError_t e;
  if (injected("cudaHostAlloc", &e)) return result(e);
  if ((flags & cudaHostAllocPortable) == 0) misuse("cudaHostAlloc without Portable");
  *p = alloc(size, -1);
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
  std::lock_guard lock(rt().mu);
  return release(p, false, "cudaFreeHost");
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  std::lock_guard lock(rt().mu);
  cudaError_t e;
  if (injected("cudaStreamCreateWithFlags", &e)) return result(e);
  if ((flags & cudaStreamNonBlocking) == 0) misuse("stream is not non-blocking");
  auto* s = new FakeStream{current_device};
  rt().streams.push_back(s);
  *stream = reinterpret_cast<cudaStream_t>(s);
  return cudaSuccess;
}

/// The stream `stream` names, or misuse (the fake has no default stream).
FakeStream* live_stream(cudaStream_t stream, const char* api) {
  auto* s = reinterpret_cast<FakeStream*>(stream);
  auto& v = rt().streams;
  if (std::find(v.begin(), v.end(), s) == v.end())
    misuse(std::string(api) + " of an unknown stream (destroyed, or the default stream)");
  return s;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  std::lock_guard lock(rt().mu);
  log_call("cudaStreamSynchronize", stream, nullptr);
  auto* s = live_stream(stream, "cudaStreamSynchronize");
  return result(run_until(s, s->issued));
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  std::lock_guard lock(rt().mu);
  auto* s = reinterpret_cast<FakeStream*>(stream);
  auto& v = rt().streams;
  auto it = std::find(v.begin(), v.end(), s);
  if (it == v.end()) misuse("cudaStreamDestroy of an unknown stream");
  (void)run_until(s, s->issued);
  for (FakeEvent* ev : rt().events)
    if (ev->stream == s) ev->stream = nullptr;
  v.erase(it);
  delete s;
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  std::lock_guard lock(rt().mu);
  (void)flags;
  auto* ev = new FakeEvent{current_device};
  rt().events.push_back(ev);
  *event = reinterpret_cast<cudaEvent_t>(ev);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  std::lock_guard lock(rt().mu);
  auto* ev = reinterpret_cast<FakeEvent*>(event);
  auto& v = rt().events;
  auto it = std::find(v.begin(), v.end(), ev);
  if (it == v.end()) misuse("cudaEventDestroy of an unknown event (double destroy?)");
  v.erase(it);
  delete ev;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  std::lock_guard lock(rt().mu);
  cudaError_t e;
  if (injected("cudaEventRecord", &e)) return result(e);
  log_call("cudaEventRecord", stream, event);
  auto* ev = reinterpret_cast<FakeEvent*>(event);
  auto* s = live_stream(stream, "cudaEventRecord");
  if (std::find(rt().events.begin(), rt().events.end(), ev) == rt().events.end())
    misuse("cudaEventRecord of an unknown event");
  if (ev->device != s->device || current_device != s->device)
    misuse("cudaEventRecord: event, stream and current device differ");
  ev->stream = s;
  ev->position = s->issued;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  std::lock_guard lock(rt().mu);
  log_call("cudaEventSynchronize", nullptr, event);
  auto* ev = reinterpret_cast<FakeEvent*>(event);
  if (std::find(rt().events.begin(), rt().events.end(), ev) == rt().events.end())
    misuse("cudaEventSynchronize of an unknown event (used after destroy?)");
  cudaError_t e;
  if (injected("cudaEventSynchronize", &e)) return result(e);
  if (ev->stream == nullptr) return cudaSuccess;
  return result(run_until(ev->stream, ev->position));
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  std::lock_guard lock(rt().mu);
  auto* ev = reinterpret_cast<FakeEvent*>(event);
  if (std::find(rt().events.begin(), rt().events.end(), ev) == rt().events.end())
    misuse("cudaEventQuery of an unknown event (used after destroy?)");
  if (ev->stream == nullptr || ev->stream->completed >= ev->position) return cudaSuccess;
  return cudaErrorNotReady;  // not an error: not recorded as the last one
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  std::lock_guard lock(rt().mu);
  log_call("cudaStreamWaitEvent", stream, event);
  cudaError_t e;
  if (injected("cudaStreamWaitEvent", &e)) return result(e);
  if (flags != 0) misuse("cudaStreamWaitEvent: unexpected flags");
  auto* s = live_stream(stream, "cudaStreamWaitEvent");
  auto* ev = reinterpret_cast<FakeEvent*>(event);
  if (std::find(rt().events.begin(), rt().events.end(), ev) == rt().events.end())
    misuse("cudaStreamWaitEvent of an unknown event");
  // The wait is on the event as recorded now; a later record does not move it.
  FakeStream* on = ev->stream;
  const std::uint64_t position = ev->position;
  if (on == nullptr || on == s) return cudaSuccess;
  ++s->issued;
  s->pending.push_back([on, position] {
    // The event's stream may be gone: cudaStreamDestroy ran its work first.
    auto& v = rt().streams;
    if (std::find(v.begin(), v.end(), on) == v.end()) return cudaSuccess;
    return run_until(on, position);
  });
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  std::lock_guard lock(rt().mu);
  cudaError_t e;
  if (injected("cudaMemcpyAsync", &e)) return result(e);
  auto* s = reinterpret_cast<FakeStream*>(stream);
  if (current_device != s->device) misuse("cudaMemcpyAsync: stream of another device");
  if (kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDefault)
    misuse("cudaMemcpyAsync: unexpected kind");
  if (find(dst, n, "cudaMemcpyAsync dst").device != s->device)
    misuse("cudaMemcpyAsync: destination on another device");
  if (kind == cudaMemcpyHostToDevice && is_device_ptr(src))
    misuse("cudaMemcpyAsync: HostToDevice from device memory");
  ++s->issued;
  s->pending.push_back([dst, src, n, device = s->device] {
    // Runs later: the buffers must still be live and still hold what the caller meant.
    if (find(dst, n, "cudaMemcpyAsync dst (at completion)").device != device)
      misuse("cudaMemcpyAsync: destination reallocated on another device");
    if (is_device_ptr(src)) (void)find(src, n, "cudaMemcpyAsync src (at completion)");
    std::memcpy(dst, src, n);
    return cudaSuccess;
  });
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t n, cudaMemcpyKind kind) {
  std::lock_guard lock(rt().mu);
  if (kind != cudaMemcpyDeviceToHost) misuse("cudaMemcpy: only DeviceToHost is faked");
  (void)find(src, n, "cudaMemcpy src");
  std::memcpy(dst, src, n);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* p) {
  std::lock_guard lock(rt().mu);
  *attr = {};
  attr->type = cudaMemoryTypeUnregistered;
  Runtime& r = rt();
  auto c = static_cast<const char*>(p);
  auto it = r.allocations.upper_bound(c);
  if (it != r.allocations.begin()) {
    --it;
    if (c < it->first + it->second.size) {
      attr->type = it->second.device >= 0 ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
      attr->device = std::max(it->second.device, 0);
    }
  }
  return cudaSuccess;
}

}  // extern "C"
