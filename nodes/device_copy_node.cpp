// The definition of `device_copy`, shared by the CUDA and the host-only builds
// (device_copy_cuda.cpp and device_copy.cpp implement DeviceCopy, its deliver stage).
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

std::optional<std::string> DeviceCopyOptions::on_host() const {
  // A build without CUDA hands out host memory anyway.
  if (device == "cpu" || !cuda_compiled()) return std::nullopt;
  return "device=cpu";
}

const NodeDef& device_copy_node() {
  static const NodeDef def = define_node<DeviceCopyOptions>(
      {.type = "device_copy",
       .phase = Phase::kPerBatch,
       .doc = "moves every batch to the accelerator (host memory without one, for auto)",
       .placement = {.unique = true, .last = true, .in_mix_input = false}},
      [](BuildContext& ctx, const DeviceCopyOptions& o) {
        AssemblyStage stage;
        stage.deliver = std::make_shared<DeviceCopy>(o);
        ctx.add_stage(std::move(stage));
      });
  return def;
}

}  // namespace flowstate
