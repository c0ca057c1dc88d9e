// libFuzzer target: the lines source — the line index and its cache, text and JSON Lines
// reads with and without json_fields, skip_empty off and on.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const flowstate::fuzz::ScratchDir dir;  // removed when the fuzzer exits
  flowstate::fuzz::lines_one_input(dir, data, size);
  return 0;
}
