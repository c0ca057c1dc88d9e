// Host-only build of device_copy (FLOWSTATE_WITH_CUDA=OFF or no toolkit). The CUDA build uses
// device_copy_cuda.cpp instead; both give the same messages for the same mistakes.
#include "flowstate/nodes/device_copy.h"

#include <algorithm>
#include <string_view>

#include "flowstate/core/error.h"

namespace flowstate {

namespace {

/// True for "cuda:N" with N a decimal index (the form the CUDA build accepts).
bool is_cuda_index(std::string_view s) {
  constexpr std::string_view kPrefix = "cuda:";
  if (!s.starts_with(kPrefix)) return false;
  s.remove_prefix(kPrefix.size());
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

bool cuda_compiled() { return false; }
int cuda_device_count() { return 0; }

struct DeviceCopy::Impl {};

DeviceCopy::DeviceCopy(const DeviceCopyOptions& options) : staging_(BufferPool::host()) {
  if (options.device == "auto" || options.device == "cpu") return;
  if (is_cuda_index(options.device))
    throw ConfigError("device_copy.device", "device '" + options.device +
                                                "' requested, but flowstate was built without "
                                                "CUDA (FLOWSTATE_WITH_CUDA=OFF or no toolkit)");
  throw ConfigError("device_copy.device",
                    "unknown device '" + options.device + "' (known: auto, cpu, cuda:N)");
}

DeviceCopy::~DeviceCopy() = default;

Batch DeviceCopy::copy(Batch batch) {
  if (batch.user_to_device && batch.user.has_value()) batch.user_to_device(batch.user, *this);
  return batch;
}

Tensor DeviceCopy::to_device(const Tensor& tensor) { return tensor; }

}  // namespace flowstate
