// libFuzzer target: the `indexed` source's reading of a Megatron .idx against its .bin — the
// header, the counts, every length, pointer and document-index entry — and every record read
// as a document and as a sequence.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const flowstate::fuzz::ScratchDir dir;  // removed when the fuzzer exits
  flowstate::fuzz::megatron_one_input(dir, data, size);
  return 0;
}
