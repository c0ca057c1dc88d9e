// Named functions that YAML calls by name: a map's transform (`- map: {fn: decode, ...}`) and
// a filter's predicate (`- filter: {fn: length, ...}`, nodes/filter.h). Each is declared like a
// node, by an options table (nodes/options.h): its parameters, defaults, bounds, choices and
// docs are the table's rows, so YAML's checks, `flowstate schema` and the fingerprint derive
// from one place, and each bound is checked once, by its row. The node API's half: `map`'s
// YAML form (nodes/map.cpp) looks a transform up through its YamlContext; the registry that
// holds them, and the built-in transforms, are config/transforms.h.
//
//   struct ClipOptions {
//     std::string field = "data";
//     double max = 0;
//     static constexpr auto table() {
//       return std::tuple{param("field", &ClipOptions::field, {.doc = "the field"}),
//                         param("max", &ClipOptions::max, {.required = true, .min = 0,
//                                                           .doc = "upper bound"})};
//     }
//   };
//   registry.add(define_transform<ClipOptions>(
//       "clip", "clips values to [0, max]",
//       [](const ClipOptions& o, const Params& p) -> SampleFn { ... }));
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "flowstate/nodes/assembly.h"
#include "flowstate/nodes/options.h"
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

/// The options of table `O` that parameters `p` stand for. Each value `p` holds is checked
/// against its row (bounds, choices, check) — YAML has done so already; a C++ caller's Params
/// get the same check and message — then `O::validate()`, when the struct has one, checks
/// across options (its ConfigError's key is a parameter's name, as YAML reports it).
template <OptionsTable O>
O read_options(const Params& p) {
  for (const ParamSchema& row : schema_of<O>())
    if (const ParamValue* v = p.find(row.name)) {
      const std::string problem = check_param(row, *v);
      if (!problem.empty()) throw param_error(p, row.name, problem);
    }
  O o = options_from<O>(p);
  if constexpr (requires { o.validate(); }) o.validate();
  return o;
}

/// A transform declared by its options table `O`: its parameters are schema_of<O>(), and
/// `make_sample` (`make_batch`: empty when it works on single samples only) gets the options
/// that the validated parameters stand for, and the parameters themselves, to place errors
/// (param_error, param_data_error).
template <OptionsTable O>
TransformSchema define_transform(std::string name, std::string doc,
                                 std::function<SampleFn(const O&, const Params&)> make_sample,
                                 std::function<BatchFn(const O&, const Params&)> make_batch = {}) {
  TransformSchema t{.name = std::move(name), .doc = std::move(doc), .params = schema_of<O>()};
  t.make_sample = [f = std::move(make_sample)](const Params& p) {
    return f(read_options<O>(p), p);
  };
  if (make_batch)
    t.make_batch = [f = std::move(make_batch)](const Params& p) {
      return f(read_options<O>(p), p);
    };
  return t;
}

/// A predicate that keeps a sample when the first dimension of its 1-D field `field` lies in
/// [min, max]: the filter may decide it from RecordStore::view, without reading the record.
struct LengthRule {
  FieldId field = 0;
  double min = 0, max = 0;
};

/// What a named predicate makes: the function, and the length rule it is exactly, if any.
struct Predicate {
  FilterFn fn;
  std::optional<LengthRule> by_length;
};

/// A registered filter predicate, what `- filter: {fn: NAME, ...}` names (nodes/filter.h; the
/// registry is config/transforms.h's, beside the transforms; a plugin adds its own the same way).
struct PredicateSchema {
  std::string name;  ///< the `fn` value
  std::string doc;   ///< one line
  /// Its parameters (besides the filter's own `fn`).
  std::vector<ParamSchema> params;
  /// Makes the predicate from validated parameters. May throw ConfigError keyed by a
  /// parameter; the predicate may throw DataError.
  std::function<Predicate(const Params&)> make;
};

/// A predicate declared by its options table `O` (define_transform above, for a filter): its
/// parameters are schema_of<O>(); `make` gets the options and the parameters.
template <OptionsTable O>
PredicateSchema define_predicate(std::string name, std::string doc,
                                 std::function<Predicate(const O&, const Params&)> make) {
  PredicateSchema s{.name = std::move(name), .doc = std::move(doc), .params = schema_of<O>()};
  s.make = [f = std::move(make)](const Params& p) { return f(read_options<O>(p), p); };
  return s;
}

/// The built-in predicates: length, value and keep_fraction (defined in nodes/filter.cpp).
std::vector<PredicateSchema> builtin_predicates();

}  // namespace flowstate
