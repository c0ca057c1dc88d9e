// The pipeline of the crash tests, shared by the test and its worker process: W1-like but
// small — 20 000 records of 64 bytes in 4 files, buffer shuffle of 512, batches of 32, 3
// epochs (1875 steps).
#pragma once

#include <cstdint>
#include <string>

#include "flowstate/core/hash.h"
#include "flowstate/graph/pipeline.h"
#include "flowstate/nodes/builtin.h"
#include "flowstate/tools/mix_weights.h"

namespace flowstate::testing {

constexpr std::uint64_t kCrashRecords = 20000;
constexpr std::size_t kCrashRecordBytes = 64;
constexpr std::size_t kCrashShards = 4;
constexpr std::uint64_t kCrashEpochs = 3;
constexpr std::uint64_t kCrashSteps = kCrashEpochs * (kCrashRecords / 32);

inline Pipeline crash_pipeline(const std::string& glob) {
  return Pipeline::Builder()
      .seed(4242)
      .workers(2)
      .records({.paths = {glob}, .record_bytes = kCrashRecordBytes})
      .shuffle({.mode = ShuffleMode::kBuffer, .size = 512})
      .batch({.size = 32})
      .prefetch({.depth = 4})
      .build();
}

/// The mix the crash worker runs when its GLOB is "mix:A,B" (issue 25): two inputs of 64-byte
/// records, each globally shuffled, batches of 16, one all_exhausted epoch, with the weights
/// of crash_mix_weights() set while it runs.
inline Pipeline crash_mix_pipeline(const std::string& glob_a, const std::string& glob_b) {
  auto input = [](const std::string& glob, std::uint64_t seed) {
    return Pipeline::Builder()
        .seed(seed)
        .records({.paths = {glob}, .record_bytes = kCrashRecordBytes})
        .shuffle({.mode = ShuffleMode::kGlobal})
        .build_input();
  };
  return Pipeline::Builder()
      .seed(4243)
      .workers(2)
      .mix({input(glob_a, 1), input(glob_b, 2)},
           {.weights = {1, 1}, .stop = MixStop::kAllExhausted})
      .batch({.size = 16})
      .prefetch({.depth = 4})
      .build();
}

/// Weights set at steps 100 and 250 of the crash mix.
inline std::vector<MixWeightsAt> crash_mix_weights() {
  return {{.step = 100, .node = "mix", .weights = {1, 5}},
          {.step = 250, .node = "mix", .weights = {4, 1}}};
}

/// One delivered batch as a log line's payload: "step epoch index last remainder digest".
inline std::string crash_trace(const Batch& b) {
  return std::to_string(b.info.step) + " " + std::to_string(b.info.epoch) + " " +
         std::to_string(b.info.index_in_epoch) + " " + (b.info.is_last_in_epoch ? "1" : "0") + " " +
         std::to_string(b.info.remainder) + " " + hex64(b.digest());
}

}  // namespace flowstate::testing
