// Reading one YAML document's values against parameter schemas: scalars to ParamValues
// (integers, floats, strings, lists, `auto`, choices, bounds and checks), parameter maps to
// Params with defaults, and every error worded at its place — file:line:col, or the `--set`
// override that wrote the value. The YAML loader (config/yaml.cpp) reads a pipeline's
// structure; this reads what each of its parts is given.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "flowstate/config/yaml_support.h"
#include "flowstate/nodes/params.h"

namespace flowstate::yaml_support {

/// Reads values and parameter maps of one document (named `origin` in messages).
class YamlParams {
 public:
  explicit YamlParams(std::string origin) : origin_(std::move(origin)) {}

  /// A `--set` override applied to the document: values under its key are said to come
  /// from it.
  void add_override(Override o);

  /// "origin:line:col" of a mark ("origin" for none).
  std::string location(const YAML::Mark& m) const;
  /// Where the value at `key` was written: its override, or its place in the file.
  std::string where(const YAML::Node& n, const std::string& key) const;
  /// Throws ConfigError keyed `key`: "where: key: message".
  [[noreturn]] void fail(const YAML::Node& at, const std::string& key,
                         const std::string& message) const;

  /// The value of `n` as parameter `p` wants it; fails naming `key`.
  ParamValue parse_value(const YAML::Node& n, const ParamSchema& p, const std::string& key) const;
  /// Validates the parameter map `map` (null: none given) of the thing at `key` against
  /// `schemas`, filling in defaults. `at` locates the thing itself; `ignore` lists keys
  /// handled by the caller; `what` names it in the unknown-key message.
  Params parse_params(const YAML::Node& map, const YAML::Node& at, const std::string& key,
                      const std::vector<const std::vector<ParamSchema>*>& schemas,
                      const std::string& what, const std::set<std::string>& ignore = {}) const;
  /// The parameter called `name` in `schemas`, or null.
  static const ParamSchema* find_param(const std::vector<const std::vector<ParamSchema>*>& schemas,
                                       const std::string& name);

 private:
  std::uint64_t parse_uint(const YAML::Node& n, const ParamSchema& p, const std::string& key) const;
  std::int64_t parse_int(const YAML::Node& n, const std::string& key) const;
  double parse_float(const YAML::Node& n, const std::string& key) const;
  /// Reads the map `map` given to the group parameter `group` (ParamType::kMap) at `key`: each
  /// sub-key checked by its field's schema (an unknown one fails naming `key.sub`, `what` in the
  /// message), its value added to `given` as "name.sub" and its place to `wheres`.
  void parse_group(const YAML::Node& map, const ParamSchema& group, const std::string& name,
                   const std::string& key, const std::string& what,
                   std::vector<std::pair<std::string, ParamValue>>& given,
                   std::vector<std::pair<std::string, std::string>>& wheres) const;

  std::string origin_;
  std::vector<Override> overrides_;
};

}  // namespace flowstate::yaml_support
