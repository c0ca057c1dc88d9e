// A node's options table: every option of a node is declared once, as a param() row of its
// options struct with its key, default (the struct's own member initializer), bounds, doc and
// whether it is free (may change between save and restore). Everything else derives from the table:
// the YAML schema and `flowstate schema` text (schema_of), YAML parameters to options
// (options_from), the checks that both the C++ builder and YAML run (validate_fields), and the
// canonical description that feeds the fingerprint (describe_fields).
//
//   struct TakeOptions {
//     std::uint64_t count = 0;
//     static constexpr auto table() {
//       return std::tuple{param("count", &TakeOptions::count,
//                               {.min = 1, .required = true,
//                                .doc = "samples kept at the start of each epoch"})};
//     }
//   };
//
// Types: bool, unsigned and signed integers, double, std::string, std::vector<std::string>,
// std::vector<std::int64_t>, enums with EnumNames, and std::optional of any of these (unset:
// absent from YAML, the description and the checks). A member whose type has a table of its own
// is a group (a map-valued option, ParamType::kMap): YAML writes `cache: {dir: d, limit: 1GiB}`,
// each sub-key checked by the group's rows (an unknown one is an error naming it), and
// Params, the checks, values_of and the description name them "cache.dir" — declared once in
// the group's struct and included by any number of tables (nodes/sources/remote_options.h). An
// options struct may add a `void validate() const` for rules across options (throwing ConfigError
// with the field's key), and members that are not in the table (a C++ callable, the YAML file's
// directory).
#pragma once

#include <any>
#include <array>
#include <concepts>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "flowstate/core/dtype.h"
#include "flowstate/core/error.h"
#include "flowstate/nodes/description.h"
#include "flowstate/nodes/params.h"

namespace flowstate {

/// Names of an enum's values, for an option with choices. Specialize with a `values` array of
/// (value, name) pairs.
template <class E>
struct EnumNames;

template <class E>
concept NamedEnum = std::is_enum_v<E> && requires {
  EnumNames<E>::values;
};

/// Element types as options (a transform's `dtype`), by their names.
template <>
struct EnumNames<DType> {
  static constexpr const auto& values = kDTypeNames;
};

/// The name of `e` ("global").
template <NamedEnum E>
std::string_view enum_name(E e) {
  for (const auto& [v, n] : EnumNames<E>::values)
    if (v == e) return n;
  return "?";
}

/// The value named `name`, or nullopt.
template <NamedEnum E>
std::optional<E> enum_value(std::string_view name) {
  for (const auto& [v, n] : EnumNames<E>::values)
    if (name == n) return v;
  return std::nullopt;
}

/// The names of every value of `E`, in declaration order.
template <NamedEnum E>
std::vector<std::string> enum_names() {
  std::vector<std::string> out;
  for (const auto& [v, n] : EnumNames<E>::values) out.emplace_back(n);
  return out;
}

/// The value named `name`; throws ConfigError (on `key`) "unknown WHAT 'x' (known: a, b)".
template <NamedEnum E>
E parse_enum(std::string_view name, const std::string& key, const std::string& what) {
  if (auto v = enum_value<E>(name)) return *v;
  std::string known;
  for (const auto& n : enum_names<E>()) known += (known.empty() ? "" : ", ") + n;
  throw ConfigError(key, "unknown " + what + " '" + std::string(name) + "' (known: " + known + ")");
}

/// How one option is declared: bounds, doc and flags. `O` is the options struct.
template <class O>
struct FieldSpec {
  std::optional<double> min;  ///< inclusive lower bound of a number (of each list element)
  std::optional<double> max;  ///< inclusive upper bound
  bool required = false;      ///< YAML must give it; the struct's default is not valid
  bool free = false;          ///< never changes the output: not in the fingerprint
  /// A data parameter (DescribedParam::data): may change on a resume that opts into data
  /// changes; the node's restore_changed says how its state carries over.
  bool data = false;
  bool auto_value = false;       ///< also accepts `auto` (kAuto; ParamSchema::auto_value)
  const char* doc = "";          ///< one line
  const char* default_doc = "";  ///< what an unset optional (or empty list) means
  /// Extra check of a value: returns the problem ("must not be empty") or "".
  std::string (*check)(const ParamValue&) = nullptr;
  /// Described (and so fingerprinted) only when this returns true.
  bool (*describe_if)(const O&) = nullptr;
  /// The canonical text when it is not the value's own (e.g. a resolved default).
  std::string (*text)(const O&) = nullptr;
};

/// One row of an options table: the YAML key, the member, and its spec.
template <class O, class T>
struct Field {
  const char* key;
  T O::*member;
  FieldSpec<O> spec;
};

/// Declares an option (see the file comment).
template <class O, class T>
constexpr Field<O, T> param(const char* key, T O::*member, FieldSpec<O> spec = {}) {
  return {key, member, spec};
}

/// An options struct with a table.
template <class O>
concept OptionsTable = requires {
  O::table();
};

template <OptionsTable O>
std::vector<ParamSchema> schema_of();

namespace detail {

template <class T>
struct IsOptional : std::false_type {};
template <class U>
struct IsOptional<std::optional<U>> : std::true_type {};

template <class T>
struct Unwrap {
  using type = T;
};
template <class U>
struct Unwrap<std::optional<U>> {
  using type = U;
};

template <class T>
constexpr ParamType param_type_of(bool non_negative) {
  if constexpr (std::is_same_v<T, bool>) {
    return ParamType::kBool;
  } else if constexpr (std::is_enum_v<T>) {
    return ParamType::kString;
  } else if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T>) {
    return ParamType::kUInt;
  } else if constexpr (std::is_integral_v<T>) {
    return non_negative ? ParamType::kUInt : ParamType::kInt;
  } else if constexpr (std::is_floating_point_v<T>) {
    return ParamType::kFloat;
  } else if constexpr (std::is_same_v<T, std::string>) {
    return ParamType::kString;
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    return ParamType::kStringList;
  } else {
    static_assert(std::is_same_v<T, std::vector<std::int64_t>>, "unsupported option type");
    return ParamType::kIntList;
  }
}

/// A member's value as a ParamValue of the field's ParamType.
template <class T>
ParamValue to_param(const T& v, ParamType type) {
  if constexpr (std::is_same_v<T, bool>) {
    return v;
  } else if constexpr (std::is_enum_v<T>) {
    return std::string(enum_name(v));
  } else if constexpr (std::is_integral_v<T>) {
    if (type == ParamType::kUInt) return static_cast<std::uint64_t>(v);
    return static_cast<std::int64_t>(v);
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<double>(v);
  } else {
    return v;
  }
}

/// The member value a validated ParamValue stands for.
template <class T>
T from_param(const ParamValue& p) {
  if constexpr (std::is_same_v<T, bool>) {
    return std::get<bool>(p);
  } else if constexpr (std::is_enum_v<T>) {
    return *enum_value<T>(std::get<std::string>(p));
  } else if constexpr (std::is_integral_v<T>) {
    if (const auto* u = std::get_if<std::uint64_t>(&p)) return static_cast<T>(*u);
    return static_cast<T>(std::get<std::int64_t>(p));
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(std::get<double>(p));
  } else {
    return std::get<T>(p);
  }
}

/// The canonical text of a member value in a description.
template <class T>
std::string canonical_text(const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_enum_v<T>) {
    return std::string(enum_name(v));
  } else if constexpr (std::is_integral_v<T>) {
    return std::to_string(v);
  } else if constexpr (std::is_floating_point_v<T>) {
    return format_double(v);
  } else if constexpr (std::is_same_v<T, std::string>) {
    return v;
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    return join_list(v);
  } else {
    return format_param(ParamValue(v));
  }
}

