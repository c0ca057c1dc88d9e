// Workload W1 (DESIGN.md §11) and the measurements around it, one per invocation, each
// printed as one JSON line so bench/compare.sh can interleave them with other loaders:
//
//   w1_flowstate --data DIR gen                      write the W1 files (kept when present)
//   w1_flowstate --data DIR throughput --workers 2   samples/s over --batches after --warmup
//   w1_flowstate --data DIR gather                   single-thread random-gather ceiling
//   w1_flowstate --data DIR checkpoint --every 100   cost of checkpointing (--kind
//   state|sync|async) w1_flowstate --data DIR restore                  first batch: scratch vs
//   restore at 50%/99% w1_flowstate --data DIR size                     encoded state / checkpoint
//   size over an epoch w1_flowstate --data DIR rss --epochs 5           anonymous RSS per epoch,
//   against the bound w1_flowstate --data DIR map --workers 2          map-heavy pipeline (~2 µs
//   per sample)
//
// Common options: --records N (default 262144), --batches N, --warmup N, --rounds N.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_data.h"
#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/sources/mapped_file.h"
#include "flowstate/tools/harness.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace flowstate;
using namespace flowstate::bench;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Args {
  std::string mode;
  std::string data;
  std::uint64_t records = kW1Records;
  int workers = 2;            // kAuto (0): `--workers auto`
  std::size_t prefetch = 4;   // kAuto (0): `--prefetch auto`
  bool node_stats = true;     // --no-node-stats: per-node accounting off (its A/B)
  std::uint64_t batches = 0;  // 0: the mode's default
  std::uint64_t warmup = 100;
  int rounds = 0;  // 0: the mode's default
  std::uint64_t every = 100;
  std::uint64_t epochs = 5;
  int map_rounds = 1;
  std::string kind = "sync";  // checkpoint: state | sync | async
  std::string label;
  std::string trace;  // throughput, map: write the median run's timeline here
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "w1_flowstate: %s\nusage: w1_flowstate --data DIR "
               "{gen|throughput|gather|checkpoint|restore|size|rss|map} [--records N] "
               "[--workers W|auto] [--prefetch D|auto] [--no-node-stats] [--batches N] [--warmup "
               "N] [--rounds N] [--every N] "
               "[--epochs N] [--map-rounds N] [--kind state|sync|async] [--label S] "
               "[--trace FILE]\n",
               why);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + k).c_str());
      return argv[++i];
    };
    if (k == "--data")
      a.data = value();
    else if (k == "--records")
      a.records = std::stoull(value());
    else if (k == "--workers") {
      const std::string v = value();
      a.workers = v == "auto" ? static_cast<int>(kAuto) : std::stoi(v);
    } else if (k == "--prefetch") {
      const std::string v = value();
      a.prefetch = v == "auto" ? kAuto : std::stoull(v);
    } else if (k == "--no-node-stats")
      a.node_stats = false;
    else if (k == "--batches")
      a.batches = std::stoull(value());
    else if (k == "--warmup")
      a.warmup = std::stoull(value());
    else if (k == "--rounds")
      a.rounds = std::stoi(value());
    else if (k == "--every")
      a.every = std::stoull(value());
    else if (k == "--epochs")
      a.epochs = std::stoull(value());
    else if (k == "--map-rounds")
      a.map_rounds = std::stoi(value());
    else if (k == "--kind")
      a.kind = value();
    else if (k == "--label")
      a.label = value();
    else if (k == "--trace")
      a.trace = value();
    else if (!k.empty() && k[0] != '-' && a.mode.empty())
      a.mode = k;
    else
      usage(("unknown argument " + k).c_str());
  }
  if (a.mode.empty()) usage("no mode given");
  if (a.data.empty()) usage("--data DIR is required");
  return a;
}

std::string glob_of(const Args& a) {
  return write_records(a.data, a.records, kW1RecordBytes, kW1Shards);
}

