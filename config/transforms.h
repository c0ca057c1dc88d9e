// The registry of named functions YAML calls: map's transforms and filter's predicates
// (declared by options tables: nodes/transform.h), and the built-in
// transforms. Registration is explicit: with_builtins() adds the built-ins; a program registers
// its own the same way and passes its registry to the YAML loader (also used inside a mix's
// inputs); a plugin registers into the process's global() one (config/plugins.h).
//
//   TransformRegistry t = TransformRegistry::with_builtins();
//   t.add(define_transform<ClipOptions>("clip", "clips values to [0, max]", make_clip));
//   t.add(define_predicate<EvenOptions>("even", "keeps even ids", make_even));
//   Pipeline p = from_yaml_file("pipeline.yaml", {.transforms = &t});
//
// Built-in transforms (each takes `field`, default "data", the field it reads and replaces):
//   decode       little-endian record bytes → a tensor of `dtype` and `shape` (zero-copy
//                when aligned on a little-endian host)
//   cast         converts the values to `dtype` (integers wrap; floats saturate, NaN → 0)
//   normalize    (x - mean) / std as float32
//   slice        the rows [start, start + length) of the first dimension (a view)
//   random_crop  `length` consecutive rows at a random start drawn from the element's own
//                generator: the same for any number of workers, and after a resume
//   parse_int    decimal text (a WebDataset `.cls` label) -> an int64 scalar
// Image transforms (nodes/image_transforms.h): resize, center_crop, random_resized_crop, flip,
// normalize_image.
// Built-in predicates (nodes/filter.cpp): length, value, keep_fraction.
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

/// Transforms and predicates by name, each in registration order. Safe to read from many
/// threads once built.
class TransformRegistry {
 public:
  /// A registry holding the built-in transforms and predicates.
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

  /// Registers a filter predicate; throws std::invalid_argument when the name is empty or
  /// taken, when `make` is missing, or when a parameter is named `fn` (the filter's own).
  void add(PredicateSchema schema);
  /// The predicate called `name`, or null.
  const PredicateSchema* find_predicate(std::string_view name) const;
  const std::vector<PredicateSchema>& predicates() const { return predicates_; }
  std::vector<std::string> predicate_names() const;

 private:
  std::vector<TransformSchema> transforms_;
  std::vector<PredicateSchema> predicates_;
};

/// The `field` parameter of the built-in transforms (a string, default "data"), for a
/// TransformSchema written by hand.
ParamSchema field_param();

/// Registers decode, cast, normalize, slice, random_crop, parse_int and the image transforms.
void register_builtin_transforms(TransformRegistry& registry);

}  // namespace flowstate
