// `flowstate verify`: proves exact resume for the user's own YAML pipeline with
// flowstate::verify (tools/verify.h): an uninterrupted run of N steps gives the reference
// digests; checkpoints written through real files at random steps are each restored into a
// fresh Loader (with another worker count) that runs on to step N, and every restored batch
// must equal the reference. This file parses the flags and prints the report.
#include "cli/command.h"
#include "flowstate/tools/verify.h"

namespace flowstate::cli {
namespace {

constexpr const char* kUsage =
    "usage: flowstate verify PIPELINE.yaml --steps N [--trials T] [--seed S] [options]\n\n"
    "Runs the pipeline uninterrupted for N steps, then T times: checkpoints it at a random\n"
    "step k through real checkpoint files, restores the checkpoint into a new loader\n"
    "(with 1, 3, 2 workers, then inline, in turn) and runs it on to step N, comparing every\n"
    "batch with the uninterrupted run. Prints every mismatch; exit status 1 when there is one.\n\n"
    "  --steps N          batches of the reference run (required)\n"
    "  --trials T         restores to check (default 5)\n"
    "  --seed S           seed choosing the restore steps (default 1)\n"
    "  --epochs E         epochs (default: the pipeline's)\n"
    "  --workers W        workers of the reference run: N, auto or inline (default: the\n"
    "                     pipeline's)\n"
    "  --set KEY=VALUE    override a pipeline value (repeatable)\n"
    "  --mix-weights S:NODE=W,W  from step S on, mix NODE draws with weights W,W, in every\n"
    "                     run compared (repeatable; as `flowstate run`'s)\n"
    "  --weights-schedule FILE   lines 'S:NODE=W,W' ('#' starts a comment)\n";

}  // namespace

int cmd_verify(std::span<const std::string> argv) {
  Args args(argv, {"--steps", "--trials", "--seed", "--epochs", "--workers", "--set",
                   "--mix-weights", "--weights-schedule"});
  if (args.help()) {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  if (args.positional().size() != 1) throw UsageError("expected one pipeline file");
  args.required("--steps");
  VerifyOptions options;
  options.steps = *args.uint("--steps", 1);
  options.trials = static_cast<int>(args.uint("--trials", 1, 10'000).value_or(5));
  options.seed = args.uint("--seed").value_or(1);

  const PipelineConfig config = load_pipeline_on_host(args.positional()[0], args.values("--set"));
  options.epochs = args.uint("--epochs").value_or(config.epochs);
  if (auto w = parse_workers(args)) options.workers = static_cast<int>(*w);
  options.mix_weights = mix_weights_flags(args);
  // Each line as soon as it is known: a long verify shows its progress.
  options.progress = [](const std::string& line) { std::printf("%s\n", line.c_str()); };

  const VerifyReport report = verify(config.pipeline, options);
  std::fflush(stdout);
  if (!report.ok()) {
    note("verify FAILED: " + std::to_string(report.mismatches.size()) +
         " batches differ from the uninterrupted run");
    return kExitFailed;
  }
  note("verify ok: " + std::to_string(report.trials.size()) +
       " restores reproduced the uninterrupted run exactly (--seed " +
       std::to_string(options.seed) + ")");
  return kExitOk;
}

}  // namespace flowstate::cli