template <class O, class T>
ParamSchema schema_row(const Field<O, T>& f) {
  ParamSchema p;
  if constexpr (OptionsTable<T>) {  // a group: its rows are the map's keys
    p.name = f.key;
    p.type = ParamType::kMap;
    p.doc = f.spec.doc;
    p.free = f.spec.free;
    p.data = f.spec.data;
    p.default_doc = f.spec.default_doc;
    p.fields = schema_of<T>();
    for (auto& sub : p.fields) {
      sub.free = sub.free || p.free;
      sub.data = sub.data || p.data;
    }
    return p;
  } else {
    using V = typename Unwrap<T>::type;
    p.name = f.key;
    p.type = param_type_of<V>(f.spec.min && *f.spec.min >= 0);
    p.doc = f.spec.doc;
    p.required = f.spec.required;
    p.min = f.spec.min;
    p.max = f.spec.max;
    p.free = f.spec.free;
    p.data = f.spec.data;
    p.auto_value = f.spec.auto_value;
    p.default_doc = f.spec.default_doc;
    if (f.spec.check != nullptr) p.check = f.spec.check;
    if constexpr (std::is_enum_v<V>) p.choices = enum_names<V>();
    if constexpr (!IsOptional<T>::value) {
      const O defaults{};
      const T& d = defaults.*(f.member);
      bool empty_list = false;
      if constexpr (std::is_same_v<T, std::vector<std::string>> ||
                    std::is_same_v<T, std::vector<std::int64_t>>)
        empty_list = d.empty();
      if (!f.spec.required && !empty_list) p.default_value = to_param(d, p.type);
    }
    return p;
  }
}

/// Sets the members of `o` that `p` holds under `prefix` + key ("cache." for a group).
template <OptionsTable O>
void fill_options(O& o, const Params& p, const std::string& prefix) {
  std::apply(
      [&](const auto&... f) {
        (
            [&] {
              using T = std::remove_cvref_t<decltype(o.*(f.member))>;
              if constexpr (OptionsTable<T>) {
                fill_options(o.*(f.member), p, prefix + f.key + ".");
              } else if (const ParamValue* v = p.find(prefix + f.key)) {
                o.*(f.member) = from_param<typename Unwrap<T>::type>(*v);
              }
            }(),
            ...);
      },
      O::table());
}

}  // namespace detail

