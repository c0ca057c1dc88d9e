// Tensor: a dense, row-major array of one DType over a shared Buffer. Copying a Tensor
// shares its bytes; `clone()` copies them. Exports DLPack for zero-copy hand-off.
//
//   Tensor t(DType::kUInt16, Shape{256, 512});
//   std::span<std::uint16_t> v = t.values<std::uint16_t>();
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>

#include <dlpack/dlpack.h>

#include "flowstate/core/buffer.h"
#include "flowstate/core/dtype.h"

namespace flowstate {

/// A tensor shape of at most kMaxRank dimensions, stored inline (no allocation).
class Shape {
 public:
  static constexpr std::size_t kMaxRank = 8;
  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims);
  static Shape of(std::span<const std::int64_t> dims);

  std::size_t rank() const { return rank_; }
  std::int64_t operator[](std::size_t i) const { return dims_[i]; }
  std::int64_t& operator[](std::size_t i) { return dims_[i]; }
  /// Product of the dimensions (1 for a scalar).
  std::int64_t numel() const;
  /// This shape with `d` in front: [d, ...].
  Shape prepend(std::int64_t d) const;
  std::span<const std::int64_t> dims() const { return {dims_.data(), rank_}; }
  bool operator==(const Shape& o) const;
  std::string to_string() const;  ///< "[256, 1024]"

 private:
  std::array<std::int64_t, kMaxRank> dims_{};
  std::size_t rank_ = 0;
};

/// A dense row-major tensor. Cheap to copy (shares the buffer).
class Tensor {
 public:
  Tensor() = default;
  /// Allocates an uninitialized host tensor.
  Tensor(DType dtype, Shape shape);
  /// A view of `buffer` starting at `offset` bytes. Throws std::length_error when the view
  /// does not fit in the buffer.
  Tensor(std::shared_ptr<Buffer> buffer, std::size_t offset, DType dtype, Shape shape);

  bool defined() const { return buffer_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  std::int64_t numel() const { return shape_.numel(); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  void* data() const { return static_cast<char*>(buffer_->data()) + offset_; }
  std::span<const std::byte> bytes() const {
    return {static_cast<const std::byte*>(data()), nbytes()};
  }
  const std::shared_ptr<Buffer>& buffer() const { return buffer_; }
  std::size_t offset() const { return offset_; }
  const Device& device() const { return buffer_->device(); }

  /// The elements as T; throws std::invalid_argument when T is not the dtype.
  template <class T>
  std::span<T> values() const {
    check_type(dtype_of<T>());
    return {static_cast<T*>(data()), static_cast<std::size_t>(numel())};
  }
  /// A deep copy in fresh host memory.
  Tensor clone() const;
  /// The same bytes with another shape of equal element count.
  Tensor reshape(Shape shape) const;

  /// A DLPack tensor sharing this tensor's memory; the caller owns it and calls its deleter.
  DLManagedTensor* to_dlpack() const;

 private:
  void check_type(DType t) const;

  std::shared_ptr<Buffer> buffer_;
  std::size_t offset_ = 0;
  DType dtype_ = DType::kUInt8;
  Shape shape_;
};

}  // namespace flowstate
