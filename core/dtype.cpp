#include "flowstate/core/dtype.h"

#include <array>

#include "flowstate/core/error.h"

namespace flowstate {
namespace {

struct DTypeInfo {
  DType type;
  std::string_view name;
  std::size_t size;
  std::uint8_t dl_code;
};

constexpr std::array<DTypeInfo, 11> kInfo{{
    {DType::kUInt8, "uint8", 1, kDLUInt},
    {DType::kInt8, "int8", 1, kDLInt},
    {DType::kUInt16, "uint16", 2, kDLUInt},
    {DType::kInt16, "int16", 2, kDLInt},
    {DType::kUInt32, "uint32", 4, kDLUInt},
    {DType::kInt32, "int32", 4, kDLInt},
    {DType::kUInt64, "uint64", 8, kDLUInt},
    {DType::kInt64, "int64", 8, kDLInt},
    {DType::kFloat32, "float32", 4, kDLFloat},
    {DType::kFloat64, "float64", 8, kDLFloat},
    {DType::kBool, "bool", 1, kDLUInt},
}};

const DTypeInfo& info(DType t) { return kInfo[static_cast<std::size_t>(t)]; }

}  // namespace

std::size_t dtype_size(DType t) { return info(t).size; }
std::string_view dtype_name(DType t) { return info(t).name; }

DType parse_dtype(std::string_view name, const std::string& key) {
  for (const auto& i : kInfo) {
    if (i.name == name) return i.type;
  }
  std::string known;
  for (const auto& i : kInfo) known += (known.empty() ? "" : ", ") + std::string(i.name);
  throw ConfigError(key, "unknown dtype '" + std::string(name) + "' (known: " + known + ")");
}

DLDataType to_dlpack(DType t) {
  DLDataType d;
  d.code = info(t).dl_code;
  d.bits = static_cast<std::uint8_t>(info(t).size * 8);
  d.lanes = 1;
  return d;
}

}  // namespace flowstate
