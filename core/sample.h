// Sample: one example — named fields, each a Tensor (bytes are a uint8 tensor, a scalar is a
// rank-0 tensor). Field names are interned once into FieldIds, so samples compare ids, not
// strings.
//
//   Sample s;
//   s.set("tokens", Tensor(DType::kUInt16, Shape{512}));
//   const Tensor& t = s.at("tokens");
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "flowstate/core/ref.h"
#include "flowstate/core/tensor.h"
#include "flowstate/core/user_value.h"

namespace flowstate {

/// An interned field name.
using FieldId = std::uint32_t;
/// The id of `name`, interning it on first use. Thread-safe; ids are stable for the process.
FieldId field_id(std::string_view name);
/// The name of an interned id.
std::string_view field_name(FieldId id);

/// An ordered list of named tensors. Field order is insertion order.
class Fields {
 public:
  /// Sets (or replaces) field `name`.
  void set(FieldId id, Tensor t);
  void set(std::string_view name, Tensor t) { set(field_id(name), std::move(t)); }
  /// The field, or nullptr when absent.
  const Tensor* find(FieldId id) const;
  const Tensor* find(std::string_view name) const { return find(field_id(name)); }
  /// The field; throws std::out_of_range naming it when absent.
  const Tensor& at(std::string_view name) const;
  const Tensor& at(FieldId id) const;
  bool erase(std::string_view name);

  std::size_t size() const { return fields_.size(); }
  bool empty() const { return fields_.empty(); }
  auto begin() const { return fields_.begin(); }
  auto end() const { return fields_.end(); }
  auto begin() { return fields_.begin(); }
  auto end() { return fields_.end(); }
  void reserve(std::size_t n) { fields_.reserve(n); }

 private:
  std::vector<std::pair<FieldId, Tensor>> fields_;
};

/// One example and where it came from.
struct Sample : Fields {
  Ref ref;         ///< the record this sample was read from
  UserValue user;  ///< a user-typed value (from_range sources); empty for tensor samples
};

}  // namespace flowstate
