#include "flowstate/config/yaml_params.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <limits>

#include "flowstate/core/error.h"

namespace flowstate::yaml_support {

void YamlParams::add_override(Override o) { overrides_.push_back(std::move(o)); }

std::string YamlParams::location(const YAML::Mark& m) const {
  if (m.is_null()) return origin_;
  return origin_ + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

/// Where the value at `key` was written: its override, or its place in the file.
std::string YamlParams::where(const YAML::Node& n, const std::string& key) const {
  for (auto it = overrides_.rbegin(); it != overrides_.rend(); ++it) {
    const std::string& k = it->key;
    if (key == k || (key.size() > k.size() && key.compare(0, k.size(), k) == 0 &&
                     (key[k.size()] == '.' || key[k.size()] == '[')))
      return it->text;
  }
  if (!n.IsDefined()) return origin_;
  return location(n.Mark());
}

void YamlParams::fail(const YAML::Node& at, const std::string& key,
                      const std::string& message) const {
  throw ConfigError(key, where(at, key) + ": " + (key.empty() ? "" : key + ": ") + message);
}

std::uint64_t YamlParams::parse_uint(const YAML::Node& n, const ParamSchema& p,
                                     const std::string& key) const {
  bool negative = false;
  std::uint64_t v = 0;
  IntText r = is_plain_scalar(n) ? parse_integer(n.Scalar(), negative, v) : IntText::kBad;
  if (r == IntText::kBad) fail(n, key, "expected an unsigned integer, got " + describe_node(n));
  if (negative && (v != 0 || r == IntText::kTooLarge)) {
    ParamSchema bounds = p;
    if (!bounds.min) bounds.min = 0;
    fail(n, key, check_number(bounds, -1.0, n.Scalar()));
  }
  if (r == IntText::kTooLarge) {
    if (!p.max)
      fail(n, key, n.Scalar() + " is out of range (must be at most 18446744073709551615)");
    fail(n, key, check_number(p, 1e30, n.Scalar()));
  }
  return v;
}

std::int64_t YamlParams::parse_int(const YAML::Node& n, const std::string& key) const {
  bool negative = false;
  std::uint64_t v = 0;
  IntText r = is_plain_scalar(n) ? parse_integer(n.Scalar(), negative, v) : IntText::kBad;
  if (r == IntText::kBad) fail(n, key, "expected an integer, got " + describe_node(n));
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  if (r == IntText::kTooLarge || (negative ? v > kMax + 1 : v > kMax))
    fail(n, key, n.Scalar() + " is out of range for a 64-bit integer");
  return negative ? static_cast<std::int64_t>(~v + 1) : static_cast<std::int64_t>(v);
}

double YamlParams::parse_float(const YAML::Node& n, const std::string& key) const {
  double v = 0;
  bool ok = false;
  if (is_plain_scalar(n)) {
    const std::string& s = n.Scalar();
    const char* b = s.data() + (!s.empty() && s[0] == '+' ? 1 : 0);
    auto [p, ec] = std::from_chars(b, s.data() + s.size(), v);
    ok = ec == std::errc() && p == s.data() + s.size() && std::isfinite(v);
  }
  if (!ok) fail(n, key, "expected a finite number, got " + describe_node(n));
  return v;
}

ParamValue YamlParams::parse_value(const YAML::Node& n, const ParamSchema& p,
                                   const std::string& key) const {
  ParamValue v;
  switch (p.type) {
    case ParamType::kBool: {
      static const std::set<std::string> kTrue{"true", "True", "TRUE"};
      static const std::set<std::string> kFalse{"false", "False", "FALSE"};
      if (is_plain_scalar(n) && kTrue.count(n.Scalar()))
        v = true;
      else if (is_plain_scalar(n) && kFalse.count(n.Scalar()))
        v = false;
      else
        fail(n, key, "expected a boolean (true or false), got " + describe_node(n));
      break;
    }
    case ParamType::kUInt:
      if (p.auto_value && is_plain_scalar(n) && n.Scalar() == "auto") return std::uint64_t{kAuto};
      if (p.inline_value && is_plain_scalar(n) && n.Scalar() == "inline")
        return std::uint64_t{kInline};
      v = parse_uint(n, p, key);
      if (p.auto_value && std::get<std::uint64_t>(v) == kAuto) {
        ParamSchema bounds = p;
        bounds.auto_value = false;
        fail(n, key,
             check_number(bounds, 0.0, n.Scalar()) +
                 (p.inline_value ? ", auto or inline" : " or auto"));
      }
      break;
    case ParamType::kInt:
      v = parse_int(n, key);
      break;
    case ParamType::kFloat:
      v = parse_float(n, key);
      break;
    case ParamType::kString:
      if (!n.IsScalar()) fail(n, key, "expected a string, got " + describe_node(n));
      v = n.Scalar();
      break;
    case ParamType::kStringList: {
      std::vector<std::string> list;
      if (n.IsScalar()) {
        list.push_back(n.Scalar());
      } else if (n.IsSequence()) {
        for (std::size_t i = 0; i < n.size(); ++i) {
          if (!n[i].IsScalar())
            fail(n[i], key + "[" + std::to_string(i) + "]",
                 "expected a string, got " + describe_node(n[i]));
          list.push_back(n[i].Scalar());
        }
      } else {
        fail(n, key, "expected a string or a list of strings, got " + describe_node(n));
      }
      v = std::move(list);
      break;
    }
    case ParamType::kMap:  // read by parse_group, never as one value
      fail(n, key, "expected " + std::string(param_type_name(p.type)));
    case ParamType::kIntList: {
      std::vector<std::int64_t> list;
      if (n.IsScalar()) {
        list.push_back(parse_int(n, key));
      } else if (n.IsSequence()) {
        for (std::size_t i = 0; i < n.size(); ++i)
          list.push_back(parse_int(n[i], key + "[" + std::to_string(i) + "]"));
      } else {
        fail(n, key, "expected an integer or a list of integers, got " + describe_node(n));
      }
      v = std::move(list);
      break;
    }
  }
  std::string problem = check_param(p, v);
  if (!problem.empty()) fail(n, key, problem);
  return v;
}

/// Validates the parameter map `map` (null: none given) of the thing at `key` against
/// `schemas`, filling in defaults. `at` locates the thing itself; `ignore` lists keys
/// handled by the caller; `what` names it in the unknown-key message.
Params YamlParams::parse_params(const YAML::Node& map, const YAML::Node& at, const std::string& key,
                                const std::vector<const std::vector<ParamSchema>*>& schemas,
                                const std::string& what,
                                const std::set<std::string>& ignore) const {
  auto join_key = [&](const std::string& name) { return key.empty() ? name : key + "." + name; };
  std::vector<std::pair<std::string, std::string>> wheres{{"", where(at, key)}};
  std::vector<std::pair<std::string, ParamValue>> given;  // document order
  if (map.IsDefined() && !map.IsNull()) {
    if (!map.IsMap()) fail(map, key, "parameters must be a map, got " + describe_node(map));
    std::set<std::string> seen;
    for (auto it = map.begin(); it != map.end(); ++it) {
      const YAML::Node k(it->first);
      if (!k.IsScalar()) fail(k, key, "keys must be strings, got " + describe_node(k));
      const std::string name = k.Scalar();
      const std::string pkey = join_key(name);
      if (!seen.insert(name).second) fail(k, pkey, "duplicate key '" + name + "'");
      if (ignore.count(name)) continue;
      const ParamSchema* schema = find_param(schemas, name);
      if (schema == nullptr) {
        std::vector<std::string> known(ignore.begin(), ignore.end());
        for (const auto* list : schemas)
          for (const auto& p : *list) known.push_back(p.name);
        fail(k, pkey,
             "unknown parameter '" + name + "' of " + what + " (known: " + join(known) + ")" +
                 suggestion(name, known));
      }
      const YAML::Node value(it->second);
      // yaml-cpp marks an empty (null) value at the next token: point at its key instead.
      wheres.emplace_back(name, where(value.IsNull() ? k : value, pkey));
      if (schema->type == ParamType::kMap) {
        parse_group(value, *schema, name, pkey, what + "'s " + name, given, wheres);
        continue;
      }
      given.emplace_back(name, parse_value(value, *schema, pkey));
    }
  }
  std::vector<std::pair<std::string, ParamValue>> values;  // schema order
  // A group's sub-parameters are "group.key" entries (the group itself has no value).
  const YAML::Node& there = map.IsDefined() && !map.IsNull() ? map : at;
  std::function<void(const ParamSchema&, const std::string&)> add = [&](const ParamSchema& p,
                                                                        const std::string& name) {
    if (p.type == ParamType::kMap) {
      for (const auto& sub : p.fields) add(sub, name + "." + sub.name);
      return;
    }
    auto g =
        std::find_if(given.begin(), given.end(), [&](const auto& e) { return e.first == name; });
    if (g != given.end()) {
      values.emplace_back(name, std::move(g->second));
    } else if (p.required) {
      fail(there, join_key(name), "missing required parameter '" + p.name + "'");
    } else if (p.default_value) {
      values.emplace_back(name, *p.default_value);
    }
  };
  for (const auto* list : schemas)
    for (const auto& p : *list) add(p, p.name);
  return Params(key, std::move(values), std::move(wheres));
}

void YamlParams::parse_group(const YAML::Node& map, const ParamSchema& group,
                             const std::string& name, const std::string& key,
                             const std::string& what,
                             std::vector<std::pair<std::string, ParamValue>>& given,
                             std::vector<std::pair<std::string, std::string>>& wheres) const {
  if (!map.IsDefined() || map.IsNull()) return;  // `cache:` alone: nothing set
  std::vector<std::string> known;
  for (const auto& p : group.fields) known.push_back(p.name);
  if (!map.IsMap())
    fail(map, key, "expected a map of " + join(known) + ", got " + describe_node(map));
  std::set<std::string> seen;
  for (auto it = map.begin(); it != map.end(); ++it) {
    const YAML::Node k(it->first);
    if (!k.IsScalar()) fail(k, key, "keys must be strings, got " + describe_node(k));
    const std::string sub = k.Scalar();
    const std::string skey = key + "." + sub;
    if (!seen.insert(sub).second) fail(k, skey, "duplicate key '" + sub + "'");
    auto schema = std::find_if(group.fields.begin(), group.fields.end(),
                               [&](const ParamSchema& p) { return p.name == sub; });
    if (schema == group.fields.end())
      fail(k, skey,
           "unknown parameter '" + sub + "' of " + what + " (known: " + join(known) + ")" +
               suggestion(sub, known));
    const YAML::Node value(it->second);
    wheres.emplace_back(name + "." + sub, where(value.IsNull() ? k : value, skey));
    if (schema->type == ParamType::kMap) {
      parse_group(value, *schema, name + "." + sub, skey, what + "'s " + sub, given, wheres);
      continue;
    }
    given.emplace_back(name + "." + sub, parse_value(value, *schema, skey));
  }
}

const ParamSchema* YamlParams::find_param(
    const std::vector<const std::vector<ParamSchema>*>& schemas, const std::string& name) {
  for (const auto* list : schemas)
    for (const auto& p : *list)
      if (p.name == name) return &p;
  return nullptr;
}

}  // namespace flowstate::yaml_support
