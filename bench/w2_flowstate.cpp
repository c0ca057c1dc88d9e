// Workload W2 (docs/DESIGN.md §11): LLM pre-training rows from a Megatron indexed data set —
// `indexed` → `shuffle: {mode: global}` → `pack: {length: 2048, separator: 0}` →
// `batch: {size: 8}` — one measurement per invocation, printed as one JSON line so
// bench/w2_compare.sh can interleave it with the Python packer and the ceiling:
//
//   w2_flowstate --data DIR throughput --workers 2 --epochs 1   tokens/s over whole epochs
//   w2_flowstate --data DIR restore --rounds 3                  first batch: scratch vs 50%
//   w2_flowstate --data DIR spine --epochs 1                    the serial planning alone
//
// `--map identity|remap` puts a map before pack (a tokenizer's place), so every document must
// be read before pack can plan with it: `identity` only reads it, `remap` also rewrites each
// token (a vocabulary lookup's work: a few integer rounds per token). `--read-ahead N` sets
// pack's window of documents read ahead in parallel (0: one by one in the spine).
//
// DIR holds the data set (`flowstate gen indexed --out DIR/corpus --docs 200000`).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "flowstate/graph/loader.h"
#include "flowstate/graph/spine.h"
#include "flowstate/nodes/builtin.h"
#include "flowstate/nodes/sources/indexed.h"

using nlohmann::json;
using namespace flowstate;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Args {
  std::string mode, data, label;
  int workers = 2;
  std::uint64_t epochs = 1;
  int rounds = 3;
  bool doc_ids = false;
  std::string map;                 ///< "", identity or remap
  std::uint64_t read_ahead = 256;  ///< pack's read_ahead
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "w2_flowstate: %s\nusage: w2_flowstate --data DIR {throughput|restore|spine} "
               "[--workers W] [--epochs N] [--rounds N] [--doc-ids] [--map identity|remap] "
               "[--read-ahead N] [--label S]\n",
               why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value for " + k);
      return argv[++i];
    };
    if (k == "--data")
      a.data = value();
    else if (k == "--workers")
      a.workers = std::stoi(value());
    else if (k == "--epochs")
      a.epochs = std::stoull(value());
    else if (k == "--rounds")
      a.rounds = std::stoi(value());
    else if (k == "--doc-ids")
      a.doc_ids = true;
    else if (k == "--map")
      a.map = value();
    else if (k == "--read-ahead")
      a.read_ahead = std::stoull(value());
    else if (k == "--label")
      a.label = value();
    else if (!k.empty() && k[0] != '-' && a.mode.empty())
      a.mode = k;
    else
      usage("unknown argument " + k);
  }
  if (a.mode.empty()) usage("no mode given");
  if (a.data.empty()) usage("--data DIR is required");
  if (!a.map.empty() && a.map != "identity" && a.map != "remap") usage("unknown map " + a.map);
  return a;
}

constexpr std::uint64_t kLength = 2048;
constexpr std::uint64_t kBatch = 8;

// A vocabulary lookup's work per token: a few rounds of integer mixing, the result a uint16.
void remap(Sample& s, MapContext&) {
  for (auto& t : s.at("tokens").values<std::uint16_t>()) {
    std::uint32_t x = t;
    for (int r = 0; r < 4; ++r) x = (x ^ (x >> 7)) * 0x9E3779B1u + 0x7F4A7C15u;
    t = static_cast<std::uint16_t>(x >> 16);
  }
}

Pipeline w2(const Args& a) {
  Pipeline::Builder b;
  b.seed(1234)
      .workers(a.workers)
      .add(indexed_node(), IndexedOptions{.paths = {a.data + "/*.idx"}})
      .shuffle({.mode = ShuffleMode::kGlobal});
  if (a.map == "identity") b.map([](Sample&, MapContext&) {}, {.name = "identity"});
  if (a.map == "remap") b.map(remap, {.name = "remap"});
  return b
      .pack({.length = kLength, .separator = 0, .doc_ids = a.doc_ids, .read_ahead = a.read_ahead})
      .batch({.size = kBatch})
      .build();
}