void emit(json j, const Args& a) {
  j["impl"] = "flowstate";
  if (!a.label.empty()) j["label"] = a.label;
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

double median(std::vector<double> v) { return summarize(std::move(v)).median; }

// ---- throughput ----

void throughput(const Args& a) {
  const std::string glob = glob_of(a);
  Pipeline p = w1_pipeline(glob, {.workers = a.workers, .prefetch = a.prefetch});
  BenchReport r = run_bench(p, {.steps = a.batches ? a.batches : 3072,
                                .warmup = a.warmup,
                                .repeat = std::max(1, a.rounds),
                                .trace = a.trace,
                                .node_stats = a.node_stats});
  json stages = json::object();
  for (const auto& s : r.runs.front().stages)
    stages[s.name] = {{"util", s.utilization}, {"us_per_item", s.us_per_item}};
  emit({{"what", "w1"},
        {"workers", a.workers},
        {"prefetch", a.prefetch},
        {"node_stats", a.node_stats},
        {"tuned_workers", r.runs.front().workers},
        {"tuned_prefetch", r.runs.front().prefetch_depth},
        {"samples_per_s", r.samples_per_s.median},
        {"mb_per_s", r.mb_per_s.median},
        {"cpu_ns_per_sample", r.cpu_ns_per_sample.median},
        {"first_batch_s", r.first_batch_s.median},
        {"consumer_waits", r.runs.front().consumer_waits},
        {"graph_waits", r.runs.front().graph_waits},
        {"stages", stages}},
       a);
}

// ---- gather ceiling ----

// One thread copying the W1 records, in a random order fixed up front, into a 256-record batch
// buffer: the plain memcpy loop (DESIGN.md §11's ceiling), and the same loop prefetching the
// records 4 positions ahead (what a gather can reach when it keeps several misses in flight).
void gather(const Args& a) {
  const std::string glob = glob_of(a);
  std::vector<std::shared_ptr<const MappedFile>> maps;
  std::vector<const std::byte*> order;
  for (const auto& f : expand_paths({glob})) {
    maps.push_back(std::make_shared<const MappedFile>(f));
    for (std::size_t off = 0; off + kW1RecordBytes <= maps.back()->size(); off += kW1RecordBytes)
      order.push_back(maps.back()->data() + off);
  }
  std::mt19937_64 rng(42);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<std::byte> batch(kW1BatchSize * kW1RecordBytes);
  const std::uint64_t total = a.batches ? a.batches * kW1BatchSize : 2 * order.size();
  const std::size_t batches = order.size() / kW1BatchSize;
  auto pass = [&](std::uint64_t n, std::size_t ahead) {
    std::uint64_t sink = 0;
    for (std::uint64_t i = 0; i < n / kW1BatchSize; ++i) {
      const std::byte* const* src = order.data() + (i % batches) * kW1BatchSize;
      for (std::size_t j = 0; j < kW1BatchSize; ++j) {
        if (ahead != 0 && j + ahead < kW1BatchSize) {
          for (std::size_t l = 0; l < kW1RecordBytes; l += 64)
            __builtin_prefetch(src[j + ahead] + l);
        }
        std::memcpy(batch.data() + j * kW1RecordBytes, src[j], kW1RecordBytes);
      }
      sink += static_cast<std::uint64_t>(batch[i % batch.size()]);
    }
    return sink;
  };
  std::uint64_t sink = pass(order.size(), 0);  // warm-up: every page of the mappings faulted in
  std::vector<double> plain, prefetch;
  for (int r = 0; r < std::max(1, a.rounds ? a.rounds : 3); ++r) {
    for (std::size_t ahead : {std::size_t{0}, std::size_t{4}}) {
      auto t0 = Clock::now();
      sink += pass(total, ahead);
      (ahead == 0 ? plain : prefetch).push_back(static_cast<double>(total) / since(t0));
    }
  }
  emit({{"what", "gather"},
        {"records_per_s", median(plain)},
        {"gb_per_s", median(plain) * kW1RecordBytes * 1e-9},
        {"records_per_s_prefetch", median(prefetch)},
        {"sink", sink % 2}},
       a);
}

// ---- checkpoint cost ----

// One Loader, alternating segments of --batches batches without and with a checkpoint every
// --every steps, so both see the same machine state; the cost is the median over pairs of
// (time with) / (time without) - 1. --kind: `state` keeps Loader::state() in memory (what a
// trainer that writes its own checkpoints pays), `sync` calls save_checkpoint (write + fsync,
// on the consumer's thread), `async` save_checkpoint_async (the I/O on another thread; at most
// 4 in flight).
void checkpoint(const Args& a) {
  if (a.kind != "state" && a.kind != "sync" && a.kind != "async") usage("--kind: state|sync|async");
  const std::string glob = glob_of(a);
  ScratchDir ckpt("flowstate-ckpt");
  const std::uint64_t seg = a.batches ? a.batches : 1000;
  const int pairs = a.rounds ? a.rounds : 6;
  Loader loader(w1_pipeline(glob, {.workers = a.workers}), {.epochs = 0});
  for (std::uint64_t i = 0; i < a.warmup; ++i) loader.next();
  std::vector<double> ratios, plain_rate, ckpt_rate, save_ms;
  std::vector<std::future<std::string>> pending;
  std::string kept;
  std::uint64_t saves = 0;
  auto segment = [&](bool with) {
    auto t0 = Clock::now();
    for (std::uint64_t i = 0; i < seg; ++i) {
      std::optional<Batch> b = loader.next();
      if (with && (b->info.step + 1) % a.every == 0) {
        auto s0 = Clock::now();
        if (a.kind == "state") {
          kept = loader.state();
        } else if (a.kind == "async") {
          pending.push_back(loader.save_checkpoint_async(ckpt.path(), {.keep = 3}));
          if (pending.size() > 4) {  // bounded: wait for the oldest
            pending.front().get();
            pending.erase(pending.begin());
          }
        } else {
          loader.save_checkpoint(ckpt.path(), {.keep = 3});
        }
        save_ms.push_back(since(s0) * 1e3);
        ++saves;
      }
    }
    for (auto& f : pending) f.get();
    pending.clear();
    return since(t0);
  };
  for (int r = 0; r < pairs; ++r) {
    // Alternate which goes first, so a drift in machine load does not favour either.
    double t_plain, t_ckpt;
    if (r % 2 == 0) {
      t_plain = segment(false);
      t_ckpt = segment(true);
    } else {
      t_ckpt = segment(true);
      t_plain = segment(false);
    }
    ratios.push_back(t_ckpt / t_plain - 1);
    plain_rate.push_back(static_cast<double>(seg * kW1BatchSize) / t_plain);
    ckpt_rate.push_back(static_cast<double>(seg * kW1BatchSize) / t_ckpt);
  }
  std::uint64_t dir_bytes = 0;
  for (const auto& e : fs::recursive_directory_iterator(ckpt.path()))
    if (e.is_regular_file()) dir_bytes += e.file_size();
  Summary cost = summarize(ratios);
  // The consumer's own share, independent of noise in the segment times: time spent in the
  // checkpoint calls over the time of the segments that made them.
  double in_calls_s = 0, ckpt_segments_s = 0;
  for (double ms : save_ms) in_calls_s += ms * 1e-3;
  for (double r : ckpt_rate) ckpt_segments_s += static_cast<double>(seg * kW1BatchSize) / r;
  emit({{"what", "checkpoint_cost"},
        {"workers", a.workers},
        {"every", a.every},
        {"kind", a.kind},
        {"saves", saves},
        {"cost_median", cost.median},
        {"cost_min", cost.min},
        {"cost_max", cost.max},
        {"plain_samples_per_s", median(plain_rate)},
        {"ckpt_samples_per_s", median(ckpt_rate)},
        {"save_ms_median", median(save_ms)},
        {"save_ms_max", summarize(save_ms).max},
        {"consumer_share", in_calls_s / ckpt_segments_s},
        {"state_bytes", kept.size()},
        {"kept_dir_bytes", dir_bytes}},
       a);
}

// ---- restore ----

// Time to the first batch: a fresh Loader from scratch, against a fresh Loader that loads a
// state taken at 50% / 99% of the first epoch (load_state) or restores a checkpoint directory
// (restore), interleaved over --rounds rounds.
void restore(const Args& a) {
  const std::string glob = glob_of(a);
  const Pipeline p = w1_pipeline(glob, {.workers = a.workers});
  ScratchDir ckpt("flowstate-restore");
  std::uint64_t epoch_batches = 0;
  std::map<std::string, std::string> states;  // fraction -> encoded state
  std::map<std::string, std::string> dirs;    // fraction -> checkpoint dir
  {
    Loader l(p, {.epochs = 0});
    std::optional<Batch> b = l.next();
    epoch_batches = *b->info.batches_in_epoch;
    const std::pair<const char*, double> points[] = {{"50", 0.5}, {"99", 0.99}};
    std::uint64_t taken = 1;
    for (const auto& [name, f] : points) {
      const auto at = static_cast<std::uint64_t>(f * static_cast<double>(epoch_batches));
      for (; taken < at; ++taken) l.next();
      states[name] = l.state();
      dirs[name] = ckpt.path() + "/" + name;
      l.save_checkpoint(dirs[name]);
    }
  }
  auto first_batch = [&](const std::function<void(Loader&)>& prepare) {
    auto t0 = Clock::now();
    Loader l(p, {.epochs = 0});
    prepare(l);
    std::optional<Batch> b = l.next();
    double s = since(t0);
    if (!b) throw Error("no batch");
    return s;
  };
  std::map<std::string, std::vector<double>> t;
  const int rounds = a.rounds ? a.rounds : 15;
  for (int r = 0; r < rounds + 1; ++r) {
    std::map<std::string, double> one;
    one["scratch"] = first_batch([](Loader&) {});
    for (const auto& [name, s] : states) {
      one["state" + name] = first_batch([&](Loader& l) { l.load_state(s); });
      one["dir" + name] = first_batch([&](Loader& l) { l.restore(dirs[name]); });
    }
    if (r == 0) continue;  // warm-up round
    for (const auto& [k, v] : one) t[k].push_back(v);
  }
  json j{{"what", "restore"}, {"workers", a.workers}, {"epoch_batches", epoch_batches}};
  const double scratch = median(t["scratch"]);
  for (const auto& [k, v] : t) {
    Summary s = summarize(v);
    j[k + "_ms"] = {{"median", s.median * 1e3}, {"min", s.min * 1e3}, {"max", s.max * 1e3}};
    if (k != "scratch") j[k + "_ratio"] = s.median / scratch;
  }
  emit(j, a);
}

// ---- state size ----

void size(const Args& a) {
  const std::string glob = glob_of(a);
  ScratchDir ckpt("flowstate-size");
  Loader l(w1_pipeline(glob, {.workers = a.workers}), {.epochs = 2});
  std::size_t max_state = l.state().size(), at_max = 0, batches = 0;
  std::size_t max_dir = 0;
  std::vector<std::size_t> sizes;
  while (auto b = l.next()) {
    ++batches;
    std::size_t n = l.state().size();
    if (n > max_state) {
      max_state = n;
      at_max = batches;
    }
    if (batches % 97 == 0 || b->info.is_last_in_epoch) {
      std::string d = l.save_checkpoint(ckpt.path(), {.keep = 1});
      std::size_t bytes = 0;
      for (const auto& e : fs::directory_iterator(d)) bytes += e.file_size();
      max_dir = std::max(max_dir, bytes);
      sizes.push_back(n);
    }
  }
  emit({{"what", "state_size"},
        {"max_state_bytes", max_state},
        {"at_batch", at_max},
        {"max_checkpoint_bytes", max_dir},
        {"batches", batches},
        {"limit_bytes", 64 * 1024}},
       a);
}

// ---- memory ----

void rss(const Args& a) {
  const std::string glob = glob_of(a);
  const W1Options wo{.workers = a.workers};
  Loader l(w1_pipeline(glob, wo), {.epochs = a.epochs});
  const std::uint64_t in_flight = l.stats().in_flight_limit + 1;  // + the consumer's batch
  const double buffer_bytes = static_cast<double>(wo.shuffle * kW1RecordBytes);
  const double batch_bytes = static_cast<double>(wo.batch * kW1RecordBytes);
  const double bound =
      1.5 * (buffer_bytes + static_cast<double>(in_flight) * batch_bytes) + 64.0 * (1 << 20);
  std::vector<std::uint64_t> epoch_peak;
  const std::uint64_t start_anon = anon_rss_bytes();
  std::uint64_t n = 0, peak = 0;
  while (auto b = l.next()) {
    if (++n % 32 == 0 || b->info.is_last_in_epoch) peak = std::max(peak, anon_rss_bytes());
    if (b->info.is_last_in_epoch) {
      epoch_peak.push_back(peak);
      peak = 0;
    }
  }
  const std::uint64_t max_peak = *std::max_element(epoch_peak.begin(), epoch_peak.end());
  emit({{"what", "rss"},
        {"workers", a.workers},
        {"epochs", a.epochs},
        {"start_anon_bytes", start_anon},
        {"epoch_peak_anon_bytes", epoch_peak},
        {"peak_anon_bytes", max_peak},
        {"vm_hwm_bytes", peak_rss_bytes()},
        {"bound_bytes", bound},
        {"growth_bytes", static_cast<std::int64_t>(epoch_peak.back()) -
                             static_cast<std::int64_t>(epoch_peak.front())},
        {"in_flight_batches", in_flight}},
       a);
}

// ---- map-heavy ----

void map_heavy(const Args& a) {
  const std::string glob = glob_of(a);
  Pipeline p =
      w1_pipeline(glob, {.workers = a.workers, .prefetch = a.prefetch, .map_rounds = a.map_rounds});
  const double cost = map_cost_ns(kW1RecordBytes, a.map_rounds);
  BenchReport r = run_bench(p, {.steps = a.batches ? a.batches : 300,
                                .warmup = a.warmup ? a.warmup : 20,
                                .repeat = std::max(1, a.rounds),
                                .trace = a.trace,
                                .node_stats = a.node_stats});
  json stages = json::object();
  for (const auto& s : r.runs.front().stages)
    stages[s.name] = {{"util", s.utilization}, {"us_per_item", s.us_per_item}};
  emit({{"what", "map_heavy"},
        {"workers", a.workers},
        {"prefetch", a.prefetch},
        {"tuned_workers", r.runs.front().workers},
        {"tuned_prefetch", r.runs.front().prefetch_depth},
        {"map_ns_per_sample", cost},
        {"samples_per_s", r.samples_per_s.median},
        {"cpu_ns_per_sample", r.cpu_ns_per_sample.median},
        {"stages", stages}},
       a);
}

}  // namespace

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  try {
    if (a.mode == "gen") {
      std::string glob = glob_of(a);
      emit({{"what", "gen"}, {"glob", glob}, {"bytes", warm_page_cache(glob)}}, a);
    } else if (a.mode == "throughput") {
      throughput(a);
    } else if (a.mode == "gather") {
      gather(a);
    } else if (a.mode == "checkpoint") {
      checkpoint(a);
    } else if (a.mode == "restore") {
      restore(a);
    } else if (a.mode == "size") {
      size(a);
    } else if (a.mode == "rss") {
      rss(a);
    } else if (a.mode == "map") {
      map_heavy(a);
    } else {
      usage(("unknown mode " + a.mode).c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "w1_flowstate %s: %s\n", a.mode.c_str(), e.what());
    return 1;
  }
  return 0;
}
