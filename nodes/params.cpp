#include "flowstate/nodes/params.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace flowstate {

std::string_view param_type_name(ParamType t) {
  switch (t) {
    case ParamType::kBool:
      return "a boolean (true or false)";
    case ParamType::kUInt:
      return "an unsigned integer";
    case ParamType::kInt:
      return "an integer";
    case ParamType::kFloat:
      return "a number";
    case ParamType::kString:
      return "a string";
    case ParamType::kStringList:
      return "a string or a list of strings";
    case ParamType::kIntList:
      return "an integer or a list of integers";
    case ParamType::kMap:
      return "a map";
  }
  return "a value";
}

namespace {

std::string format_bound(double v) {
  if (std::abs(v) < 9e15 && v == std::floor(v)) return std::to_string(static_cast<long long>(v));
  return format_double(v);
}

std::string join(const std::vector<std::string>& items, std::string_view sep = ", ") {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : std::string(sep)) + s;
  return out;
}

}  // namespace

// Numbers compared with double bounds: exact for every bound a schema declares.
std::string check_number(const ParamSchema& p, double v, const std::string& text) {
  if (p.min && v < *p.min) {
    if (p.max)
      return text + " is out of range (must be between " + format_bound(*p.min) + " and " +
             format_bound(*p.max) + ")";
    return text + " is out of range (must be at least " + format_bound(*p.min) + ")";
  }
  if (p.max && v > *p.max) {
    if (p.min)
      return text + " is out of range (must be between " + format_bound(*p.min) + " and " +
             format_bound(*p.max) + ")";
    return text + " is out of range (must be at most " + format_bound(*p.max) + ")";
  }
  return "";
}

