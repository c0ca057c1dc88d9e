// `flowstate validate`: checks a YAML pipeline and prints the resolved graph — every node with
// every parameter, defaults filled in — and its fingerprint. Unless told not to, it also builds
// the graph on the data and assembles the first batch, as `run` does when it starts, so what
// `run` would refuse at start-up (a glob that matches nothing, a decode shape the records do
// not fit) is refused here with the same message and exit status.
#include "cli/command.h"
#include "flowstate/core/hash.h"
#include "flowstate/graph/loader.h"

namespace flowstate::cli {
namespace {

constexpr const char* kUsage =
    "usage: flowstate validate PIPELINE.yaml [--set KEY=VALUE]... [--no-data]\n\n"
    "Checks the pipeline and prints the resolved graph (every node with every parameter,\n"
    "defaults filled in, free parameters marked) and its fingerprint: what a checkpoint\n"
    "must match to be restored by this pipeline. Then it opens the data and assembles the\n"
    "first batch, so anything `run` would refuse when it starts is refused here, with the\n"
    "same message and exit status (2 configuration, 3 data).\n\n"
    "  --set KEY=VALUE   override a pipeline value (repeatable; nodes[1].shuffle.size=1024,\n"
    "                    or by the node's name: shuffle.size=1024)\n"
    "  --no-data         do not open the source files (check the configuration only)\n";

}  // namespace

int cmd_validate(std::span<const std::string> argv) {
  Args args(argv, {"--set"}, {"--no-data"});
  if (args.help()) {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  if (args.positional().size() != 1) throw UsageError("expected one pipeline file");
  const PipelineConfig config = load_pipeline(args.positional()[0], args.values("--set"));
  std::string out = "pipeline: " + config.origin + "\n" + config.pipeline.describe();
  out += "epochs: " + std::to_string(config.epochs) +
         (config.epochs == 0 ? " (until stopped)" : "") + "\n";
  if (config.checkpoint) {
    out += "checkpoint:\n      dir: " + config.checkpoint->dir +
           "\n      every_steps: " + std::to_string(config.checkpoint->every_steps) +
           "\n      keep: " + std::to_string(config.checkpoint->keep) + "\n";
  }
  out += "fingerprint: " + hex64(config.pipeline.fingerprint()) + "\n";
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);
  if (!args.has("--no-data")) {
    // As `run` starts: every source opened (DataError when a file is missing), the graph
    // built and one batch assembled (every map applied to its samples).
    Loader open(config.pipeline, {.epochs = config.epochs});
    open.next();
    std::fputs("data: ok\n", stdout);
  }
  return kExitOk;
}

}  // namespace flowstate::cli
