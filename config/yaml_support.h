// Helpers of the YAML loader (config/yaml.cpp) that need no loader state.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flowstate::yaml_support {

/// "a, b, c".
std::string join(const std::vector<std::string>& items);
/// Optimal string alignment distance between `a` and `b`.
std::size_t edit_distance(std::string_view a, std::string_view b);
/// "; did you mean 'size'?" when one of `known` is close to `name`, else "".
std::string suggestion(std::string_view name, const std::vector<std::string>& known);
/// What a YAML node is, for "expected X, got Y" messages.
std::string describe_node(const YAML::Node& n);
/// A scalar that is not a quoted string.
bool is_plain_scalar(const YAML::Node& n);
/// The start marks of at most `limit` documents of `text` (never loops on malformed input).
std::vector<YAML::Mark> document_starts(const std::string& text, std::size_t limit);

/// One override: the key path it sets and how to name it in messages.
struct Override {
  std::string key;
  std::string text;  ///< "--set key=value"
};

/// A segment of a key path: a map key or a list index.
struct Segment {
  std::string key;
  std::optional<std::size_t> index;
};

enum class IntText : std::uint8_t { kOk, kBad, kTooLarge };
/// Parses a plain integer scalar: decimal or 0x-hexadecimal, with an optional sign.
IntText parse_integer(const std::string& s, bool& negative, std::uint64_t& magnitude);

/// The value of `key` in a YAML map, or nullopt.
std::optional<YAML::Node> child(const YAML::Node& map, const std::string& key);
/// Splits "nodes[1].shuffle.size" into segments; throws ConfigError naming `text` (the --set).
std::vector<Segment> parse_key_path(const std::string& path, const std::string& text);
/// The keys of a pipeline's top level.
const std::vector<std::string>& top_level_keys();

/// Applies one "key.path=value" override to `root`; returns what it set (its key is the
/// canonical path, "nodes[0].shuffle.size"). A path may start with a node's name instead of
/// nodes[i].TYPE: its type, or a map's or filter's fn ("shuffle.size", "decode.dtype"), when
/// exactly one node of `nodes:` has it. Throws ConfigError naming the override
/// ("--set key=value: ...") when the path cannot be set: an ambiguous or unknown name, an
/// index out of range, a node's parameter without the node's type.
Override apply_override(YAML::Node& root, const std::string& spec);

}  // namespace flowstate::yaml_support
