// Host-only build of device_copy (FLOWSTATE_WITH_CUDA=OFF or no toolkit). The CUDA build uses
// device_copy_cuda.cpp instead.
#include "nodes/device_copy.h"

#include "core/error.h"

namespace flowstate {

NodeDescription DeviceCopyOptions::describe() const {
  return {"device_copy", {{"device", device, true}}};
}

bool cuda_compiled() { return false; }
int cuda_device_count() { return 0; }

struct DeviceCopy::Impl {};

DeviceCopy::DeviceCopy(const DeviceCopyOptions& options) : staging_(BufferPool::host()) {
  if (options.device == "auto" || options.device == "cpu") return;
  if (options.device.rfind("cuda:", 0) == 0)
    throw ConfigError("device_copy.device", "device '" + options.device +
                                                "' requested, but flowstate was built without "
                                                "CUDA (FLOWSTATE_WITH_CUDA=OFF or no toolkit)");
  throw ConfigError("device_copy.device",
                    "unknown device '" + options.device + "' (known: auto, cpu, cuda:N)");
}

DeviceCopy::~DeviceCopy() = default;

Batch DeviceCopy::copy(Batch batch) { return batch; }

}  // namespace flowstate
