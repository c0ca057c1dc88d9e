// UserValue: a value of any C++ type riding in a Sample or a Batch (DESIGN.md §9). A source
// built with from_range() puts each element here; typed maps and filters read and change it;
// a Collate<T> turns the batch's values into one collated value. Copies share the value.
//
//   Sample s;
//   s.user = UserValue::make(MyRecord{...});
//   const MyRecord& r = s.user.get<MyRecord>();
#pragma once

#include <cstdlib>
#include <memory>
#include <string>
#include <typeinfo>
#include <utility>

#if defined(__GNUG__)
#include <cxxabi.h>
#endif

#include "flowstate/core/error.h"

namespace flowstate {

/// The readable name of a type ("std::vector<int>"), for error messages. Thread-safe.
inline std::string type_name(const std::type_info& type) {
#if defined(__GNUG__)
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(
      abi::__cxa_demangle(type.name(), nullptr, nullptr, &status), std::free);
  if (status == 0 && name != nullptr) return name.get();
#endif
  return type.name();
}

/// A shared, type-checked value of any type. Empty by default.
class UserValue {
 public:
  UserValue() = default;
  /// Holds `value` (moved in).
  template <class T>
  static UserValue make(T value) {
    UserValue u;
    u.value_ = std::make_shared<T>(std::move(value));
    u.type_ = &typeid(T);
    return u;
  }
  bool has_value() const { return value_ != nullptr; }
  /// The held type; typeid(void) when empty.
  const std::type_info& type() const { return type_ != nullptr ? *type_ : typeid(void); }
  template <class T>
  bool holds() const {
    return type_ != nullptr && *type_ == typeid(T);
  }
  /// The value; throws Error "user value holds A, not B" (readable type names) when it holds
  /// another type, or "user value holds nothing, not B" when empty.
  template <class T>
  const T& get() const {
    check(typeid(T));
    return *static_cast<const T*>(value_.get());
  }
  /// Mutable access (maps change values in place). Same contract as get().
  template <class T>
  T& get() {
    check(typeid(T));
    return *static_cast<T*>(value_.get());
  }

 private:
  void check(const std::type_info& want) const {
    if (type_ == nullptr || *type_ != want)
      throw Error("user value holds " + (type_ != nullptr ? type_name(*type_) : "nothing") +
                  ", not " + type_name(want));
  }
  std::shared_ptr<void> value_;
  const std::type_info* type_ = nullptr;
};

}  // namespace flowstate
