// The pipeline of the crash tests, shared by the test and its worker process: W1-like but
// small — 20 000 records of 64 bytes in 4 files, buffer shuffle of 512, batches of 32, 3
// epochs (1875 steps).
#pragma once

#include <cstdint>
#include <string>

#include "flowstate/core/hash.h"
#include "flowstate/graph/pipeline.h"
#include "flowstate/nodes/builtin.h"

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

/// One delivered batch as a log line's payload: "step epoch index last remainder digest".
inline std::string crash_trace(const Batch& b) {
  return std::to_string(b.info.step) + " " + std::to_string(b.info.epoch) + " " +
         std::to_string(b.info.index_in_epoch) + " " + (b.info.is_last_in_epoch ? "1" : "0") + " " +
         std::to_string(b.info.remainder) + " " + hex64(b.digest());
}

}  // namespace flowstate::testing
