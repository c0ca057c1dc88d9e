// Autotuning of a Loader's free parameters (`workers: auto`, `prefetch: {depth: auto}`): the
// batch-assembly worker count and the prefetch depth, picked and adjusted while the graph runs
// from what it measures, the way tf.data's AUTOTUNE does. Neither changes the batches (both
// are free parameters, outside the fingerprint), so a tuned run delivers exactly the batches of
// a fixed one, and its checkpoints restore into either.
//
// The Autotuner is the decision alone, fed one AutotuneSample per interval (busy and wait
// shares, throughput) by the runtime (graph/loader_runtime.h), which applies the setting it
// returns through the graph's limiter slots. It hill-climbs: a change is a trial that is kept
// only when the next interval's throughput shows it paid (or, for a step down, did not cost),
// else it is undone and not tried again for a while; so it does not oscillate.
//
//   - workers up: the consumer waits for batches, the assembly is (nearly) fully busy and the
//     spine is not the bottleneck;
//   - workers down: the consumer never waits and one worker fewer would still be well under
//     full load (a step down must not lower the throughput);
//   - depth up: the consumer waits although the workers have idle time (the batches come in
//     bursts: a deeper queue absorbs them); and when that did not pay either, a worker more;
//   - depth down: the consumer never waits and no worker can go: a queue deepened earlier
//     is halved back towards the start depth (it holds memory), unless that costs throughput;
//   - and always (workers + depth) × batch bytes ≤ the memory budget: batches in flight are
//     what the setting costs in memory.
//
// Thread-safety: none; the runtime calls it from the consumer's thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace flowstate {

/// What an Autotuner may change, and within which bounds.
struct AutotuneLimits {
  bool workers = false;             ///< tune the worker count
  bool depth = false;               ///< tune the prefetch depth
  int max_workers = 4;              ///< workers at most (the graph is built for this many)
  std::size_t max_depth = 64;       ///< prefetch depth at most
  std::uint64_t memory_budget = 0;  ///< bytes of batches in flight at most; 0: no cap
};

/// One interval of a running graph, as the tuner sees it.
struct AutotuneSample {
  double seconds = 0;             ///< length of the interval
  std::uint64_t batches = 0;      ///< batches the consumer took in it
  std::uint64_t batch_bytes = 0;  ///< bytes of the largest batch so far (0: none seen yet)
  double assemble_busy = 0;       ///< assembly busy time / (seconds × workers), 0..1
  double spine_busy = 0;          ///< spine busy time / seconds, 0..1
  double consumer_wait = 0;       ///< share of the interval the consumer waited in next()
};

/// A value of the tuned parameters.
struct AutotuneSetting {
  int workers = 1;
  std::size_t depth = 1;
  bool operator==(const AutotuneSetting&) const = default;
};

/// An eighth of the machine's physical memory: the default LoaderOptions::memory_budget.
std::uint64_t default_memory_budget();

/// Picks the setting for the next interval from the last one (see the file comment).
class Autotuner {
 public:
  /// Thresholds of the decisions; the defaults are what the Loader uses.
  struct Tuning {
    double wait_high = 0.05;   ///< consumer waits more than this share: the graph is short
    double wait_low = 0.01;    ///< consumer waits less: the graph keeps up
    double busy_high = 0.75;   ///< assembly busier than this: the workers are the limit
    double spine_high = 0.85;  ///< spine busier than this: more workers cannot help
    double down_load = 0.6;    ///< step down when one worker fewer is at most this busy
    double gain = 0.03;        ///< a step up must raise the throughput by this share
    /// A deeper queue must raise it by this share: it costs memory (and cache: the batches in
    /// flight leave it before the consumer reads them), so only a clear win keeps it.
    double depth_gain = 0.10;
    double loss = 0.05;             ///< a step down may lower it by at most this share
    std::size_t min_depth = 4;      ///< a step down of the depth stops here (the Loader sets
                                    ///< its start depth, kAutoStartDepth)
    int cooldown = 20;              ///< intervals before a failed step is tried again
    std::uint64_t min_batches = 4;  ///< intervals with fewer batches are not judged
    /// Intervals measured at a setting before a move from it (their mean throughput is what
    /// the move must beat), and intervals a move runs before it is judged (on their mean):
    /// one interval's throughput on a loaded machine is too noisy to climb on.
    int settle = 2;
    int judge = 2;
  };

  Autotuner(AutotuneLimits limits, AutotuneSetting start);
  Autotuner(AutotuneLimits limits, AutotuneSetting start, Tuning tuning);

  /// Feeds one interval measured with setting(); returns the setting for the next one.
  AutotuneSetting update(const AutotuneSample& sample);
  AutotuneSetting setting() const { return current_; }
  const AutotuneLimits& limits() const { return limits_; }
  /// Why the last update changed (or kept) the setting, for logs and tests.
  const std::string& reason() const { return reason_; }
  /// Settings changed so far (trials, undos and memory cuts).
  std::uint64_t changes() const { return changes_; }

 private:
  enum class Move : std::uint8_t { kNone, kWorkersUp, kWorkersDown, kDepthUp, kDepthDown };
  /// The largest depth that fits the memory budget with `workers` (at least 1).
  std::size_t depth_cap(int workers, std::uint64_t batch_bytes) const;
  bool fits(AutotuneSetting s, std::uint64_t batch_bytes) const;
  AutotuneSetting start_trial(Move move, AutotuneSetting next, double rate, const char* why);

  AutotuneLimits limits_;
  Tuning tuning_;
  AutotuneSetting current_;
  // Intervals judged at the current setting (since it was set) and their summed throughput.
  int intervals_ = 0;
  double rate_sum_ = 0;
  // The trial in progress: its move, the setting before it and that setting's throughput.
  Move trial_ = Move::kNone;
  AutotuneSetting before_;
  double before_rate_ = 0;
  // Moves that did not pay, and how many intervals until they may be tried again.
  int workers_up_block_ = 0, workers_down_block_ = 0, depth_up_block_ = 0, depth_down_block_ = 0;
  std::uint64_t changes_ = 0;
  std::string reason_;
};

}  // namespace flowstate
