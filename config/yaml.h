// YAML pipelines (DESIGN.md §10): a YAML file maps onto Pipeline::Builder calls.
//
//   seed: 1234
//   source: {type: records, paths: "data/train-*.bin", record_bytes: 1024}
//   nodes:                       # one-key maps, node type -> parameters, applied in order
//     - shard: {world: 1, rank: 0}
//     - shuffle: {mode: buffer, size: 16384}
//     - map: {fn: decode, dtype: uint16, workers: 2}
//     - batch: {size: 256, drop_last: false}
//     - prefetch                 # a bare name: every parameter at its default
//   epochs: 1                    # optional; 0 runs until stopped
//   workers: 2                   # optional, free
//   checkpoint: {dir: ckpt, every_steps: 1000, keep: 3}   # optional, read by `flowstate run`
//   plugins: [lib/libmy_nodes.so] # optional: libraries adding node types (config/plugins.h),
//                                 # loaded before the nodes are read; relative to this file
//
//   Pipeline p = from_yaml_file("pipeline.yaml");
//
// Every node's parameters are checked against its schema (config/registry.h, and the map
// transform's, config/transforms.h). Unknown keys, unknown node types, wrong types,
// out-of-range values and missing required keys throw ConfigError whose key() is the key
// path ("nodes[2].shuffle.size") and whose message is "file:line:column: key: problem"
// (1-based). Relative paths in the YAML (source paths, checkpoint.dir) resolve against the
// YAML file's directory. `overrides` ("nodes[1].shuffle.size=1024", "seed=7") replace values
// before validation; an error in an overridden value names the override instead of a line.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "flowstate/graph/pipeline.h"

namespace flowstate {

class Registry;
class TransformRegistry;

/// How a YAML pipeline is loaded.
struct YamlOptions {
  /// "key.path=value" overrides; the value is YAML ("7", "[a, b]", "{size: 4}").
  std::vector<std::string> overrides;
  /// Directory relative paths resolve against. Unset: the YAML file's directory for files,
  /// the current directory for strings.
  std::optional<std::filesystem::path> base_dir;
  const Registry* registry = nullptr;             ///< null: Registry::global()
  const TransformRegistry* transforms = nullptr;  ///< null: TransformRegistry::global()
  /// Loads an input of a `mix` (Pipeline::Builder::build_input): a source with shard,
  /// shuffle, filter and per-sample maps, no batch.
  bool mix_input = false;
};

/// The `checkpoint:` section.
struct CheckpointConfig {
  std::string dir;  ///< resolved against the base directory
  std::uint64_t every_steps = 0;
  std::size_t keep = 0;
};

/// Everything a YAML pipeline says: the pipeline and how to run it.
struct PipelineConfig {
  Pipeline pipeline;
  std::uint64_t epochs = 1;
  std::optional<CheckpointConfig> checkpoint;
  std::string origin;  ///< the file (or the name given to a string)
};

/// Loads a pipeline file. Throws ConfigError (unreadable file, invalid YAML, invalid
/// pipeline) as described in the file comment.
PipelineConfig load_yaml_file(const std::string& path, const YamlOptions& options = {});
/// Loads a pipeline from `text`; `origin` names it in messages.
PipelineConfig load_yaml_string(std::string_view text, const std::string& origin,
                                const YamlOptions& options = {});

/// The pipeline of a file (load_yaml_file(path).pipeline).
Pipeline from_yaml_file(const std::string& path, const YamlOptions& options = {});
/// The pipeline of a string (load_yaml_string(text, origin).pipeline).
Pipeline from_yaml_string(std::string_view text, const std::string& origin = "<string>",
                          const YamlOptions& options = {});

}  // namespace flowstate
