// libFuzzer target: the checkpoint state reader — PipelineState::decode, then the restore of
// every spine node through Loader::load_state on a tiny pipeline, then a few batches.
//
// With FLOWSTATE_FUZZ_WRITE_SEEDS=DIR set, writes valid states of that pipeline into DIR as a
// seed corpus when it starts (fuzz/run.sh does this).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "fuzz/fuzz_targets.h"

namespace {
flowstate::fuzz::StateTarget* target = nullptr;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  target = new flowstate::fuzz::StateTarget();  // lives as long as the process
  flowstate::fuzz::write_seeds_if_asked(target->seeds());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  (void)target->one_input(data, size);
  return 0;
}
