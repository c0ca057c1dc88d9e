// libFuzzer target: the tar reader — TarScanner's parse of the archive, the grouping of its
// members into samples with and without `fields`, and the index cache it writes and reads.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const flowstate::fuzz::ScratchDir dir;  // removed when the fuzzer exits
  flowstate::fuzz::tar_one_input(dir, data, size);
  return 0;
}
