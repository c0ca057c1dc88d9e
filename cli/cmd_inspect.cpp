// `flowstate inspect`: what a checkpoint (or a raw state file) holds — its step, the pipeline
// it belongs to, the state of every stateful node, the skipped ranges — as text or JSON. What
// is shown is config/inspect.h's describe_state, which Python's describe_state shows too.
#include <filesystem>
#include <fstream>
#include <iterator>

#include "cli/command.h"
#include "flowstate/config/inspect.h"
#include "flowstate/core/error.h"
#include "flowstate/serialization/checkpoint.h"

namespace flowstate::cli {
namespace {

constexpr const char* kUsage =
    "usage: flowstate inspect CHECKPOINT|STATE_FILE [--json]\n\n"
    "CHECKPOINT is a step-N directory, or a checkpoint directory (its newest valid\n"
    "checkpoint is shown). STATE_FILE holds the bytes of a saved state (C++\n"
    "Loader::state(), Python Loader.state() or a state_dict()'s \"state\"). Prints the\n"
    "step, the epoch, the fingerprint, the canonical pipeline, every stateful node's\n"
    "state and the skipped step ranges. (A torch.save'd state_dict: in Python,\n"
    "flowstate.describe_state(torch.load(FILE)[KEY]) shows the same.)\n\n"
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

/// The bytes of a raw state file. A file torch.save or pickle wrote is refused with the way to
/// show it (PipelineState::decode refuses anything else that is not a state).
std::string read_state_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (!in.good() && !in.eof()) throw CheckpointError(path, "cannot read '" + path + "'");
  const bool zip = bytes.rfind("PK\x03\x04", 0) == 0;  // torch.save's format
  const bool pickle = !bytes.empty() && bytes[0] == '\x80';
  if (zip || pickle)
    throw CheckpointError(path, "'" + path + "' is not a flowstate state: it looks like a file " +
                                    (zip ? "torch.save" : "pickle") +
                                    " wrote; show the state_dict in it with "
                                    "flowstate.describe_state(torch.load(FILE)[KEY]) in Python");
  if (bytes.rfind("FLWSREFS", 0) == 0) {
    // A checkpoint's state.bin whose data identity is stored in the directory's blobs/.
    const std::string step = std::filesystem::path(path).parent_path().string();
    throw CheckpointError(path, "'" + path +
                                    "' is a checkpoint's stored state, which refers to blobs "
                                    "of its checkpoint directory: inspect the step directory '" +
                                    step + "' instead");
  }
  return bytes;
}

}  // namespace

int cmd_inspect(std::span<const std::string> argv) {
  Args args(argv, {}, {"--json"});
  if (args.help()) {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  if (args.positional().size() != 1)
    throw UsageError("expected one checkpoint directory or state file");
  const std::string& path = args.positional()[0];
  std::string description;
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) {
    description =
        describe_state(read_state_file(path), {.kind = StateSource::Kind::kFile, .path = path});
  } else {
    const CheckpointFound found = open_checkpoint(path);
    description = describe_state(found.state, {.kind = StateSource::Kind::kCheckpoint,
                                               .path = found.path,
                                               .step = found.step,
                                               .skipped = found.skipped});
  }
  if (args.has("--json")) {
    std::puts(description.c_str());
    return kExitOk;
  }
  std::fputs(render_state_description(description).c_str(), stdout);
  return kExitOk;
}

}  // namespace flowstate::cli
