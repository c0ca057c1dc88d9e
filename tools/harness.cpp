#include "flowstate/tools/harness.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"

namespace flowstate::bench {

namespace {

using Clock = std::chrono::steady_clock;

double s_of(std::uint64_t ns) { return static_cast<double>(ns) * 1e-9; }

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// A "Key:   123 kB" line of /proc/self/status, in bytes; 0 when absent.
std::uint64_t proc_status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::size_t n = std::char_traits<char>::length(key);
  while (std::getline(in, line)) {
    if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':')
      return std::stoull(line.substr(n + 1)) * 1024;
  }
  return 0;
}

std::uint64_t batch_bytes(const Batch& b) {
  std::uint64_t n = 0;
  for (const auto& [id, t] : b.fields) n += t.nbytes();
  return n;
}

/// Stage counters of `after` minus those of `before` (the timed part of a run).
std::vector<StageReport> stage_delta(const LoaderStats& before, const LoaderStats& after,
                                     double wall_s) {
  std::vector<StageReport> out;
  for (const auto& a : after.stages) {
    StageReport r{a.name};
    std::uint64_t items = a.items, ns = a.busy_ns;
    for (const auto& b : before.stages) {
      if (b.name == a.name) {
        items -= std::min(items, b.items);
        ns -= std::min(ns, b.busy_ns);
      }
    }
    r.items = items;
    r.busy_s = static_cast<double>(ns) * 1e-9;
    r.concurrency = a.concurrency;
    r.utilization = wall_s > 0 ? r.busy_s / (wall_s * std::max(1, a.concurrency)) : 0;
    r.us_per_item = items > 0 ? r.busy_s * 1e6 / static_cast<double>(items) : 0;
    out.push_back(std::move(r));
  }
  return out;
}

/// Node counters of `after` minus those of `before`.
std::vector<NodeReport> node_delta(const LoaderStats& before, const LoaderStats& after,
                                   double wall_s) {
  std::vector<NodeReport> out;
  const auto s = [](std::uint64_t a, std::uint64_t b) {
    return static_cast<double>(a - std::min(a, b)) * 1e-9;
  };
  for (std::size_t i = 0; i < after.nodes.size(); ++i) {
    const LoaderStats::Node& a = after.nodes[i];
    const LoaderStats::Node b = i < before.nodes.size() ? before.nodes[i] : LoaderStats::Node{};
    NodeReport r{a.name, a.stage, a.threads};
    r.calls = a.calls - std::min(a.calls, b.calls);
    r.items = a.items - std::min(a.items, b.items);
    r.bytes = a.bytes - std::min(a.bytes, b.bytes);
    r.busy_s = s(a.busy_ns, b.busy_ns);
    r.spine_s = s(a.spine_ns, b.spine_ns);
    r.assemble_s = s(a.assemble_ns, b.assemble_ns);
    r.deliver_s = s(a.deliver_ns, b.deliver_ns);
    // A node may work in two stages (pack plans rows in the spine and gathers them in the
    // workers): its load is that of the stage it loads most, each over its own threads.
    if (wall_s > 0)
      r.utilization =
          std::max({r.spine_s / wall_s, r.assemble_s / (wall_s * std::max(1, after.workers)),
                    r.deliver_s / wall_s});
    r.wait_input_s = s(a.wait_input_ns, b.wait_input_ns);
    r.wait_output_s = s(a.wait_output_ns, b.wait_output_ns);
    out.push_back(std::move(r));
  }
  return out;
}

