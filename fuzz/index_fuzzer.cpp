// libFuzzer target: the index cache (`<file>.fsidx`) of the lines and tar sources — its own
// checks of a cache file, and the sources' use of an index a valid cache holds.
//
// With FLOWSTATE_FUZZ_WRITE_SEEDS=DIR set, writes valid inputs into DIR as a seed corpus
// when it starts (fuzz/run.sh does this).
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_targets.h"

namespace {
flowstate::fuzz::IndexTarget* target = nullptr;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  target = new flowstate::fuzz::IndexTarget();  // lives as long as the process
  flowstate::fuzz::write_seeds_if_asked(target->seeds());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  (void)target->one_input(data, size);
  return 0;
}