void emit(json j, const Args& a) {
  j["impl"] = "flowstate";
  j["workers"] = a.workers;
  if (!a.map.empty()) {
    j["map"] = a.map;
    j["read_ahead"] = a.read_ahead;
  }
  if (!a.label.empty()) j["label"] = a.label;
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

// Tokens/s over whole epochs, from the Loader's construction (which opens and checks the data
// set) to the last batch; also the largest encoded state seen (the checkpoint's payload).
void throughput(const Args& a) {
  const auto t0 = Clock::now();
  Loader l(w2(a), {.epochs = a.epochs});
  std::uint64_t rows = 0, batches = 0, sink = 0;
  std::size_t state_max = 0;
  double first = 0;
  std::vector<double> epoch_ends;  // seconds from the start to each epoch's last batch
  while (auto b = l.next()) {
    if (batches == 0) first = since(t0);
    if (b->info.is_last_in_epoch) epoch_ends.push_back(since(t0));
    rows += b->info.num_samples;
    sink += static_cast<const std::uint8_t*>(b->fields.at("tokens").data())[batches % 64];
    if (++batches % 500 == 0) state_max = std::max(state_max, l.state().size());
  }
  const double s = since(t0);
  emit({{"what", "w2"},
        {"tokens_per_s", static_cast<double>(rows * kLength) / s},
        {"rows_per_s", static_cast<double>(rows) / s},
        {"batches", batches},
        {"epochs", a.epochs},
        {"seconds", s},
        {"first_batch_s", first},
        {"epoch_ends_s", epoch_ends},
        {"state_bytes_max", state_max},
        {"sink", sink}},
       a);
}

// The spine alone on this thread (shuffle, pack's row planning from the index, the batch
// planner and its stamps; no assembly, no threads): what the serial part can plan, the bound
// on the whole pipeline's rate.
void spine(const Args& a) {
  const auto t0 = Clock::now();
  Spine sp(w2(a), a.epochs);
  std::uint64_t rows = 0, batches = 0;
  std::vector<double> epoch_ends;
  while (auto plan = sp.next()) {
    if (plan->info.is_last_in_epoch) epoch_ends.push_back(since(t0));
    rows += plan->info.refs.size();
    ++batches;
    sp.store()->release(plan->info.refs);  // as the assembler does, once a batch is made
  }
  const double s = since(t0);
  emit({{"what", "w2_spine"},
        {"tokens_per_s", static_cast<double>(rows * kLength) / s},
        {"us_per_batch", s * 1e6 / static_cast<double>(std::max<std::uint64_t>(batches, 1))},
        {"epoch_ends_s", epoch_ends},
        {"batches", batches},
        {"epochs", a.epochs},
        {"seconds", s}},
       a);
}

// The first batch of a fresh Loader from scratch, and after load_state at 50% of the epoch
// (the state taken by a run that consumed half the epoch's batches).
void restore(const Args& a) {
  std::uint64_t per_epoch = 0;
  {
    Loader l(w2(a), {.epochs = 1});
    while (l.next()) ++per_epoch;
  }
  std::string state;
  {
    Loader l(w2(a), {.epochs = 1});
    for (std::uint64_t i = 0; i < per_epoch / 2; ++i) l.next();
    state = l.state();
  }
  std::vector<double> scratch, resumed;
  for (int r = 0; r < a.rounds; ++r) {
    auto t0 = Clock::now();
    {
      Loader l(w2(a), {.epochs = 1});
      l.next();
      scratch.push_back(since(t0));
    }
    t0 = Clock::now();
    {
      Loader l(w2(a), {.epochs = 1});
      l.load_state(state);
      l.next();
      resumed.push_back(since(t0));
    }
  }
  std::sort(scratch.begin(), scratch.end());
  std::sort(resumed.begin(), resumed.end());
  emit({{"what", "w2_restore"},
        {"batches_per_epoch", per_epoch},
        {"state_bytes", state.size()},
        {"first_batch_scratch_s", scratch[scratch.size() / 2]},
        {"first_batch_restored_50_s", resumed[resumed.size() / 2]}},
       a);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  try {
    if (a.mode == "throughput")
      throughput(a);
    else if (a.mode == "restore")
      restore(a);
    else if (a.mode == "spine")
      spine(a);
    else
      usage("unknown mode " + a.mode);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "w2_flowstate: %s\n", e.what());
    return 1;
  }
  return 0;
}