RunReport run_once(const Pipeline& pipeline, const BenchOptions& o, const std::string& trace) {
  RunReport r;
  reset_peak_rss();
  std::uint64_t peak_anon = anon_rss_bytes();
  LoaderOptions lo{.epochs = o.epochs, .workers = o.workers, .prefetch = o.prefetch};
  lo.trace = trace;
  lo.node_stats = o.node_stats;

  const auto t_start = Clock::now();
  Loader loader(pipeline, lo);
  std::optional<Batch> b = loader.next();
  r.first_batch_s = seconds_since(t_start);
  if (!b) return r;
  b.reset();
  for (std::uint64_t i = 0; i < o.warmup; ++i) {
    if (!loader.next()) return r;
  }

  // Sampling RssAnon costs a read of /proc; do it a few dozen times per run, not per batch.
  const std::uint64_t sample_every = std::max<std::uint64_t>(16, o.steps / 32);
  const LoaderStats before = loader.stats();
  const double cpu0 = process_cpu_s();
  const auto t0 = Clock::now();
  for (;;) {
    if (o.steps != 0 && r.batches >= o.steps) break;
    std::optional<Batch> batch = loader.next();
    if (!batch) break;
    ++r.batches;
    r.samples += batch->info.num_samples;
    r.bytes += batch_bytes(*batch);
    if (r.batches % sample_every == 0) peak_anon = std::max(peak_anon, anon_rss_bytes());
  }
  r.seconds = seconds_since(t0);
  r.cpu_s = process_cpu_s() - cpu0;
  const LoaderStats after = loader.stats();

  r.samples_per_s = r.seconds > 0 ? static_cast<double>(r.samples) / r.seconds : 0;
  r.mb_per_s = r.seconds > 0 ? static_cast<double>(r.bytes) / r.seconds * 1e-6 : 0;
  r.cpu_ns_per_sample = r.samples > 0 ? r.cpu_s * 1e9 / static_cast<double>(r.samples) : 0;
  r.stages = stage_delta(before, after, r.seconds);
  r.nodes = node_delta(before, after, r.seconds);
  r.consumer_busy_s = s_of(after.consumer_busy_ns - before.consumer_busy_ns);
  r.consumer_waits = after.consumer_waits - before.consumer_waits;
  r.consumer_wait_s = static_cast<double>(after.consumer_wait_ns - before.consumer_wait_ns) * 1e-9;
  r.graph_waits = after.graph_waits - before.graph_waits;
  r.in_flight_limit = after.in_flight_limit;
  r.messages = after.messages - before.messages;
  r.workers = after.workers;
  r.prefetch_depth = after.prefetch_depth;
  r.workers_auto = after.workers_auto;
  r.workers_inline = after.workers_inline;
  r.prefetch_auto = after.prefetch_auto;
  r.autotune_changes = after.autotune_changes;
  r.peak_anon_bytes = std::max(peak_anon, anon_rss_bytes());
  r.peak_rss_bytes = peak_rss_bytes();
  return r;
}

}  // namespace

Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.max = v.back();
  const std::size_t n = v.size();
  s.median = n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  return s;
}