/// The parameter schema of an options table, in table order; defaults come from `O{}`.
template <OptionsTable O>
std::vector<ParamSchema> schema_of() {
  std::vector<ParamSchema> out;
  std::apply([&](const auto&... f) { (out.push_back(detail::schema_row(f)), ...); }, O::table());
  return out;
}

/// The options that validated parameters `p` stand for: every field `p` holds is set, the
/// others keep their defaults. A member `base_dir`, when the struct has one, gets `base_dir`
/// (relative file paths resolve against it).
template <OptionsTable O>
O options_from(const Params& p, const std::filesystem::path& base_dir = {}) {
  O o{};
  detail::fill_options(o, p, "");
  if constexpr (requires { o.base_dir = base_dir; }) o.base_dir = base_dir;
  return o;
}

/// Checks every field of `o` against its table row, then `o.validate()` when the struct has
/// one. Throws ConfigError keyed "<node>.<key>": a value out of its bounds says
/// "<node>.<key>: 0 is out of range (must be at least 1)", a failed check
/// "<node>.<key> must ..."; validate()'s own errors are re-keyed under the node and keep
/// their message.
template <OptionsTable O>
void validate_fields(const O& o, const std::string& node) {
  std::apply(
      [&](const auto&... f) {
        (
            [&] {
              using T = std::remove_cvref_t<decltype(o.*(f.member))>;
              if constexpr (OptionsTable<T>) {
                validate_fields(o.*(f.member), node + "." + f.key);  // "records.cache.limit"
                return;
              } else {
                const ParamSchema row = detail::schema_row(f);
                auto check = [&](const auto& value) {
                  const std::string problem = check_param(row, detail::to_param(value, row.type));
                  if (problem.empty()) return;
                  // "lines.paths must name ..." reads as a sentence; "batch.size: 0 is out of
                  // range (...)" names the value.
                  const std::string key = node + "." + row.name;
                  throw ConfigError(key,
                                    key + (problem.rfind("must", 0) == 0 ? " " : ": ") + problem);
                };
                if constexpr (detail::IsOptional<T>::value) {
                  if (o.*(f.member)) check(*(o.*(f.member)));
                } else {
                  check(o.*(f.member));
                }
              }
            }(),
            ...);
      },
      O::table());
  if constexpr (requires { o.validate(); }) {
    try {
      o.validate();
    } catch (const ConfigError& e) {
      const std::string& k = e.key();
      if (k.rfind(node + ".", 0) == 0 || k == node) throw;
      throw ConfigError(k.empty() ? node : node + "." + k, e.what());
    }
  }
}

/// Every option of `o` by key, in table order, as the ParamValue YAML would give (nullopt for
/// an unset optional). A group is its key with nullopt, then its options as "group.key".
template <OptionsTable O>
std::vector<std::pair<std::string, std::optional<ParamValue>>> values_of(const O& o) {
  std::vector<std::pair<std::string, std::optional<ParamValue>>> out;
  std::apply(
      [&](const auto&... f) {
        (
            [&] {
              using T = std::remove_cvref_t<decltype(o.*(f.member))>;
              const ParamType type = detail::schema_row(f).type;
              if constexpr (OptionsTable<T>) {
                out.emplace_back(f.key, std::nullopt);
                for (auto& [k, v] : values_of(o.*(f.member)))
                  out.emplace_back(std::string(f.key) + "." + k, std::move(v));
              } else if constexpr (detail::IsOptional<T>::value) {
                out.emplace_back(f.key, o.*(f.member) ? std::optional<ParamValue>(detail::to_param(
                                                            *(o.*(f.member)), type))
                                                      : std::nullopt);
              } else {
                out.emplace_back(f.key, detail::to_param(o.*(f.member), type));
              }
            }(),
            ...);
      },
      O::table());
  return out;
}

/// The canonical parameters of `o`, in table order (see FieldSpec::describe_if and text). A
/// group's described options are "group.key" (free or data when the group's row is).
template <OptionsTable O>
std::vector<DescribedParam> describe_fields(const O& o) {
  std::vector<DescribedParam> out;
  std::apply(
      [&](const auto&... f) {
        (
            [&] {
              using T = std::remove_cvref_t<decltype(o.*(f.member))>;
              if (f.spec.describe_if != nullptr && !f.spec.describe_if(o)) return;
              if constexpr (OptionsTable<T>) {
                for (auto& d : describe_fields(o.*(f.member)))
                  out.push_back({std::string(f.key) + "." + d.key, std::move(d.value),
                                 d.free || f.spec.free, d.data || f.spec.data});
              } else if (f.spec.text != nullptr) {
                out.push_back({f.key, f.spec.text(o), f.spec.free, f.spec.data});
              } else if constexpr (detail::IsOptional<T>::value) {
                if (o.*(f.member))
                  out.push_back(
                      {f.key, detail::canonical_text(*(o.*(f.member))), f.spec.free, f.spec.data});
              } else {
                out.push_back(
                    {f.key, detail::canonical_text(o.*(f.member)), f.spec.free, f.spec.data});
              }
            }(),
            ...);
      },
      O::table());
  return out;
}

}  // namespace flowstate
