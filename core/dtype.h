// Element types of tensors, with their sizes, names and DLPack codes.
//
// Values are never renumbered (a batch's hash includes them): new types go at the end.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include <dlpack/dlpack.h>

#include "flowstate/core/half.h"

namespace flowstate {

/// The element type of a Tensor.
enum class DType : std::uint8_t {
  kUInt8,
  kInt8,
  kUInt16,
  kInt16,
  kUInt32,
  kInt32,
  kUInt64,
  kInt64,
  kFloat32,
  kFloat64,
  kBool,
  kFloat16,   ///< IEEE binary16 (numpy float16, torch.float16); C++ element type Float16
  kBFloat16,  ///< bfloat16 (torch.bfloat16; numpy has none); C++ element type BFloat16
};

/// Every DType with its name, in declaration order: what dtype_name and parse_dtype read, and
/// an options table's choices (EnumNames<DType>, nodes/options.h).
inline constexpr std::array<std::pair<DType, const char*>, 13> kDTypeNames{{
    {DType::kUInt8, "uint8"},
    {DType::kInt8, "int8"},
    {DType::kUInt16, "uint16"},
    {DType::kInt16, "int16"},
    {DType::kUInt32, "uint32"},
    {DType::kInt32, "int32"},
    {DType::kUInt64, "uint64"},
    {DType::kInt64, "int64"},
    {DType::kFloat32, "float32"},
    {DType::kFloat64, "float64"},
    {DType::kBool, "bool"},
    {DType::kFloat16, "float16"},
    {DType::kBFloat16, "bfloat16"},
}};

/// Size of one element in bytes.
std::size_t dtype_size(DType t);
/// Lower-case name: "uint8", "float32", ...
std::string_view dtype_name(DType t);
/// Parses a name produced by dtype_name; throws ConfigError (with `key`) for anything else.
DType parse_dtype(std::string_view name, const std::string& key = "dtype");
/// The DLPack description of `t` (bfloat16 is kDLBfloat, 16 bits).
DLDataType to_dlpack(DType t);
/// Whether `t` is a floating-point type (float16, bfloat16, float32, float64).
bool dtype_is_float(DType t);
/// Whether `t` is an integer type (uint8 ... int64; bool is not).
bool dtype_is_integer(DType t);

/// The DType of a C++ arithmetic type.
template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<std::uint8_t>() {
  return DType::kUInt8;
}
template <>
constexpr DType dtype_of<std::int8_t>() {
  return DType::kInt8;
}
template <>
constexpr DType dtype_of<std::uint16_t>() {
  return DType::kUInt16;
}
template <>
constexpr DType dtype_of<std::int16_t>() {
  return DType::kInt16;
}
template <>
constexpr DType dtype_of<std::uint32_t>() {
  return DType::kUInt32;
}
template <>
constexpr DType dtype_of<std::int32_t>() {
  return DType::kInt32;
}
template <>
constexpr DType dtype_of<std::uint64_t>() {
  return DType::kUInt64;
}
template <>
constexpr DType dtype_of<std::int64_t>() {
  return DType::kInt64;
}
template <>
constexpr DType dtype_of<float>() {
  return DType::kFloat32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::kFloat64;
}
template <>
constexpr DType dtype_of<bool>() {
  return DType::kBool;
}
template <>
constexpr DType dtype_of<Float16>() {
  return DType::kFloat16;
}
template <>
constexpr DType dtype_of<BFloat16>() {
  return DType::kBFloat16;
}

/// Calls f.template operator()<T>() with the C++ type of `t` (Float16 and BFloat16 for the
/// 16-bit floats: they convert to float and from any arithmetic value, is_half_v tells them).
template <class F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kUInt8:
      return f.template operator()<std::uint8_t>();
    case DType::kInt8:
      return f.template operator()<std::int8_t>();
    case DType::kUInt16:
      return f.template operator()<std::uint16_t>();
    case DType::kInt16:
      return f.template operator()<std::int16_t>();
    case DType::kUInt32:
      return f.template operator()<std::uint32_t>();
    case DType::kInt32:
      return f.template operator()<std::int32_t>();
    case DType::kUInt64:
      return f.template operator()<std::uint64_t>();
    case DType::kInt64:
      return f.template operator()<std::int64_t>();
    case DType::kFloat32:
      return f.template operator()<float>();
    case DType::kFloat64:
      return f.template operator()<double>();
    case DType::kBool:
      return f.template operator()<bool>();
    case DType::kFloat16:
      return f.template operator()<Float16>();
    case DType::kBFloat16:
      return f.template operator()<BFloat16>();
  }
  throw std::invalid_argument("unknown dtype");
}

}  // namespace flowstate
