// `flowstate inspect`: what a checkpoint holds — its step, the pipeline it belongs to, the
// state of every stateful node, the skipped ranges — as text or JSON.
#include <filesystem>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "flowstate/config/inspect.h"
#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"
#include "flowstate/serialization/checkpoint.h"
#include "flowstate/serialization/pipeline_state.h"

namespace flowstate::cli {
namespace {

constexpr const char* kUsage =
    "usage: flowstate inspect CHECKPOINT [--json]\n\n"
    "CHECKPOINT is a step-N directory, or a checkpoint directory (its newest valid\n"
    "checkpoint is shown). Prints the step, the epoch, the fingerprint, the canonical\n"
    "pipeline, every stateful node's state and the skipped step ranges.\n\n"
    "  --json   one JSON object instead of text\n";

CheckpointFound open_checkpoint(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw CheckpointError(path, "'" + path + "' does not exist");
  fs::path p(path);
  if (!p.has_filename()) p = p.parent_path();
  if (p.filename().string().rfind("step-", 0) == 0) return read_checkpoint(p.string());
  std::optional<CheckpointFound> found = find_latest_checkpoint(path);
  if (!found) {
    std::string why;
    for (const auto& s : invalid_checkpoints(path)) why += "\n  " + s;
    throw CheckpointError(path,
                          "no valid checkpoint in '" + path + "'" +
                              (why.empty() ? std::string(" (no step-N directories)") : ":" + why));
  }
  return *found;
}

std::string render_value(const nlohmann::ordered_json& v) {
  if (v.is_null()) return "none";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object()) {
    std::string s;
    for (const auto& [k, x] : v.items()) s += (s.empty() ? "" : ", ") + k + " " + render_value(x);
    return "(" + s + ")";
  }
  return v.dump();
}

}  // namespace

int cmd_inspect(std::span<const std::string> argv) {
  Args args(argv, {}, {"--json"});
  if (args.help()) {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  if (args.positional().size() != 1) throw UsageError("expected one checkpoint directory");
  const CheckpointFound found = open_checkpoint(args.positional()[0]);
  const std::string state_file = (std::filesystem::path(found.path) / "state.bin").string();
  const PipelineState s = PipelineState::decode(found.state, state_file);
  const nlohmann::ordered_json nodes =
      nlohmann::ordered_json::parse(describe_node_states(s.spine, s.canonical, state_file));

  nlohmann::ordered_json j;
  j["path"] = found.path;
  j["step"] = found.step;
  j["format_version"] = s.format_version;
  j["fingerprint"] = hex64(s.fingerprint);
  j["last_step"] =
      s.last_step ? nlohmann::ordered_json(*s.last_step) : nlohmann::ordered_json(nullptr);
  j["last_epoch"] =
      s.last_epoch ? nlohmann::ordered_json(*s.last_epoch) : nlohmann::ordered_json(nullptr);
  j["skipped_checkpoints"] = found.skipped;
  nlohmann::ordered_json canonical = nlohmann::ordered_json::array();
  for (const auto& [k, v] : s.canonical) canonical.push_back({{"key", k}, {"value", v}});
  j["pipeline"] = canonical;
  nlohmann::ordered_json skips = nlohmann::ordered_json::array();
  for (const auto& [a, b] : s.skips) skips.push_back({a, b});
  j["skipped_steps"] = skips;
  j["nodes"] = nodes;

  if (args.has("--json")) {
    std::puts(j.dump(2).c_str());
    return kExitOk;
  }
  std::string out = "checkpoint: " + found.path + "\n";
  out += "step: " + std::to_string(found.step) + " (batches consumed; the next batch is step " +
         std::to_string(found.step) + ")\n";
  out += "last delivered: " +
         (s.last_step ? "step " + std::to_string(*s.last_step) + ", epoch " +
                            std::to_string(s.last_epoch.value_or(0))
                      : std::string("none")) +
         "\n";
  out += "format version: " + std::to_string(s.format_version) + "\n";
  out += "fingerprint: " + hex64(s.fingerprint) + "\n";
  for (const auto& k : found.skipped) out += "skipped newer checkpoint: " + k + "\n";
  out += "pipeline:\n";
  for (const auto& [k, v] : s.canonical) out += "  " + k + " = " + v + "\n";
  out += "skipped steps:";
  if (s.skips.empty()) out += " none";
  for (std::size_t i = 0; i < s.skips.size(); ++i)
    out += (i ? ", " : " ") + std::to_string(s.skips[i].first) + ".." +
           std::to_string(s.skips[i].second);
  out += "\nnode states:\n";
  for (const auto& n : nodes) {
    out += "  " + n["name"].get<std::string>() + " (" + n["type"].get<std::string>() + "): ";
    if (n.contains("state")) {
      std::string fields;
      for (const auto& [k, v] : n["state"].items()) {
        // A file source's data identity: the count here, every file with --json.
        const std::string value = k == "files" && v.is_array()
                                      ? std::to_string(v.size()) + " (--json lists them)"
                                      : render_value(v);
        fields += (fields.empty() ? "" : ", ") + k + " " + value;
      }
      out += fields + "\n";
    } else if (n.contains("unknown_type")) {
      out += "not decoded: no node type '" + n["type"].get<std::string>() +
             "' is registered (load its plugin with --plugin); " +
             std::to_string(n["state_bytes"].get<std::size_t>()) + " bytes\n";
    } else {
      out += "not decoded (" + std::to_string(n["undecoded_bytes"].get<std::size_t>()) +
             " bytes of node states from here on)\n";
    }
  }
  std::fputs(out.c_str(), stdout);
  return kExitOk;
}

}  // namespace flowstate::cli
