// The definition of `device_copy`, shared by the CUDA and the host-only builds.
#include <algorithm>

#include "flowstate/nodes/definition.h"
#include "flowstate/nodes/device_copy.h"

namespace flowstate {

std::string DeviceCopyOptions::check_device(const ParamValue& value) {
  const auto& s = std::get<std::string>(value);
  if (s == "auto" || s == "cpu") return "";
  if (s.rfind("cuda:", 0) == 0 && s.size() > 5 &&
      std::all_of(s.begin() + 5, s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return "";
  return "'" + s + "' is not a device (use auto, cpu or cuda:N)";
}

const NodeDef& device_copy_node() {
  static const NodeDef def = define_node<DeviceCopyOptions>(
      {.type = "device_copy",
       .phase = Phase::kPerBatch,
       .doc = "moves every batch to the accelerator (host memory without one, for auto)"},
      [](BuildContext& ctx, const DeviceCopyOptions& o) { ctx.set_device(o); });
  return def;
}

}  // namespace flowstate
