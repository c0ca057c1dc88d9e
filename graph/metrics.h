// Metrics over time: what a running Loader reports every LoaderOptions::metrics_interval_s —
// written as one JSON line to LoaderOptions::metrics (`flowstate run --metrics FILE.jsonl`)
// and handed to LoaderOptions::on_metrics.
//
// A line (keys in this order; `step`/`epoch` null before the first batch):
//   {"t":12.5,"step":4999,"epoch":0,"samples_per_s":81234,"mb_per_s":83.2,"in_flight":6,
//    "busy":{"records":0.21,"map:augment":0.94,...},"consumer_wait":0.03,"rss_bytes":123456789,
//    "checkpoints":[{"step":5000,"at":12.1,"cut_s":1e-05,"encode_s":0.0002,"write_s":0.004,
//                    "commit_s":0.002}]}
// `t` is seconds since the Loader was made; rates and shares are over the interval since the
// previous line. `busy` is each node's share of the time of the threads it runs on (the spine:
// one; the assembly: the workers; deliver: one), 0..1. `consumer_wait` is the share of the
// interval the consumer spent waiting in next(). `checkpoints` lists the checkpoints that
// committed during the interval (async or not), with each phase's duration.
// The Loader writes a last line when it is destroyed, for what happened since the previous one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace flowstate {

/// One metrics line (see the file comment).
struct MetricsSample {
  double t = 0;  ///< seconds since the Loader was made
  std::optional<std::uint64_t> step;
  std::optional<std::uint64_t> epoch;
  double samples_per_s = 0;
  double mb_per_s = 0;  ///< 1e6 bytes per second of batch fields
  std::size_t in_flight = 0;
  struct NodeBusy {
    std::string name;  ///< stats name ("map:augment")
    double busy = 0;   ///< share of its stage's threads, 0..1
    int threads = 1;   ///< threads of its stage
  };
  std::vector<NodeBusy> busy;
  double consumer_wait = 0;
  std::uint64_t rss_bytes = 0;
  struct Checkpoint {
    std::uint64_t step = 0;
    double at = 0;  ///< seconds since the Loader was made, when it committed
    double cut_s = 0, encode_s = 0, write_s = 0, commit_s = 0;
  };
  std::vector<Checkpoint> checkpoints;
};

/// The sample as one JSON line (no newline).
std::string to_json_line(const MetricsSample& sample);
/// Parses a line written by to_json_line; throws Error naming what is wrong.
MetricsSample parse_metrics_line(const std::string& line);

/// The process's current resident set (VmRSS), in bytes; 0 when /proc is unavailable.
std::uint64_t current_rss_bytes();

}  // namespace flowstate