std::uint64_t peak_rss_bytes() {
  if (std::uint64_t hwm = proc_status_kb("VmHWM"); hwm > 0) return hwm;
  rusage ru{};
  if (::getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<std::uint64_t>(ru.ru_maxrss) * 1024;  // KiB on Linux
}

std::uint64_t anon_rss_bytes() { return proc_status_kb("RssAnon"); }

double process_cpu_s() {
  rusage ru{};
  if (::getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return s(ru.ru_utime) + s(ru.ru_stime);
}

bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

BenchReport run_bench(const Pipeline& pipeline, const BenchOptions& options) {
  if (options.repeat < 1) throw ConfigError("repeat", "repeat must be at least 1");
  if (options.steps == 0 && options.epochs == 0)
    throw ConfigError("steps", "steps 0 (run to the end) needs a finite number of epochs");
  if (options.workers && !is_workers_setting(*options.workers))
    throw ConfigError("workers", "workers must be at least 1 (or auto, or inline)");

  BenchReport report;
  report.pipeline = pipeline.describe();
  report.fingerprint = pipeline.fingerprint();
  report.options = options;
  report.workers = options.workers.value_or(pipeline.workers());
  if (report.workers == static_cast<int>(kInline)) report.workers = 1;  // the consumer's thread
  for (const auto& n : pipeline.nodes())
    if (!options.workers && n.workers) report.workers = std::max(report.workers, *n.workers);

  std::vector<double> sps, mbps, first, cpu;
  // Each run writes a trace of its own; the median run's becomes options.trace.
  const auto trace_of = [&](int i) {
    return options.trace.empty() ? std::string() : options.trace + ".run" + std::to_string(i);
  };
  for (int i = 0; i < options.repeat; ++i) {
    RunReport r = run_once(pipeline, options, trace_of(i));
    sps.push_back(r.samples_per_s);
    mbps.push_back(r.mb_per_s);
    first.push_back(r.first_batch_s);
    cpu.push_back(r.cpu_ns_per_sample);
    report.peak_anon_bytes = std::max(report.peak_anon_bytes, r.peak_anon_bytes);
    report.runs.push_back(std::move(r));
  }
  report.samples_per_s = summarize(sps);
  report.mb_per_s = summarize(mbps);
  report.first_batch_s = summarize(first);
  report.cpu_ns_per_sample = summarize(cpu);
  if (const RunReport* median = median_run(report); median != nullptr && median->workers_auto)
    report.workers = median->workers;
  if (!options.trace.empty()) {
    const RunReport* median = median_run(report);
    for (int i = 0; i < options.repeat; ++i) {
      std::error_code ec;
      if (median == &report.runs[static_cast<std::size_t>(i)]) {
        std::filesystem::rename(trace_of(i), options.trace, ec);
        if (ec) throw Error("cannot write the trace to '" + options.trace + "': " + ec.message());
      } else {
        std::filesystem::remove(trace_of(i), ec);
      }
    }
  }
  rusage ru{};
  if (::getrusage(RUSAGE_SELF, &ru) == 0)
    report.peak_rss_bytes = static_cast<std::uint64_t>(ru.ru_maxrss) * 1024;
  return report;
}

std::string to_json(const BenchReport& r) {
  using nlohmann::json;
  auto summary = [](const Summary& s) {
    return json{{"median", s.median}, {"min", s.min}, {"max", s.max}};
  };
  json runs = json::array();
  for (const auto& run : r.runs) {
    json stages = json::array();
    for (const auto& s : run.stages)
      stages.push_back({{"name", s.name},
                        {"items", s.items},
                        {"busy_s", s.busy_s},
                        {"concurrency", s.concurrency},
                        {"utilization", s.utilization},
                        {"us_per_item", s.us_per_item}});
    json nodes = json::array();
    for (const auto& n : run.nodes)
      nodes.push_back({{"name", n.name},
                       {"stage", n.stage},
                       {"threads", n.threads},
                       {"calls", n.calls},
                       {"items", n.items},
                       {"bytes", n.bytes},
                       {"busy_s", n.busy_s},
                       {"spine_s", n.spine_s},
                       {"assemble_s", n.assemble_s},
                       {"deliver_s", n.deliver_s},
                       {"utilization", n.utilization},
                       {"wait_input_s", n.wait_input_s},
                       {"wait_output_s", n.wait_output_s}});
    runs.push_back({{"first_batch_s", run.first_batch_s},
                    {"batches", run.batches},
                    {"samples", run.samples},
                    {"bytes", run.bytes},
                    {"seconds", run.seconds},
                    {"samples_per_s", run.samples_per_s},
                    {"mb_per_s", run.mb_per_s},
                    {"cpu_s", run.cpu_s},
                    {"cpu_ns_per_sample", run.cpu_ns_per_sample},
                    {"stages", stages},
                    {"nodes", nodes},
                    {"consumer_busy_s", run.consumer_busy_s},
                    {"consumer_waits", run.consumer_waits},
                    {"consumer_wait_s", run.consumer_wait_s},
                    {"graph_waits", run.graph_waits},
                    {"in_flight_limit", run.in_flight_limit},
                    {"messages", run.messages},
                    {"workers", run.workers},
                    {"workers_auto", run.workers_auto},
                    {"workers_inline", run.workers_inline},
                    {"prefetch_depth", run.prefetch_depth},
                    {"prefetch_auto", run.prefetch_auto},
                    {"autotune_changes", run.autotune_changes},
                    {"peak_rss_bytes", run.peak_rss_bytes},
                    {"peak_anon_bytes", run.peak_anon_bytes}});
  }
  json j{{"pipeline", r.pipeline},
         {"fingerprint", hex64(r.fingerprint)},  // a string: JSON numbers lose 64-bit values
         {"options",
          {{"steps", r.options.steps},
           {"warmup", r.options.warmup},
           {"repeat", r.options.repeat},
           {"epochs", r.options.epochs}}},
         {"workers", r.workers},
         {"samples_per_s", summary(r.samples_per_s)},
         {"mb_per_s", summary(r.mb_per_s)},
         {"first_batch_s", summary(r.first_batch_s)},
         {"cpu_ns_per_sample", summary(r.cpu_ns_per_sample)},
         {"peak_rss_bytes", r.peak_rss_bytes},
         {"peak_anon_bytes", r.peak_anon_bytes},
         {"runs", runs}};
  return j.dump(2);
}

void write_json(const BenchReport& report, const std::string& path) {
  const std::string text = to_json(report) + "\n";
  if (path == "-") {
    std::cout << text << std::flush;
    return;
  }
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw std::runtime_error("cannot write the JSON report to '" + path + "'");
}

std::string format_report(const BenchReport& r) {
  std::ostringstream os;
  char line[1024];
  auto mib = [](std::uint64_t b) { return static_cast<double>(b) / (1 << 20); };
  std::snprintf(line, sizeof(line),
                "samples/s   %12.0f  (min %.0f, max %.0f over %zu runs)\n"
                "MB/s        %12.1f  (min %.1f, max %.1f)\n"
                "first batch %12.2f ms (min %.2f, max %.2f)\n"
                "CPU/sample  %12.0f ns (user + system, all threads)\n"
                "peak RSS    %12.1f MiB (anonymous %.1f MiB)\n",
                r.samples_per_s.median, r.samples_per_s.min, r.samples_per_s.max, r.runs.size(),
                r.mb_per_s.median, r.mb_per_s.min, r.mb_per_s.max, r.first_batch_s.median * 1e3,
                r.first_batch_s.min * 1e3, r.first_batch_s.max * 1e3, r.cpu_ns_per_sample.median,
                mib(r.peak_rss_bytes), mib(r.peak_anon_bytes));
  os << line;
  if (r.runs.empty()) return os.str();
  // The node table of the median run.
  const RunReport& run = *median_run(r);
  std::snprintf(line, sizeof(line), "%-22s %-8s %4s %9s %10s %9s %8s %6s %9s %9s\n", "node",
                "stage", "thr", "calls", "items", "MB", "busy s", "util", "wait in", "wait out");
  os << line;
  for (const auto& n : run.nodes) {
    std::snprintf(line, sizeof(line),
                  "%-22s %-8s %4d %9llu %10llu %9.1f %8.3f %5.0f%% %9.3f %9.3f\n", n.name.c_str(),
                  n.stage.c_str(), n.threads, static_cast<unsigned long long>(n.calls),
                  static_cast<unsigned long long>(n.items), static_cast<double>(n.bytes) * 1e-6,
                  n.busy_s, n.utilization * 100, n.wait_input_s, n.wait_output_s);
    os << line;
  }
  std::snprintf(line, sizeof(line), "%-22s %-8s %4d %9llu %10s %9s %8.3f %5.0f%% %9.3f %9s\n",
                "consumer", "-", 1, static_cast<unsigned long long>(run.batches), "-", "-",
                run.consumer_busy_s, run.seconds > 0 ? run.consumer_busy_s / run.seconds * 100 : 0,
                run.consumer_wait_s, "-");
  os << line;
  std::snprintf(line, sizeof(line),
                "stages: spine %.0f%%, assemble %.0f%% of %d workers, deliver %.0f%%; the consumer "
                "waited %llu times, the graph waited on it %llu times; in flight <= %zu "
                "messages of %.1f batches\n",
                run.stages.size() > 0 ? run.stages[0].utilization * 100 : 0,
                run.stages.size() > 1 ? run.stages[1].utilization * 100 : 0,
                run.stages.size() > 1 ? run.stages[1].concurrency : 0,
                run.stages.size() > 2 ? run.stages[2].utilization * 100 : 0,
                static_cast<unsigned long long>(run.consumer_waits),
                static_cast<unsigned long long>(run.graph_waits), run.in_flight_limit,
                run.messages > 0
                    ? static_cast<double>(run.batches) / static_cast<double>(run.messages)
                    : 1.0);
  os << line;
  if (run.workers_auto || run.prefetch_auto) {
    const std::string w = (run.workers_auto ? "auto → " : "") + std::to_string(run.workers);
    const std::string d = (run.prefetch_auto ? "auto → " : "") + std::to_string(run.prefetch_depth);
    std::snprintf(line, sizeof(line), "autotune: workers: %s, prefetch depth: %s (%llu changes)\n",
                  w.c_str(), d.c_str(), static_cast<unsigned long long>(run.autotune_changes));
    os << line;
  }
  os << bottleneck(r) << "\n";
  return os.str();
}

const RunReport* median_run(const BenchReport& r) {
  if (r.runs.empty()) return nullptr;
  std::size_t mid = 0;
  for (std::size_t i = 0; i < r.runs.size(); ++i)
    if (r.runs[i].samples_per_s == r.samples_per_s.median) mid = i;
  return &r.runs[mid];
}

namespace {
/// The busy share from which a stage (or the consumer) holds the others back.
constexpr double kSaturated = 0.5;
}  // namespace

std::string bottleneck(const BenchReport& r) {
  const RunReport* run = median_run(r);
  if (run == nullptr) return "";
  char line[512];
  const double consumer_share = run->seconds > 0 ? run->consumer_busy_s / run->seconds : 0;
  const int consumer_pct = static_cast<int>(consumer_share * 100 + 0.5);
  // Every in-flight slot full and waiting while the consumer seldom waited, and the consumer
  // busy most of the time: the graph keeps up. (Graph waits on a consumer that is idle are the
  // hand-off's, not a slow consumer's: the verdict is then the busiest stage's.)
  if (run->graph_waits > run->consumer_waits && consumer_share >= kSaturated) {
    std::snprintf(line, sizeof(line),
                  "bottleneck: the consumer — %d%% busy, the graph waited on it %llu times, it on "
                  "the graph %llu",
                  consumer_pct, static_cast<unsigned long long>(run->graph_waits),
                  static_cast<unsigned long long>(run->consumer_waits));
    return line;
  }
  // The busiest stage in which some node works (without device_copy, deliver only hands
  // batches over: its time is the hand-off's, under load mostly preemption), and in it the
  // node with the most own time.
  const auto in_stage = [](const StageReport& stage, const NodeReport& n) {
    if (stage.name == "spine") return n.spine_s;
    if (stage.name == "assemble") return n.assemble_s;
    return n.deliver_s;
  };
  const StageReport* busiest = nullptr;
  const NodeReport* node = nullptr;
  for (const auto& s : run->stages) {
    const NodeReport* top = nullptr;
    for (const auto& n : run->nodes)
      if (in_stage(s, n) > 0 && (top == nullptr || in_stage(s, n) > in_stage(s, *top))) top = &n;
    if (top == nullptr && !run->nodes.empty()) continue;
    if (busiest == nullptr || s.utilization > busiest->utilization) {
      busiest = &s;
      node = top;
    }
  }
  if (busiest == nullptr)  // a short run: the graph made every timed batch before the timing
    return "bottleneck: not measured — no node worked while the batches were timed (the graph "
           "had made them ahead); time more batches (--steps)";
  const auto in_busiest = [&](const NodeReport& n) { return in_stage(*busiest, n); };
  const int threads = std::max(1, busiest->concurrency);
  const double share =
      node != nullptr && run->seconds > 0 ? in_busiest(*node) / (run->seconds * threads) : 0;
  const std::string name = node != nullptr ? node->name : busiest->name;
  const int pct = static_cast<int>(share * 100 + 0.5);
  const int stage_pct = static_cast<int>(busiest->utilization * 100 + 0.5);
  if (run->workers_inline) {
    // One thread plans, assembles and consumes: the busiest node's share is of that thread.
    std::snprintf(line, sizeof(line),
                  "bottleneck: %s — %d%% busy on the consumer's thread, which makes the batches "
                  "(workers: inline; the consumer %d%% busy); worker threads (workers: N) would "
                  "make them beside the consumer's own work",
                  name.c_str(), pct, consumer_pct);
    return line;
  }
  if (busiest->utilization < kSaturated) {
    // Nothing works most of the time: no stage (nor the consumer) holds the others back.
    const std::string where =
        busiest->name == "assemble"
            ? "on " + std::to_string(threads) + (threads == 1 ? " worker" : " workers")
        : busiest->name == "spine" ? std::string("in the spine")
                                   : std::string("in deliver");
    std::snprintf(line, sizeof(line),
                  "bottleneck: none saturated — the busiest, %s, is %d%% busy %s (the %s stage "
                  "%d%% busy); the consumer %d%% busy",
                  name.c_str(), pct, where.c_str(), busiest->name.c_str(), stage_pct, consumer_pct);
    return line;
  }
  if (busiest->name == "assemble") {
    std::snprintf(line, sizeof(line),
                  "bottleneck: %s — %d%% busy on %d worker%s (the workers %d%% busy)%s",
                  name.c_str(), pct, threads, threads == 1 ? "" : "s", stage_pct,
                  busiest->utilization >= 0.7 ? "; more workers would help" : "");
  } else if (busiest->name == "spine") {
    std::snprintf(line, sizeof(line),
                  "bottleneck: %s — %d%% busy in the spine (serial, %d%% busy); more workers "
                  "would not help",
                  name.c_str(), pct, stage_pct);
  } else {
    std::snprintf(line, sizeof(line), "bottleneck: %s — %d%% busy in deliver (serial, %d%% busy)",
                  name.c_str(), pct, stage_pct);
  }
  return line;
}

}  // namespace flowstate::bench
