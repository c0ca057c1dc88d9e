// Internal to the Loader (loader.cpp, checkpointing.cpp): what a Loader shares with its
// runtimes and its checkpoint writer threads for tracing and metrics.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "flowstate/graph/metrics.h"
#include "flowstate/graph/node_stats.h"
#include "flowstate/graph/trace.h"

namespace flowstate::detail {

/// Lives as long as the Loader and any checkpoint it is still writing (shared_ptr).
struct LoaderObserver {
  std::int64_t start_ns = stats_now_ns();
  std::unique_ptr<Tracer> tracer;  ///< null unless LoaderOptions::trace
  // Trace names (valid when tracer is set).
  std::uint16_t consumer_wait = 0, consumer_step = 0, in_flight = 0;
  std::uint16_t ck_cut = 0, ck_encode = 0, ck_write = 0, ck_commit = 0;

  /// Checkpoints committed since the last metrics sample took them.
  std::mutex mu;
  std::vector<MetricsSample::Checkpoint> checkpoints;

  void committed(const MetricsSample::Checkpoint& c) {
    std::lock_guard lock(mu);
    checkpoints.push_back(c);
  }
  double seconds_at(std::int64_t ns) const { return static_cast<double>(ns - start_ns) * 1e-9; }
};

}  // namespace flowstate::detail
