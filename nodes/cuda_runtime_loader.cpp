// The CUDA runtime, loaded when first used. device_copy_cuda.cpp calls the runtime API as
// declared in <cuda_runtime_api.h>; the definitions here forward each call to libcudart,
// opened with dlopen on the first call. So flowstate links no CUDA library: a program that
// uses flowstate needs no CUDA Toolkit to build and no libcudart to run until it copies to a
// device, and then a missing runtime is an error that says so (through cudaGetErrorString)
// rather than a program that does not start.
//
// The definitions are weak: a program that defines the runtime itself (the tests' strict fake,
// tests/nodes/cuda/fake_cudart.cpp) keeps its own; one that links libcudart reaches the same
// library through dlopen, which returns the handle already loaded.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <mutex>
#include <string>

#ifndef FLOWSTATE_CUDART_SONAME
#error "FLOWSTATE_CUDART_SONAME names the runtime library (nodes/CMakeLists.txt)"
#endif

namespace {

struct Runtime {
  void* handle = nullptr;
  std::string error;  ///< why it could not be loaded
};

const Runtime& runtime() {
  static const Runtime r = [] {
    Runtime out;
    out.handle = ::dlopen(FLOWSTATE_CUDART_SONAME, RTLD_NOW | RTLD_LOCAL);
#ifdef FLOWSTATE_CUDART_BUILD_PATH
    // Not on the library path: the toolkit flowstate was built against.
    if (!out.handle) out.handle = ::dlopen(FLOWSTATE_CUDART_BUILD_PATH, RTLD_NOW | RTLD_LOCAL);
#endif
    if (!out.handle) {
      const char* why = ::dlerror();
      out.error =
          std::string("the CUDA runtime (" FLOWSTATE_CUDART_SONAME ") could not be loaded: ") +
          (why ? why : "unknown reason");
    }
    return out;
  }();
  return r;
}

void* symbol(const char* name) {
  const Runtime& r = runtime();
  return r.handle ? ::dlsym(r.handle, name) : nullptr;
}

// What a call returns when the runtime is missing: the runtime's own code for "no usable
// driver"; cudaGetErrorString below gives the loader's reason for it.
constexpr cudaError_t kMissing = cudaErrorInsufficientDriver;

}  // namespace

#define FLOWSTATE_CUDART_FORWARD(name, params, args)                           \
  extern "C" __attribute__((weak)) cudaError_t CUDARTAPI name params {         \
    static const auto fn = reinterpret_cast<decltype(&::name)>(symbol(#name)); \
    return fn ? fn args : kMissing;                                            \
  }

FLOWSTATE_CUDART_FORWARD(cudaGetDeviceCount, (int* count), (count))
FLOWSTATE_CUDART_FORWARD(cudaGetDevice, (int* device), (device))
FLOWSTATE_CUDART_FORWARD(cudaSetDevice, (int device), (device))
FLOWSTATE_CUDART_FORWARD(cudaGetLastError, (), ())
FLOWSTATE_CUDART_FORWARD(cudaMalloc, (void** ptr, size_t size), (ptr, size))
FLOWSTATE_CUDART_FORWARD(cudaFree, (void* ptr), (ptr))
FLOWSTATE_CUDART_FORWARD(cudaHostAlloc, (void** ptr, size_t size, unsigned int flags),
                         (ptr, size, flags))
FLOWSTATE_CUDART_FORWARD(cudaFreeHost, (void* ptr), (ptr))
FLOWSTATE_CUDART_FORWARD(cudaMemcpy,
                         (void* dst, const void* src, size_t count, cudaMemcpyKind kind),
                         (dst, src, count, kind))
FLOWSTATE_CUDART_FORWARD(cudaMemcpyAsync,
                         (void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                          cudaStream_t stream),
                         (dst, src, count, kind, stream))
FLOWSTATE_CUDART_FORWARD(cudaStreamCreateWithFlags, (cudaStream_t * stream, unsigned int flags),
                         (stream, flags))
FLOWSTATE_CUDART_FORWARD(cudaStreamDestroy, (cudaStream_t stream), (stream))
FLOWSTATE_CUDART_FORWARD(cudaStreamSynchronize, (cudaStream_t stream), (stream))
FLOWSTATE_CUDART_FORWARD(cudaStreamWaitEvent,
                         (cudaStream_t stream, cudaEvent_t event, unsigned int flags),
                         (stream, event, flags))
FLOWSTATE_CUDART_FORWARD(cudaEventCreateWithFlags, (cudaEvent_t * event, unsigned int flags),
                         (event, flags))
FLOWSTATE_CUDART_FORWARD(cudaEventDestroy, (cudaEvent_t event), (event))
FLOWSTATE_CUDART_FORWARD(cudaEventRecord, (cudaEvent_t event, cudaStream_t stream), (event, stream))
FLOWSTATE_CUDART_FORWARD(cudaEventSynchronize, (cudaEvent_t event), (event))
FLOWSTATE_CUDART_FORWARD(cudaEventQuery, (cudaEvent_t event), (event))

#undef FLOWSTATE_CUDART_FORWARD

extern "C" __attribute__((weak)) const char* CUDARTAPI cudaGetErrorString(cudaError_t error) {
  static const auto fn =
      reinterpret_cast<decltype(&::cudaGetErrorString)>(symbol("cudaGetErrorString"));
  if (fn) return fn(error);
  return error == kMissing ? runtime().error.c_str() : "CUDA runtime not loaded";
}

extern "C" __attribute__((weak)) const char* CUDARTAPI cudaGetErrorName(cudaError_t error) {
  static const auto fn =
      reinterpret_cast<decltype(&::cudaGetErrorName)>(symbol("cudaGetErrorName"));
  if (fn) return fn(error);
  return error == kMissing ? "cudaErrorInsufficientDriver" : "cudaErrorUnknown";
}
