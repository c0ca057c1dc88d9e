#include "fuzz/fuzz_targets.h"

#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string_view>

#include "config/yaml.h"
#include "core/error.h"
#include "graph/loader.h"

namespace flowstate::fuzz {

void yaml_one_input(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  YamlOptions options;
  // Relative paths resolve under a directory that does not exist: nothing is opened anyway.
  options.base_dir = "/nonexistent-flowstate-fuzz";
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    if (line.starts_with("#set ")) options.overrides.emplace_back(line.substr(5));
    pos = end + 1;
  }
  try {
    PipelineConfig config = load_yaml_string(text, "fuzz.yaml", options);
    (void)config.pipeline.fingerprint();
    (void)config.pipeline.describe();
  } catch (const Error&) {
    // Bad input, reported as it should be.
  }
}

struct StateTarget::Impl {
  std::filesystem::path dir;
  std::unique_ptr<Loader> loader;

  Impl() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "flowstate-fuzz-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir = tmpl;
    // 2 files × 32 records × 16 bytes.
    for (int f = 0; f < 2; ++f) {
      std::ofstream out(dir / ("part-" + std::to_string(f) + ".bin"), std::ios::binary);
      for (std::uint64_t i = 0; i < 32; ++i) {
        std::uint64_t words[2] = {f * 32 + i, ~(f * 32 + i)};
        out.write(reinterpret_cast<const char*>(words), sizeof(words));
      }
    }
    loader = std::make_unique<Loader>(pipeline(), LoaderOptions{.epochs = 3, .workers = 1});
  }

  ~Impl() {
    loader.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  Pipeline pipeline() const {
    return Pipeline::Builder()
        .seed(42)
        .records({.paths = {(dir / "part-*.bin").string()}, .record_bytes = 16})
        .shard({.rank = 0, .world = 1})
        .shuffle({.mode = ShuffleMode::kGlobal})
        .shuffle({.mode = ShuffleMode::kBuffer, .size = 8})
        .batch({.size = 5})
        .build();
  }
};

StateTarget::StateTarget() : impl_(std::make_unique<Impl>()) {}
StateTarget::~StateTarget() = default;

bool StateTarget::one_input(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    // The checkpoint file reader's own checks first, then the whole restore.
    (void)PipelineState::decode(bytes, "fuzz-state.bin");
    impl_->loader->load_state(bytes);
  } catch (const Error&) {
    return false;  // bad input, reported as it should be
  }
  try {
    for (int i = 0; i < 3; ++i)
      if (!impl_->loader->next()) break;
  } catch (const Error&) {
    // A state that restores may still describe a position the data cannot continue from.
  }
  return true;
}

std::vector<std::string> StateTarget::seeds() {
  std::vector<std::string> out;
  for (std::size_t k : {0, 1, 5, 12, 13, 20, 26, 38}) {
    Loader l(impl_->pipeline(), {.epochs = 3, .workers = 1});
    if (k == 20) l.skip(22, 24);
    for (std::size_t i = 0; i < k; ++i)
      if (!l.next()) break;
    out.push_back(l.state());
  }
  return out;
}

}  // namespace flowstate::fuzz
