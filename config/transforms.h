// Named map transforms: what `- map: {fn: decode, dtype: uint16}` runs. Each transform has a
// parameter schema (validated by the YAML loader like a node's) and makes a per-sample
// function, and optionally a per-batch one (used when the map comes after `batch`). The
// map's NodeDescription holds the transform's name and parameters, so they enter the
// fingerprint. Registration is explicit: register_builtin_transforms() adds the built-ins; a
// program registers its own the same way and passes its registry to the YAML loader.
//
//   TransformRegistry t = TransformRegistry::with_builtins();
//   t.add({.name = "clip", .doc = "clips values to [0, max]",
//          .params = {field_param(), {.name = "max", .type = ParamType::kFloat,
//                                     .doc = "upper bound", .required = true}},
//          .make_sample = [](const Params& p) -> SampleFn { ... }});
//   Pipeline p = from_yaml_file("pipeline.yaml", {.transforms = &t});
//
// Built-ins (each takes `field`, default "data", the field it reads and replaces):
//   decode       little-endian record bytes → a tensor of `dtype` and `shape` (zero-copy
//                when aligned on a little-endian host)
//   cast         converts the values to `dtype` (integers wrap; floats saturate, NaN → 0)
//   normalize    (x - mean) / std as float32
//   slice        the rows [start, start + length) of the first dimension (a view)
//   random_crop  `length` consecutive rows at a random start drawn from the element's own
//                generator: the same for any number of workers, and after a resume
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "flowstate/core/error.h"
#include "flowstate/nodes/assembly.h"
#include "flowstate/nodes/params.h"
#include "flowstate/nodes/transform.h"

namespace flowstate {

/// Transforms by name, in registration order. Safe to read from many threads once built.
class TransformRegistry {
 public:
  /// A registry holding the built-in transforms.
  static TransformRegistry with_builtins();
  /// The shared built-in registry (built on first use; immutable).
  static const TransformRegistry& builtin();
  /// The process's registry: the built-ins plus every transform a loaded plugin registered;
  /// what YAML uses when no registry is given.
  static TransformRegistry& global();

  /// Registers a transform; throws std::invalid_argument when the name is empty or taken,
  /// when `make_sample` is missing, or when a parameter is named `fn` or `workers` (the
  /// map's own).
  void add(TransformSchema schema);
  /// The transform called `name`, or null.
  const TransformSchema* find(std::string_view name) const;
  const std::vector<TransformSchema>& transforms() const { return transforms_; }
  std::vector<std::string> names() const;

 private:
  std::vector<TransformSchema> transforms_;
};

/// Registers decode, cast, normalize, slice and random_crop.
void register_builtin_transforms(TransformRegistry& registry);

/// The `field` parameter of the built-in transforms (a string, default "data").
ParamSchema field_param();

/// A ConfigError about parameter `param` of `p`: its key is p.key(param) and its message
/// "file:line:col: key: message" (the location omitted when unknown).
ConfigError param_error(const Params& p, std::string_view param, const std::string& message);

/// A DataError about what a record (or batch) holds, found at run time while applying
/// parameter `param` of `p`: the message is param_error's ("file:line:col: key: message"), so
/// it still points at the YAML value, but the data is what does not fit it (exit status 3).
/// Problems the configuration alone shows stay ConfigErrors, found when the pipeline is built.
DataError param_data_error(const Params& p, std::string_view param, const std::string& message);

}  // namespace flowstate
