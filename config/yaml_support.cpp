// Helpers of the YAML loader that need no loader state: messages about YAML values, the
// closest-name suggestion, document counting, integer text and --set overrides.
#include "flowstate/config/yaml_support.h"

#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <charconv>
#include <sstream>

#include "flowstate/core/error.h"

namespace flowstate::yaml_support {

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

/// Optimal string alignment distance: insertions, deletions, substitutions and transpositions
/// of neighbours each cost 1.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min(
          {d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

/// "; did you mean 'size'?" when one of `known` is close to `name` (one edit for short names,
/// two for longer ones), else "".
std::string suggestion(std::string_view name, const std::vector<std::string>& known) {
  if (name.size() > 64) return "";
  std::string best;
  std::size_t best_d = name.size() <= 4 ? 2 : 3;
  for (const auto& k : known) {
    std::size_t d = edit_distance(name, k);
    if (d < best_d) {
      best_d = d;
      best = k;
    }
  }
  return best.empty() ? "" : "; did you mean '" + best + "'?";
}

/// What a YAML node is, for "expected X, got Y" messages.
std::string describe_node(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Scalar:
      if (n.Tag() == "!") return "the quoted string \"" + n.Scalar() + "\"";
      return "'" + n.Scalar() + "'";
    case YAML::NodeType::Undefined:
      break;
  }
  return "nothing";
}

bool is_plain_scalar(const YAML::Node& n) { return n.IsScalar() && n.Tag() != "!"; }

/// Records where each document starts, building nothing.
class DocumentStarts : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> starts;
  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

/// The start marks of at most `limit` documents of `text`. Not YAML::LoadAll: yaml-cpp 0.7's
/// loops forever on some malformed input ("?{\n#\n,"), where its parser keeps reporting a
/// document without consuming anything (fixed upstream by jbeder/yaml-cpp#1319).
std::vector<YAML::Mark> document_starts(const std::string& text, std::size_t limit) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentStarts handler;
  while (handler.starts.size() < limit && parser.HandleNextDocument(handler)) {
  }
  return handler.starts;
}

/// Parses a plain integer scalar: decimal or 0x-hexadecimal, with an optional sign.
IntText parse_integer(const std::string& s, bool& negative, std::uint64_t& magnitude) {
  std::size_t i = 0;
  negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  int base = 10;
  if (s.size() - i > 2 && s[i] == '0' && (s[i + 1] == 'x' || s[i + 1] == 'X')) {
    base = 16;
    i += 2;
  }
  if (i >= s.size()) return IntText::kBad;
  auto [p, ec] = std::from_chars(s.data() + i, s.data() + s.size(), magnitude, base);
  if (p != s.data() + s.size()) return IntText::kBad;
  if (ec == std::errc::result_out_of_range) return IntText::kTooLarge;
  return ec == std::errc() ? IntText::kOk : IntText::kBad;
}

std::vector<Segment> parse_key_path(const std::string& path, const std::string& text) {
  std::vector<Segment> out;
  std::size_t i = 0;
  auto bad = [&](const std::string& why) -> ConfigError {
    return ConfigError(path, text + ": bad key path '" + path + "': " + why);
  };
  auto ident_char = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  };
  while (i < path.size()) {
    if (path[i] == '[') {
      if (out.empty()) throw bad("it starts with an index");
      std::size_t close = path.find(']', i);
      if (close == std::string::npos) throw bad("unclosed '['");
      std::string digits = path.substr(i + 1, close - i - 1);
      std::size_t idx = 0;
      auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), idx);
      if (digits.empty() || ec != std::errc() || p != digits.data() + digits.size())
        throw bad("'[" + digits + "]' is not a list index");
      out.push_back({"", idx});
      i = close + 1;
    } else {
      if (!out.empty()) {
        if (path[i] != '.') throw bad("expected '.' or '[' at '" + path.substr(i) + "'");
        ++i;
      }
      std::size_t start = i;
      while (i < path.size() && ident_char(path[i])) ++i;
      if (i == start) throw bad("empty key");
      out.push_back({path.substr(start, i - start), std::nullopt});
    }
  }
  if (out.empty()) throw bad("empty key");
  return out;
}

std::optional<YAML::Node> child(const YAML::Node& map, const std::string& key) {
  for (auto it = map.begin(); it != map.end(); ++it)
    if (it->first.IsScalar() && it->first.Scalar() == key) return YAML::Node(it->second);
  return std::nullopt;
}

const std::vector<std::string>& top_level_keys() {
  static const std::vector<std::string> keys{"seed",    "source",     "nodes",  "epochs",
                                             "workers", "checkpoint", "plugins"};
  return keys;
}

