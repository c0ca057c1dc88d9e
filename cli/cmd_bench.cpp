// `flowstate bench`: measures a YAML pipeline with the benchmark harness (tools/harness.h):
// samples/s, MB/s, time to first batch, peak memory, and where the time went per stage.
#include "cli/command.h"
#include "flowstate/core/hash.h"
#include "flowstate/tools/harness.h"

namespace flowstate::cli {
namespace {

constexpr const char* kUsage =
    "usage: flowstate bench PIPELINE.yaml [options]\n\n"
    "Runs the pipeline as fast as it goes — the consumer takes each batch and drops it — and\n"
    "reports samples/s and MB/s (median, min and max over the repeats), the time to the first\n"
    "batch, peak memory, and a table of every node (busy time, calls, items, bytes, waits on\n"
    "input and output), and names the bottleneck in one line: the busiest node of the busiest\n"
    "stage ('bottleneck: map:augment — 71% busy on 2 workers (the workers 94% busy); more\n"
    "workers would help'); 'the consumer' when the graph waits on it and it is busy half the\n"
    "time or more; 'none saturated' (naming the busiest node) when no stage is. A timed part\n"
    "shorter than a second per run gets a warning: such numbers are mostly noise.\n\n"
    "  --steps N         batches timed per repeat (default 500; 0: until the epochs end)\n"
    "  --warmup W        batches consumed before the timing starts (default 50)\n"
    "  --repeat R        runs, each with a fresh loader (default 3)\n"
    "  --epochs E        epochs to run (default 0: as many as the steps need; with --steps 0,\n"
    "                    the pipeline's)\n"
    "  --workers N|auto|inline\n"
    "                    batch-assembly workers (free: never changes the batches); auto:\n"
    "                    tuned while running (the table shows the choice); inline: on the\n"
    "                    consumer's thread\n"
    "  --prefetch N|auto prefetch depth (free); auto: tuned while running\n"
    "  --set KEY=VALUE   override a pipeline value (repeatable)\n"
    "  --json FILE|-     also write the full report as JSON\n"
    "  --trace FILE.json write the median run's timeline (Chrome trace-event JSON, for\n"
    "                    Perfetto UI or chrome://tracing)\n";

}  // namespace

int cmd_bench(std::span<const std::string> argv) {
  Args args(argv, {"--steps", "--warmup", "--repeat", "--epochs", "--workers", "--prefetch",
                   "--set", "--json", "--trace"});
  if (args.help()) {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  if (args.positional().size() != 1) throw UsageError("expected one pipeline file");
  const PipelineConfig config = load_pipeline(args.positional()[0], args.values("--set"));

  bench::BenchOptions o;
  o.steps = args.uint("--steps").value_or(500);
  o.warmup = args.uint("--warmup").value_or(50);
  o.repeat = static_cast<int>(args.uint("--repeat", 1, 1000).value_or(3));
  o.epochs = args.uint("--epochs").value_or(o.steps == 0 ? config.epochs : 0);
  if (o.steps == 0 && o.epochs == 0)
    throw UsageError("--steps 0 runs until the epochs end, which needs --epochs > 0");
  if (auto w = parse_workers(args)) o.workers = static_cast<int>(*w);
  if (args.value("--prefetch") == "auto")
    o.prefetch = kAuto;
  else if (auto p = args.uint("--prefetch", 1, 1 << 20))
    o.prefetch = static_cast<std::size_t>(*p);
  o.trace = args.value("--trace").value_or("");

  note("benchmarking " + config.origin + " (fingerprint " + hex64(config.pipeline.fingerprint()) +
       "): " + std::to_string(o.repeat) + " x " +
       (o.steps == 0 ? std::string("all") : std::to_string(o.steps)) + " batches after " +
       std::to_string(o.warmup) + " warm-up");
  const bench::BenchReport report = bench::run_bench(config.pipeline, o);
  const std::optional<std::string> json = args.value("--json");
  // With --json -, stdout carries the JSON alone and the summary goes to stderr.
  std::FILE* text = json && *json == "-" ? stderr : stdout;
  std::fputs(bench::format_report(report).c_str(), text);
  std::fflush(text);
  if (const bench::RunReport* run = bench::median_run(report); run != nullptr && run->seconds < 1) {
    char took[32], warning[200];
    if (run->seconds >= 0.1)
      std::snprintf(took, sizeof(took), "%.2f s", run->seconds);
    else
      std::snprintf(took, sizeof(took), "%.2f ms", run->seconds * 1e3);
    std::snprintf(warning, sizeof(warning),
                  "warning: the timed part took %s, shorter than a second: the numbers are "
                  "noisy; time more batches (--steps)",
                  took);
    note(warning);
  }
  if (json) bench::write_json(report, *json);
  if (!o.trace.empty()) note("wrote the timeline of the median run to " + o.trace);
  return kExitOk;
}

}  // namespace flowstate::cli
