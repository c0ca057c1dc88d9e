#include "flowstate/nodes/sources/megatron_index.h"

#include <algorithm>
#include <stdexcept>

namespace flowstate {

std::optional<DType> megatron_dtype(std::uint8_t code) {
  switch (code) {
    case 1:
      return DType::kUInt8;
    case 2:
      return DType::kInt8;
    case 3:
      return DType::kInt16;
    case 4:
      return DType::kInt32;
    case 5:
      return DType::kInt64;
    case 6:
      return DType::kFloat64;
    case 7:
      return DType::kFloat32;
    case 8:
      return DType::kUInt16;
    default:
      return std::nullopt;
  }
}

std::optional<std::uint8_t> megatron_dtype_code(DType dtype) {
  for (std::uint8_t c = 1; c <= 8; ++c)
    if (megatron_dtype(c) == dtype) return c;
  return std::nullopt;
}

std::string megatron_bin_path(const std::string& idx) {
  return (idx.ends_with(".idx") ? idx.substr(0, idx.size() - 4) : idx) + ".bin";
}

std::string megatron_index(DType dtype, std::span<const std::int32_t> lengths,
                           std::span<const std::uint64_t> documents) {
  const auto code = megatron_dtype_code(dtype);
  if (!code)
    throw std::invalid_argument("a Megatron index cannot hold " + std::string(dtype_name(dtype)) +
                                " items");
  const std::uint64_t sequences = lengths.size();
  if (!documents.empty()) {
    if (documents.front() != 0 || documents.back() != sequences ||
        !std::is_sorted(documents.begin(), documents.end()))
      throw std::invalid_argument(
          "a Megatron document index starts at 0, never decreases and ends at the number of "
          "sequences (" +
          std::to_string(sequences) + ")");
  }
  const std::uint64_t entries = documents.empty() ? sequences + 1 : documents.size();
  std::string out(kMegatronMagic, sizeof(kMegatronMagic));
  out.reserve(kMegatronHeaderBytes + sequences * 12 + entries * 8);
  auto put = [&](std::uint64_t v, std::size_t n) {
    for (std::size_t k = 0; k < n; ++k) out.push_back(static_cast<char>((v >> (8 * k)) & 0xff));
  };
  put(1, 8);  // version
  put(*code, 1);
  put(sequences, 8);
  put(entries, 8);
  for (const std::int32_t n : lengths) {
    if (n < 0)
      throw std::invalid_argument("a Megatron sequence of " + std::to_string(n) + " items");
    put(static_cast<std::uint32_t>(n), 4);
  }
  const std::size_t item = dtype_size(dtype);
  std::uint64_t at = 0;
  for (const std::int32_t n : lengths) {
    put(at, 8);
    at += static_cast<std::uint64_t>(n) * item;
  }
  for (std::uint64_t d = 0; d < entries; ++d) put(documents.empty() ? d : documents[d], 8);
  return out;
}

}  // namespace flowstate
