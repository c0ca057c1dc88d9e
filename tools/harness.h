// The pipeline benchmark harness: runs a Pipeline's Loader for a fixed number of batches and
// reports throughput (samples/s, MB/s), time to first batch, memory, and where the time went
// (per-stage busy time and who waited on whom, from Loader::stats()). Part of the library, so
// `flowstate bench`, the programs in bench/ and a user's own program measure the same way.
//
//   BenchReport r = run_bench(pipeline, {.steps = 500, .warmup = 50, .repeat = 3});
//   std::puts(format_report(r).c_str());
//   write_json(r, "bench.json");
//
// The consumer does nothing with a batch but take it (and drop it), like a training loop
// whose step is free: the numbers are the pipeline's ceiling, not a training job's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "flowstate/graph/loader.h"

namespace flowstate::bench {

/// What run_bench measures.
struct BenchOptions {
  /// Batches timed per repeat; 0: every batch until the loader ends (needs `epochs` > 0).
  std::uint64_t steps = 1000;
  /// Batches consumed (untimed) before the timed ones, after the first batch.
  std::uint64_t warmup = 50;
  /// Independent runs, each with a fresh Loader; the report gives the median and the spread.
  int repeat = 3;
  /// LoaderOptions::epochs; 0 runs forever (the usual choice with a fixed `steps`).
  std::uint64_t epochs = 0;
  std::optional<int> workers;           ///< overrides the pipeline's workers
  std::optional<std::size_t> prefetch;  ///< overrides the pipeline's prefetch depth
  /// Writes the timeline of the median run (the one the report details) to this file
  /// (LoaderOptions::trace) when not empty.
  std::string trace;
  bool node_stats = true;  ///< LoaderOptions::node_stats (off: for its A/B only)
};

/// One stage of the graph during the timed part of a run (see LoaderStats::Stage).
struct StageReport {
  std::string name;
  std::uint64_t items = 0;
  double busy_s = 0;       ///< summed over the stage's workers
  int concurrency = 1;     ///< workers
  double utilization = 0;  ///< busy_s / (wall seconds × concurrency)
  double us_per_item = 0;  ///< busy time per message
};

/// One node of the pipeline during the timed part of a run (see LoaderStats::Node).
struct NodeReport {
  std::string name;   ///< "map:augment"
  std::string stage;  ///< "spine", "assemble", "deliver"
  int threads = 1;    ///< threads of its stage
  std::uint64_t calls = 0, items = 0, bytes = 0;
  double busy_s = 0;                                  ///< own time, all stages
  double spine_s = 0, assemble_s = 0, deliver_s = 0;  ///< busy_s by stage
  double utilization = 0;  ///< the busiest stage's share: its time / (wall × its threads)
  double wait_input_s = 0, wait_output_s = 0;
};

/// One timed run.
struct RunReport {
  double first_batch_s = 0;   ///< Loader construction + first next()
  std::uint64_t batches = 0;  ///< timed batches
  std::uint64_t samples = 0;  ///< samples in them
  std::uint64_t bytes = 0;    ///< bytes of their fields
  double seconds = 0;         ///< wall time of the timed batches
  double samples_per_s = 0;
  double mb_per_s = 0;  ///< 1e6 bytes per second
  /// Process CPU time (user + system, every thread) during the timed batches: less sensitive
  /// to other load on the machine than wall time, and it counts spinning and hand-offs too.
  double cpu_s = 0;
  double cpu_ns_per_sample = 0;
  std::vector<StageReport> stages;
  std::vector<NodeReport> nodes;
  double consumer_busy_s = 0;        ///< the consumer's time outside next()
  std::uint64_t consumer_waits = 0;  ///< next() found nothing ready (pipeline-bound)
  double consumer_wait_s = 0;        ///< time next() spent waiting
  std::uint64_t graph_waits = 0;     ///< every slot ready and waiting (consumer-bound)
  std::size_t in_flight_limit = 0;   ///< messages in flight at most
  std::uint64_t messages = 0;        ///< graph messages in the run (cheap batches travel in groups)
  /// Workers and prefetch depth at the run's end: with `auto`, the tuner's choice.
  int workers = 0;
  std::size_t prefetch_depth = 0;
  bool workers_auto = false, prefetch_auto = false;
  bool workers_inline = false;         ///< `workers: inline`: batches made on the consumer's thread
  std::uint64_t autotune_changes = 0;  ///< settings the tuner changed in the whole run
  std::uint64_t peak_rss_bytes = 0;    ///< VmHWM during this run (reset before it when possible)
  std::uint64_t peak_anon_bytes = 0;   ///< largest RssAnon sampled during the run
};

/// Median and spread over the runs.
struct Summary {
  double median = 0, min = 0, max = 0;
};
/// The median, min and max of `values`; all 0 when it is empty.
Summary summarize(std::vector<double> values);

/// Everything run_bench measured.
struct BenchReport {
  std::string pipeline;  ///< Pipeline::describe()
  std::uint64_t fingerprint = 0;
  BenchOptions options;
  int workers = 0;  ///< batch-assembly workers used (auto: the median run's final choice)
  std::vector<RunReport> runs;
  Summary samples_per_s;
  Summary mb_per_s;
  Summary first_batch_s;
  Summary cpu_ns_per_sample;
  std::uint64_t peak_rss_bytes = 0;   ///< process high-water mark (ru_maxrss) at the end
  std::uint64_t peak_anon_bytes = 0;  ///< max over runs
};

/// Runs the benchmark. Throws what the Loader throws (ConfigError, DataError, ...), and
/// ConfigError when the options make no sense (repeat < 1; steps 0 with epochs 0).
BenchReport run_bench(const Pipeline& pipeline, const BenchOptions& options = {});

/// The report as JSON (one object; numbers in SI units: s, bytes, samples/s).
std::string to_json(const BenchReport& report);
/// Writes to_json(report) to `path` ("-" for stdout). Throws std::runtime_error on failure.
void write_json(const BenchReport& report, const std::string& path);
/// A human-readable summary: throughput, first batch, memory, a table of stages, and the
/// bottleneck() line.
std::string format_report(const BenchReport& report);

/// Where the median run's time went, in one line. "bottleneck: the consumer — the graph
/// waited on it N times, it on the graph M" when the graph waited on the consumer more often
/// than the other way round; else the busiest stage in which a node works (spine, assembly
/// workers, deliver with device_copy) and in it the node with the most own time: "bottleneck:
/// map:augment — 71% busy on 2 workers (the workers 94%); more workers would help" or "bottleneck:
/// filter:length — 80% of the spine (serial, 97% busy); more workers would not help". "" when there
/// was no timed run.
std::string bottleneck(const BenchReport& report);

/// The run whose samples/s is the median (the one format_report details); null when none.
const RunReport* median_run(const BenchReport& report);

/// The process's peak resident set (VmHWM, else ru_maxrss), in bytes.
std::uint64_t peak_rss_bytes();
/// Current anonymous resident memory (RssAnon: heap, stacks — not mapped files), in bytes;
/// 0 when /proc is unavailable.
std::uint64_t anon_rss_bytes();
/// CPU time of the whole process so far (user + system), in seconds.
double process_cpu_s();
/// Resets the VmHWM high-water mark to the current RSS (Linux: /proc/self/clear_refs);
/// returns false when unsupported.
bool reset_peak_rss();

}  // namespace flowstate::bench
