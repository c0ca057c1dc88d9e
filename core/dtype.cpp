#include "flowstate/core/dtype.h"

#include <array>

#include "flowstate/core/error.h"

namespace flowstate {
namespace {

struct DTypeInfo {
  DType type;
  std::size_t size;
  std::uint8_t dl_code;
};

constexpr std::array<DTypeInfo, 13> kInfo{{
    {DType::kUInt8, 1, kDLUInt},
    {DType::kInt8, 1, kDLInt},
    {DType::kUInt16, 2, kDLUInt},
    {DType::kInt16, 2, kDLInt},
    {DType::kUInt32, 4, kDLUInt},
    {DType::kInt32, 4, kDLInt},
    {DType::kUInt64, 8, kDLUInt},
    {DType::kInt64, 8, kDLInt},
    {DType::kFloat32, 4, kDLFloat},
    {DType::kFloat64, 8, kDLFloat},
    {DType::kBool, 1, kDLUInt},
    {DType::kFloat16, 2, kDLFloat},
    {DType::kBFloat16, 2, kDLBfloat},
}};

// Both tables are indexed by the enum's value.
constexpr bool indexed_by_value() {
  for (std::size_t i = 0; i < kInfo.size(); ++i)
    if (static_cast<std::size_t>(kInfo[i].type) != i ||
        static_cast<std::size_t>(kDTypeNames[i].first) != i)
      return false;
  return kInfo.size() == kDTypeNames.size();
}
static_assert(indexed_by_value());

const DTypeInfo& info(DType t) { return kInfo[static_cast<std::size_t>(t)]; }

}  // namespace

std::size_t dtype_size(DType t) { return info(t).size; }
std::string_view dtype_name(DType t) { return kDTypeNames[static_cast<std::size_t>(t)].second; }

DType parse_dtype(std::string_view name, const std::string& key) {
  for (const auto& [type, n] : kDTypeNames) {
    if (n == name) return type;
  }
  std::string known;
  for (const auto& [type, n] : kDTypeNames) known += (known.empty() ? "" : ", ") + std::string(n);
  throw ConfigError(key, "unknown dtype '" + std::string(name) + "' (known: " + known + ")");
}

DLDataType to_dlpack(DType t) {
  DLDataType d;
  d.code = info(t).dl_code;
  d.bits = static_cast<std::uint8_t>(info(t).size * 8);
  d.lanes = 1;
  return d;
}

bool dtype_is_float(DType t) {
  const std::uint8_t code = info(t).dl_code;
  return code == kDLFloat || code == kDLBfloat;
}

bool dtype_is_integer(DType t) { return t != DType::kBool && !dtype_is_float(t); }

}  // namespace flowstate