namespace {

/// The type of a `nodes:` entry ("- shuffle: {...}" or "- shuffle"), "" when it has none.
std::string entry_type(const YAML::Node& entry) {
  if (entry.IsScalar()) return entry.Scalar();
  if (entry.IsMap() && entry.size() == 1 && entry.begin()->first.IsScalar())
    return entry.begin()->first.Scalar();
  return "";
}

/// The names --set may address an entry by: its type, and a map's or filter's fn.
std::vector<std::string> entry_names(const YAML::Node& entry) {
  std::vector<std::string> names;
  const std::string type = entry_type(entry);
  if (type.empty()) return names;
  names.push_back(type);
  if (entry.IsMap() && (type == "map" || type == "filter")) {
    const YAML::Node params(entry.begin()->second);
    if (params.IsMap())
      if (std::optional<YAML::Node> fn = child(params, "fn"); fn && fn->IsScalar())
        if (fn->Scalar() != type) names.push_back(fn->Scalar());
  }
  return names;
}

/// Replaces a leading node name in `segs` with nodes[i].TYPE; returns the canonical path.
std::string resolve_node_name(const YAML::Node& root, std::vector<Segment>& segs,
                              const std::string& path, const std::string& text) {
  const std::vector<std::string>& top = top_level_keys();
  if (segs[0].index || std::find(top.begin(), top.end(), segs[0].key) != top.end()) return path;
  const std::string& name = segs[0].key;
  std::optional<YAML::Node> nodes = child(root, "nodes");
  std::vector<std::size_t> found;
  std::vector<std::string> known;
  if (nodes && nodes->IsSequence()) {
    for (std::size_t i = 0; i < nodes->size(); ++i) {
      const std::vector<std::string> names = entry_names((*nodes)[i]);
      if (std::find(names.begin(), names.end(), name) != names.end()) found.push_back(i);
      for (const auto& n : names)
        if (std::find(known.begin(), known.end(), n) == known.end()) known.push_back(n);
    }
  }
  auto entry = [&](std::size_t i) { return "nodes[" + std::to_string(i) + "]"; };
  if (found.empty()) {
    std::vector<std::string> all = top;
    all.insert(all.end(), known.begin(), known.end());
    throw ConfigError(path, text + ": unknown top-level key or node name '" + name +
                                "' (top-level keys: " + join(top) +
                                (known.empty() ? "" : "; nodes: " + join(known)) + ")" +
                                suggestion(name, all));
  }
  if (found.size() > 1) {
    std::vector<std::string> candidates;
    for (std::size_t i : found) candidates.push_back(entry(i) + "." + entry_type((*nodes)[i]));
    throw ConfigError(path, text + ": '" + name + "' names " + std::to_string(found.size()) +
                                " nodes: " + join(candidates) + "; address one by its index");
  }
  const std::size_t i = found[0];
  const std::string type = entry_type((*nodes)[i]);
  std::vector<Segment> resolved{{"nodes", std::nullopt}, {"", i}, {type, std::nullopt}};
  resolved.insert(resolved.end(), segs.begin() + 1, segs.end());
  segs = std::move(resolved);
  std::string out = entry(i) + "." + type;
  for (std::size_t k = 3; k < segs.size(); ++k)
    out += segs[k].index ? "[" + std::to_string(*segs[k].index) + "]" : "." + segs[k].key;
  return out;
}

}  // namespace

Override apply_override(YAML::Node& root, const std::string& spec) {
  const std::string text = "--set " + spec;
  std::size_t eq = spec.find('=');
  if (eq == std::string::npos)
    throw ConfigError("", text + ": expected key.path=value (e.g. --set seed=7)");
  std::vector<Segment> segs = parse_key_path(spec.substr(0, eq), text);
  if (!root.IsMap()) throw ConfigError(spec.substr(0, eq), text + ": the pipeline is not a map");
  const std::string path = resolve_node_name(root, segs, spec.substr(0, eq), text);
  YAML::Node value;
  try {
    value = YAML::Load(spec.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    throw ConfigError(path, text + ": the value is not valid YAML: " + e.msg);
  }
  YAML::Node cur(root);
  std::string at;
  for (std::size_t i = 0; i < segs.size(); ++i) {
    const Segment& s = segs[i];
    const bool last = i + 1 == segs.size();
    if (s.index) {
      if (!cur.IsSequence())
        throw ConfigError(path,
                          text + ": '" + at + "' is not a list (it is " + describe_node(cur) + ")");
      if (*s.index >= cur.size())
        throw ConfigError(path, text + ": '" + at + "' has " + std::to_string(cur.size()) +
                                    " entries; there is no " + at + "[" + std::to_string(*s.index) +
                                    "]");
      at += "[" + std::to_string(*s.index) + "]";
      if (last) {
        cur[*s.index] = value;
      } else {
        YAML::Node next = cur[*s.index];
        cur.reset(next);
      }
    } else {
      // An entry of nodes: is a one-key map TYPE -> parameters; a parameter given straight
      // after nodes[i] would add a second key.
      if (i == 2 && segs[0].key == "nodes" && segs[1].index) {
        const std::string type = entry_type(cur);
        if (!type.empty() && type != s.key) {
          std::string hint = suggestion(s.key, {type});  // a misspelt type
          if (hint.empty()) hint = "; did you mean " + at + "." + type + "." + s.key + "?";
          throw ConfigError(path, text + ": " + at + " is a '" + type +
                                      "' node, whose parameters are set as " + at + "." + type +
                                      ".KEY" + hint);
        }
      }
      if (cur.IsNull()) cur = YAML::Node(YAML::NodeType::Map);  // "checkpoint:" with no value
      if (cur.IsScalar() && cur.Scalar() == s.key) {
        // A bare node name ("- shard") given parameters: {shard: {...}}.
        YAML::Node expanded(YAML::NodeType::Map);
        expanded[s.key] = YAML::Node(YAML::NodeType::Map);
        cur = expanded;
      }
      if (!cur.IsMap())
        throw ConfigError(path,
                          text + ": '" + at + "' is not a map (it is " + describe_node(cur) + ")");
      at += (at.empty() ? "" : ".") + s.key;
      if (last) {
        cur[s.key] = value;
      } else {
        std::optional<YAML::Node> next = child(cur, s.key);
        if (!next) {
          if (segs[i + 1].index) throw ConfigError(path, text + ": '" + at + "' does not exist");
          cur[s.key] = YAML::Node(YAML::NodeType::Map);
          next = child(cur, s.key);
        }
        cur.reset(*next);
      }
    }
  }
  return {path, text};
}

}  // namespace flowstate::yaml_support
