// The customization points of user types (DESIGN.md §9): Collate<T> turns a batch's user
// values into one value (Batch::user); ToDevice<T> moves such a value to the accelerator. Both
// live here, below the nodes, so the iterable source (nodes/sources/iterable.h), device_copy
// (nodes/device_copy.h) and a user's own code see the same templates.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "flowstate/core/dtype.h"
#include "flowstate/core/tensor.h"

namespace flowstate {

class DeviceCopy;

namespace detail {

/// Arithmetic types that are tensor elements (character types other than char are not), and
/// the 16-bit floats Float16 and BFloat16.
template <class T>
concept TensorElement = (std::is_arithmetic_v<T> && !std::is_same_v<T, long double> &&
                         !std::is_same_v<T, wchar_t> && !std::is_same_v<T, char8_t> &&
                         !std::is_same_v<T, char16_t> && !std::is_same_v<T, char32_t>) ||
                        is_half_v<T>;

/// The DType with T's representation: by kind, size and signedness, so `long long` and
/// `std::int64_t` both give kInt64.
template <TensorElement T>
constexpr DType element_dtype() {
  if constexpr (is_half_v<T>) {
    return dtype_of<T>();
  } else if constexpr (std::is_same_v<T, bool>) {
    return DType::kBool;
  } else if constexpr (std::is_floating_point_v<T>) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "no DType for this floating-point type");
    return sizeof(T) == 4 ? DType::kFloat32 : DType::kFloat64;
  } else if constexpr (std::is_signed_v<T>) {
    constexpr DType kBySize[] = {DType::kInt8,  DType::kInt16, DType::kInt16, DType::kInt32,
                                 DType::kInt32, DType::kInt32, DType::kInt32, DType::kInt64};
    return kBySize[sizeof(T) - 1];
  } else {
    constexpr DType kBySize[] = {DType::kUInt8,  DType::kUInt16, DType::kUInt16, DType::kUInt32,
                                 DType::kUInt32, DType::kUInt32, DType::kUInt32, DType::kUInt64};
    return kBySize[sizeof(T) - 1];
  }
}

/// Writes values[i] (n elements each, from `at(i)`) into a fresh tensor of `shape`.
template <class T, class At>
Tensor stack_elements(std::size_t count, std::size_t n, Shape shape, At at) {
  Tensor out(element_dtype<T>(), shape);
  auto* dst = static_cast<std::byte*>(out.data());
  for (std::size_t i = 0; i < count; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      const T v = at(i, j);  // a local copy: std::vector<bool> hands out proxies
      std::memcpy(dst + (i * n + j) * sizeof(T), &v, sizeof(T));
    }
  return out;
}

}  // namespace detail

/// Customization point: how a batch's user values of type T become one value, Batch::user.
/// The default keeps them as a std::vector<T>; arithmetic types (and Float16, BFloat16) stack
/// into a Tensor [B] of the matching DType, std::array<U, N> of arithmetic U into a Tensor [B, N],
/// Tensors of equal dtype and shape into [B, ...]. Specialize it for a type of your own (and
/// ToDevice<type> when the result holds tensors that should move to the device):
///
///   template <>
///   struct flowstate::Collate<Point> {
///     using type = Tensor;  // [B, 2] float32
///     static Tensor collate(std::vector<Point>&& points);
///   };
///
/// collate() runs on the parallel workers, once per batch; values are in sample order.
template <class T>
struct Collate {
  using type = std::vector<T>;
  static type collate(std::vector<T>&& values) { return std::move(values); }
};

/// Arithmetic values stack into a Tensor [B].
template <detail::TensorElement T>
struct Collate<T> {
  using type = Tensor;
  static Tensor collate(std::vector<T>&& values) {
    const auto b = static_cast<std::int64_t>(values.size());
    return detail::stack_elements<T>(values.size(), 1, Shape{b},
                                     [&](std::size_t i, std::size_t) { return values[i]; });
  }
};

/// Fixed-size arrays of arithmetic values stack into a Tensor [B, N].
template <detail::TensorElement U, std::size_t N>
struct Collate<std::array<U, N>> {
  using type = Tensor;
  static Tensor collate(std::vector<std::array<U, N>>&& values) {
    const auto b = static_cast<std::int64_t>(values.size());
    return detail::stack_elements<U>(values.size(), N, Shape{b, static_cast<std::int64_t>(N)},
                                     [&](std::size_t i, std::size_t j) { return values[i][j]; });
  }
};

/// Tensors of one dtype and shape, in host memory, stack into [B, ...]; others are a
/// DataError naming the first value that differs.
template <>
struct Collate<Tensor> {
  using type = Tensor;
  static Tensor collate(std::vector<Tensor>&& values);
};

/// Customization point: moves a collated user value (Collate<T>::type) to `copy.target()`.
/// The default leaves the value where it is (host memory); Tensor and std::vector<Tensor>
/// move their bytes (nodes/device_copy.h). Specialize it for a type of your own that holds
/// tensors; to_device runs on device_copy's thread, on the batch's own value, for every batch
/// — also on host targets, where DeviceCopy::to_device is a no-op. Tensors a Collate makes
/// live in pageable host memory, so the driver stages their copy (the batch's tensor fields
/// are DMA'd straight from the pinned staging pool).
template <class T>
struct ToDevice {
  static void to_device(T& /*value*/, DeviceCopy& /*copy*/) {}
};

}  // namespace flowstate
