// A named map transform, as `- map: {fn: NAME, ...}` names it: its parameters and how it makes
// the per-sample (and per-batch) function. The node API's half of transforms: `map`'s YAML form
// (nodes/map.cpp) looks one up through its YamlContext; the registry and the built-ins are
// config/transforms.h.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "flowstate/nodes/assembly.h"
#include "flowstate/nodes/params.h"

namespace flowstate {

/// A registered map transform.
struct TransformSchema {
  std::string name;  ///< the `fn` value
  std::string doc;   ///< one line
  /// Its parameters (besides the map's own `fn` and `workers`).
  std::vector<ParamSchema> params;
  /// Makes the per-sample function from validated parameters. May throw ConfigError. The
  /// function may throw ConfigError (the configuration does not fit the data, e.g. a shape
  /// that does not match the record size) or DataError.
  std::function<SampleFn(const Params&)> make_sample;
  /// Makes the per-batch function (fields are [B, ...]); empty when the transform only works
  /// on single samples.
  std::function<BatchFn(const Params&)> make_batch;
};

}  // namespace flowstate
