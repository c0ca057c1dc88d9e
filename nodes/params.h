// Parameters of nodes, transforms and the pipeline: their types, values, schemas and the
// validated values of one node (Params). The options table of every node (nodes/options.h)
// derives its schema from these types; the YAML loader (config/yaml.h) parses against them
// and `flowstate schema` prints them.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "flowstate/core/error.h"
#include "flowstate/nodes/description.h"

namespace flowstate {

/// The value the word `auto` stands for in an unsigned parameter that accepts it
/// (ParamSchema::auto_value): the runtime picks, and adjusts, the value (graph/autotune.h).
inline constexpr std::uint64_t kAuto = 0;
/// The value the word `inline` stands for in an unsigned parameter that accepts it
/// (ParamSchema::inline_value): no thread of its own, the work runs on the consumer's thread.
/// As an `int` (Pipeline::workers, LoaderOptions::workers) it is -1.
inline constexpr std::uint64_t kInline = ~std::uint64_t{0};

/// The type of a parameter value.
enum class ParamType : std::uint8_t {
  kBool,        ///< true / false
  kUInt,        ///< a non-negative 64-bit integer
  kInt,         ///< a signed 64-bit integer
  kFloat,       ///< a finite number
  kString,      ///< any scalar, as text
  kStringList,  ///< a string or a list of strings
  kIntList,     ///< an integer or a list of integers
  /// A map of named sub-parameters (ParamSchema::fields), e.g. `cache: {dir: d, limit: 1GiB}`.
  /// It has no value of its own: Params holds each given sub-parameter as "group.key".
  kMap,
};
/// "an unsigned integer", "a boolean", ...: what a value of type `t` is, for messages.
std::string_view param_type_name(ParamType t);

/// A parameter value; the alternative matches the ParamType (kUInt: uint64_t, kInt: int64_t,
/// kFloat: double, kStringList: vector<string>, kIntList: vector<int64_t>).
using ParamValue = std::variant<bool, std::uint64_t, std::int64_t, double, std::string,
                                std::vector<std::string>, std::vector<std::int64_t>>;
/// The canonical text of a value: "true", "42", "0.5", "text", "[a, b]", "[256, 2]".
std::string format_param(const ParamValue& value);

/// One parameter of a node, a transform or the pipeline.
struct ParamSchema {
  std::string name;
  ParamType type = ParamType::kString;
  /// Filled in when the parameter is absent. None: required, or left unset (see default_doc).
  std::optional<ParamValue> default_value;
  std::string doc;  ///< one line
  bool required = false;
  /// Inclusive bounds of numbers (of each element, for kIntList). Doubles: exact for every
  /// bound a schema needs.
  std::optional<double> min;
  std::optional<double> max;
  /// The values a kString accepts; empty: any.
  std::vector<std::string> choices;
  /// A free parameter never changes the output (worker counts, depths, devices); it is left
  /// out of the fingerprint.
  bool free = false;
  /// A data parameter (FieldSpec::data, DescribedParam::data): a resume that opts in continues
  /// over a change of it (docs/DECISIONS.md "Changing the data mid-run").
  bool data = false;
  /// kUInt only: the word `auto` is accepted too, as kAuto (0); a written 0 is still out of
  /// range. Only free parameters take it (the runtime tunes them, graph/autotune.h).
  bool auto_value = false;
  /// kUInt only: the word `inline` is accepted too, as kInline (Pipeline's `workers`).
  bool inline_value = false;
  /// What an unset parameter without a default means ("RANK, ... else 0"), for the docs.
  std::string default_doc;
  /// Extra validation: returns the problem ("must not be empty"), or "" when the value is fine.
  std::function<std::string(const ParamValue&)> check;
  /// kMap only: the sub-parameters a map takes, each checked like a parameter (an unknown key
  /// is an error naming it). Their values are the Params entries "name.field".
  std::vector<ParamSchema> fields;
};

/// The validated parameters of one node: every parameter of its schema that was given or
/// has a default. Accessors throw std::logic_error on a name or type the schema does not
/// declare (a bug in the node, not in the user's pipeline).
class Params {
 public:
  Params() = default;
  /// `key` is the node's key path ("nodes[2].shuffle"); `where` maps a parameter name (or ""
  /// for the node itself) to its source location ("pipeline.yaml:4:15"), used in messages.
  Params(std::string key, std::vector<std::pair<std::string, ParamValue>> values,
         std::vector<std::pair<std::string, std::string>> where = {});

  bool has(std::string_view name) const { return find(name) != nullptr; }
  /// True when the parameter was written (not filled in from its default).
  bool given(std::string_view name) const;
  const ParamValue* find(std::string_view name) const;
  bool boolean(std::string_view name) const { return get<bool>(name); }
  std::uint64_t uint(std::string_view name) const { return get<std::uint64_t>(name); }
  std::int64_t integer(std::string_view name) const { return get<std::int64_t>(name); }
  double real(std::string_view name) const { return get<double>(name); }
  const std::string& string(std::string_view name) const { return get<std::string>(name); }
  const std::vector<std::string>& strings(std::string_view name) const {
    return get<std::vector<std::string>>(name);
  }
  const std::vector<std::int64_t>& ints(std::string_view name) const {
    return get<std::vector<std::int64_t>>(name);
  }
  std::optional<std::uint64_t> optional_uint(std::string_view name) const;

  /// The node's key path ("nodes[2].shuffle"); `key("size")` is "nodes[2].shuffle.size".
  const std::string& key() const { return key_; }
  std::string key(std::string_view param) const;
  /// "file:line:col" of a parameter (or of the node when the parameter was not written).
  std::string where(std::string_view param = {}) const;

  /// The parameters of `schema` that are set, in schema order, as described parameters
  /// (free ones marked): what a node puts into its NodeDescription.
  std::vector<DescribedParam> describe(const std::vector<ParamSchema>& schema) const;

  const std::vector<std::pair<std::string, ParamValue>>& values() const { return values_; }

 private:
  template <class T>
  const T& get(std::string_view name) const;

  std::string key_;
  std::vector<std::pair<std::string, ParamValue>> values_;
  std::vector<std::pair<std::string, std::string>> where_;
};

/// Checks `value` against `p`'s range, choices and check; returns the problem or "".
std::string check_param(const ParamSchema& p, const ParamValue& value);
/// Checks the number `value`, written as `text`, against `p`'s bounds; returns the problem
/// ("300 is out of range (must be between 1 and 255)") or "".
std::string check_number(const ParamSchema& p, double value, const std::string& text);

/// A ConfigError about parameter `param` of `p`: its key is p.key(param) and its message
/// "file:line:col: key: message" (the location omitted when unknown).
ConfigError param_error(const Params& p, std::string_view param, const std::string& message);

/// A DataError about what a record (or batch) holds, found at run time while applying
/// parameter `param` of `p`: the message is param_error's ("file:line:col: key: message"), so
/// it still points at the YAML value, but the data is what does not fit it (exit status 3).
/// Problems the configuration alone shows stay ConfigErrors, found when the pipeline is built.
DataError param_data_error(const Params& p, std::string_view param, const std::string& message);

/// Documentation of a parameter list, one line per parameter, for `flowstate schema`.
std::string describe_params(const std::vector<ParamSchema>& params, std::string_view indent);

}  // namespace flowstate
