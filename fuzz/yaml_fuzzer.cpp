// libFuzzer target: the YAML pipeline loader (config/yaml.h), overrides included.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  flowstate::fuzz::yaml_one_input(data, size);
  return 0;
}
