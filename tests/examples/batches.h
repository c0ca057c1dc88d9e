// What the example-node tests read back from a batch of the records test data
// (testing::write_records: record i starts with i).
#pragma once

#include <cstdint>
#include <vector>

#include "flowstate/core/batch.h"
#include "tests/support/testing.h"

namespace flowstate::examples_test {

/// The record indices of a batch's samples (field "data"), in order.
inline std::vector<std::uint64_t> indices(const Batch& b) {
  const Tensor& t = b["data"];
  std::vector<std::uint64_t> out;
  for (std::int64_t i = 0; i < t.shape()[0]; ++i)
    out.push_back(
        testing::record_index(static_cast<const std::byte*>(t.data()) + i * t.shape()[1]));
  return out;
}

}  // namespace flowstate::examples_test