std::string format_param(const ParamValue& value) {
  struct Visitor {
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(std::uint64_t v) const { return std::to_string(v); }
    std::string operator()(std::int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const { return format_double(v); }
    std::string operator()(const std::string& s) const { return s; }
    std::string operator()(const std::vector<std::string>& v) const { return "[" + join(v) + "]"; }
    std::string operator()(const std::vector<std::int64_t>& v) const {
      std::string s = "[";
      for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
      return s + "]";
    }
  };
  return std::visit(Visitor{}, value);
}

std::string check_param(const ParamSchema& p, const ParamValue& value) {
  std::string problem;
  if (const auto* u = std::get_if<std::uint64_t>(&value); u && p.auto_value && *u == kAuto) {
    // `auto`: the runtime picks the value.
  } else if (const auto* w = std::get_if<std::uint64_t>(&value);
             w && p.inline_value && *w == kInline) {
    // `inline`: on the consumer's thread.
  } else if (const auto* u = std::get_if<std::uint64_t>(&value)) {
    problem = check_number(p, static_cast<double>(*u), std::to_string(*u));
  } else if (const auto* i = std::get_if<std::int64_t>(&value)) {
    problem = check_number(p, static_cast<double>(*i), std::to_string(*i));
  } else if (const auto* d = std::get_if<double>(&value)) {
    problem = check_number(p, *d, format_double(*d));
  } else if (const auto* s = std::get_if<std::string>(&value)) {
    if (!p.choices.empty() && std::find(p.choices.begin(), p.choices.end(), *s) == p.choices.end())
      problem = "'" + *s + "' is not one of: " + join(p.choices);
  } else if (const auto* l = std::get_if<std::vector<std::int64_t>>(&value)) {
    for (auto x : *l) {
      problem = check_number(p, static_cast<double>(x), std::to_string(x));
      if (!problem.empty()) break;
    }
  }
  if (problem.empty() && p.check) problem = p.check(value);
  return problem;
}

// ---- Params ----

Params::Params(std::string key, std::vector<std::pair<std::string, ParamValue>> values,
               std::vector<std::pair<std::string, std::string>> where)
    : key_(std::move(key)), values_(std::move(values)), where_(std::move(where)) {}

const ParamValue* Params::find(std::string_view name) const {
  for (const auto& [n, v] : values_)
    if (n == name) return &v;
  return nullptr;
}

bool Params::given(std::string_view name) const {
  for (const auto& [n, w] : where_)
    if (n == name) return true;
  return false;
}

template <class T>
const T& Params::get(std::string_view name) const {
  const ParamValue* v = find(name);
  if (v == nullptr)
    throw std::logic_error("parameter '" + std::string(name) + "' of '" + key_ + "' is not set");
  const T* t = std::get_if<T>(v);
  if (t == nullptr)
    throw std::logic_error("parameter '" + std::string(name) + "' of '" + key_ +
                           "' has another type than the node reads");
  return *t;
}

template const bool& Params::get<bool>(std::string_view) const;
template const std::uint64_t& Params::get<std::uint64_t>(std::string_view) const;
template const std::int64_t& Params::get<std::int64_t>(std::string_view) const;
template const double& Params::get<double>(std::string_view) const;
template const std::string& Params::get<std::string>(std::string_view) const;
template const std::vector<std::string>& Params::get<std::vector<std::string>>(
    std::string_view) const;
template const std::vector<std::int64_t>& Params::get<std::vector<std::int64_t>>(
    std::string_view) const;

std::optional<std::uint64_t> Params::optional_uint(std::string_view name) const {
  if (!has(name)) return std::nullopt;
  return uint(name);
}

std::string Params::key(std::string_view param) const {
  if (param.empty()) return key_;
  return key_.empty() ? std::string(param) : key_ + "." + std::string(param);
}

std::string Params::where(std::string_view param) const {
  for (const auto& [n, w] : where_)
    if (n == param) return w;
  for (const auto& [n, w] : where_)
    if (n.empty()) return w;
  return "";
}

std::vector<DescribedParam> Params::describe(const std::vector<ParamSchema>& schema) const {
  std::vector<DescribedParam> out;
  for (const auto& p : schema) {
    if (const ParamValue* v = find(p.name)) out.push_back({p.name, format_param(*v), p.free});
  }
  return out;
}

std::string describe_params(const std::vector<ParamSchema>& params, std::string_view indent) {
  std::string out;
  for (const auto& p : params) {
    std::string line = std::string(indent) + p.name + " (" + std::string(param_type_name(p.type));
    if (p.required) {
      line += ", required";
    } else if (p.default_value) {
      line += ", default " + format_param(*p.default_value);
    } else if (!p.default_doc.empty()) {
      line += ", default: " + p.default_doc;
    } else {
      line += ", optional";
    }
    if (p.min && p.max)
      line += ", " + format_bound(*p.min) + ".." + format_bound(*p.max);
    else if (p.min)
      line += ", >= " + format_bound(*p.min);
    else if (p.max)
      line += ", <= " + format_bound(*p.max);
    if (!p.choices.empty()) line += ", one of: " + join(p.choices);
    if (p.auto_value) line += ", or auto";
    if (p.inline_value) line += ", or inline";
    if (p.free) line += ", free";
    if (p.data) line += ", data";
    line += "): " + p.doc + "\n";
    out += line;
    if (p.type == ParamType::kMap) {
      std::vector<ParamSchema> fields = p.fields;
      for (auto& f : fields) f.name = p.name + "." + f.name;
      out += describe_params(fields, std::string(indent) + "  ");
    }
  }
  return out;
}

ConfigError param_error(const Params& p, std::string_view param, const std::string& message) {
  std::string key = p.key(param);
  std::string where = p.where(param);
  return ConfigError(key, (where.empty() ? "" : where + ": ") + key + ": " + message);
}

DataError param_data_error(const Params& p, std::string_view param, const std::string& message) {
  const std::string key = p.key(param);
  const std::string where = p.where(param);
  return DataError("", DataError::kNoOffset,
                   (where.empty() ? "" : where + ": ") + key + ": " + message);
}

}  // namespace flowstate
