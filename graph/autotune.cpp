#include "flowstate/graph/autotune.h"

#include <unistd.h>

#include <algorithm>

namespace flowstate {

std::uint64_t default_memory_budget() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return std::uint64_t{1} << 30;
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) / 8;
}

Autotuner::Autotuner(AutotuneLimits limits, AutotuneSetting start)
    : Autotuner(limits, start, Tuning{}) {}

Autotuner::Autotuner(AutotuneLimits limits, AutotuneSetting start, Tuning tuning)
    : limits_(limits), tuning_(tuning), current_(start) {
  limits_.max_workers = std::max(1, limits_.max_workers);
  limits_.max_depth = std::max<std::size_t>(1, limits_.max_depth);
  current_.workers = std::clamp(current_.workers, 1, limits_.max_workers);
  current_.depth = std::clamp<std::size_t>(current_.depth, 1, limits_.max_depth);
}

bool Autotuner::fits(AutotuneSetting s, std::uint64_t batch_bytes) const {
  if (limits_.memory_budget == 0 || batch_bytes == 0) return true;
  const auto in_flight = static_cast<std::uint64_t>(s.workers) + s.depth;
  return in_flight * batch_bytes <= limits_.memory_budget;
}

std::size_t Autotuner::depth_cap(int workers, std::uint64_t batch_bytes) const {
  if (limits_.memory_budget == 0 || batch_bytes == 0) return limits_.max_depth;
  const std::uint64_t batches = limits_.memory_budget / batch_bytes;
  const auto w = static_cast<std::uint64_t>(workers);
  const std::uint64_t room = batches > w ? batches - w : 1;
  return static_cast<std::size_t>(std::clamp<std::uint64_t>(room, 1, limits_.max_depth));
}

AutotuneSetting Autotuner::start_trial(Move move, AutotuneSetting next, double rate,
                                       const char* why) {
  trial_ = move;
  before_ = current_;
  before_rate_ = rate;
  current_ = next;
  intervals_ = 0;
  rate_sum_ = 0;
  ++changes_;
  reason_ = why;
  return current_;
}

AutotuneSetting Autotuner::update(const AutotuneSample& s) {
  for (int* block :
       {&workers_up_block_, &workers_down_block_, &depth_up_block_, &depth_down_block_})
    if (*block > 0) --*block;

  // The memory budget first: a cut is forced, and ends any trial.
  if (!fits(current_, s.batch_bytes)) {
    AutotuneSetting next = current_;
    if (limits_.depth) next.depth = depth_cap(next.workers, s.batch_bytes);
    while (!fits(next, s.batch_bytes) && limits_.workers && next.workers > 1) {
      --next.workers;
      if (limits_.depth) next.depth = depth_cap(next.workers, s.batch_bytes);
    }
    if (!(next == current_)) {
      trial_ = Move::kNone;
      current_ = next;
      intervals_ = 0;
      rate_sum_ = 0;
      ++changes_;
      reason_ = "cut to the memory budget";
      return current_;
    }
  }

  if (s.seconds <= 0 || s.batches < tuning_.min_batches) {
    reason_ = "too few batches to judge";
    return current_;
  }
  ++intervals_;
  rate_sum_ += static_cast<double>(s.batches) / s.seconds;
  const double rate = rate_sum_ / intervals_;  // mean over the intervals at this setting

  // A trial is judged by the throughput it brought.
  if (trial_ != Move::kNone) {
    if (intervals_ < std::max(1, tuning_.judge)) {
      reason_ = "judging";
      return current_;
    }
    const Move move = trial_;
    trial_ = Move::kNone;
    const double gain = move == Move::kDepthUp ? tuning_.depth_gain : tuning_.gain;
    const bool down = move == Move::kWorkersDown || move == Move::kDepthDown;
    const bool keep =
        down ? rate >= before_rate_ * (1 - tuning_.loss) : rate >= before_rate_ * (1 + gain);
    if (keep) {
      reason_ = "kept: throughput " + std::to_string(rate / before_rate_) + "x";
      return current_;
    }
    current_ = before_;
    intervals_ = 0;
    rate_sum_ = 0;
    ++changes_;
    switch (move) {
      case Move::kWorkersUp:
        workers_up_block_ = tuning_.cooldown;
        break;
      case Move::kWorkersDown:
        workers_down_block_ = tuning_.cooldown;
        break;
      case Move::kDepthUp:
        depth_up_block_ = tuning_.cooldown;
        break;
      case Move::kDepthDown:
        depth_down_block_ = tuning_.cooldown;
        break;
      case Move::kNone:
        break;
    }
    reason_ = "undone: throughput " + std::to_string(rate / before_rate_) + "x";
    return current_;
  }

  if (intervals_ < std::max(1, tuning_.settle)) {
    reason_ = "settling";
    return current_;
  }
  const int w = current_.workers;
  if (s.consumer_wait > tuning_.wait_high) {
    // The consumer waits: the graph is short of batches.
    if (limits_.workers && workers_up_block_ == 0 && w < limits_.max_workers &&
        s.assemble_busy >= tuning_.busy_high && s.spine_busy < tuning_.spine_high) {
      AutotuneSetting next = current_;
      ++next.workers;
      if (limits_.depth) next.depth = std::min(next.depth, depth_cap(next.workers, s.batch_bytes));
      if (fits(next, s.batch_bytes))
        return start_trial(Move::kWorkersUp, next, rate, "workers up: the assembly is busy");
    }
    if (limits_.depth && depth_up_block_ == 0 && current_.depth < limits_.max_depth &&
        s.assemble_busy < tuning_.busy_high && s.spine_busy < tuning_.spine_high) {
      AutotuneSetting next = current_;
      next.depth = std::min(current_.depth * 2, depth_cap(w, s.batch_bytes));
      if (next.depth > current_.depth)
        return start_trial(Move::kDepthUp, next, rate, "depth up: the consumer waits in bursts");
    }
    // Short of batches with nothing cheaper left to try (no deeper queue, or it did not pay):
    // a worker more, judged like any move (on a shared machine it can win CPU time).
    if (limits_.workers && workers_up_block_ == 0 && w < limits_.max_workers &&
        s.spine_busy < tuning_.spine_high &&
        (!limits_.depth || depth_up_block_ > 0 ||
         current_.depth >= std::min(limits_.max_depth, depth_cap(w, s.batch_bytes)))) {
      AutotuneSetting next = current_;
      ++next.workers;
      if (limits_.depth) next.depth = std::min(next.depth, depth_cap(next.workers, s.batch_bytes));
      if (fits(next, s.batch_bytes))
        return start_trial(Move::kWorkersUp, next, rate, "workers up: the consumer still waits");
    }
  } else if (s.consumer_wait < tuning_.wait_low) {
    // The graph keeps up: would one worker fewer still?
    if (limits_.workers && workers_down_block_ == 0 && w > 1 &&
        s.assemble_busy * w / (w - 1) <= tuning_.down_load) {
      AutotuneSetting next = current_;
      --next.workers;
      return start_trial(Move::kWorkersDown, next, rate, "workers down: they idle");
    }
    // A queue deepened for bursts the consumer no longer waits on holds memory for nothing:
    // halve it (not below min_depth), kept unless that costs throughput.
    if (limits_.depth && depth_down_block_ == 0 && current_.depth > tuning_.min_depth) {
      AutotuneSetting next = current_;
      next.depth = std::max(tuning_.min_depth, current_.depth / 2);
      return start_trial(Move::kDepthDown, next, rate, "depth down: the consumer never waits");
    }
  }
  reason_ = "kept: nothing to change";
  return current_;
}

}  // namespace flowstate
