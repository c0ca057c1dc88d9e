#include "flowstate/core/tensor.h"

#include <cstring>
#include <stdexcept>

namespace flowstate {

Shape::Shape(std::initializer_list<std::int64_t> dims) {
  if (dims.size() > kMaxRank) throw std::length_error("tensor rank above 8");
  for (auto d : dims) dims_[rank_++] = d;
}

Shape Shape::of(std::span<const std::int64_t> dims) {
  if (dims.size() > kMaxRank) throw std::length_error("tensor rank above 8");
  Shape s;
  for (auto d : dims) s.dims_[s.rank_++] = d;
  return s;
}

std::int64_t Shape::numel() const {
  std::int64_t n = 1;
  for (std::size_t i = 0; i < rank_; ++i) n *= dims_[i];
  return n;
}

Shape Shape::prepend(std::int64_t d) const {
  if (rank_ == kMaxRank) throw std::length_error("tensor rank above 8");
  Shape s;
  s.rank_ = rank_ + 1;
  s.dims_[0] = d;
  for (std::size_t i = 0; i < rank_; ++i) s.dims_[i + 1] = dims_[i];
  return s;
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (std::size_t i = 0; i < rank_; ++i)
    if (dims_[i] != o.dims_[i]) return false;
  return true;
}

std::string Shape::to_string() const {
  std::string s = "[";
  for (std::size_t i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
  return s + "]";
}

Tensor::Tensor(DType dtype, Shape shape) : dtype_(dtype), shape_(shape) {
  buffer_ = Buffer::allocate(nbytes());
}

Tensor::Tensor(std::shared_ptr<Buffer> buffer, std::size_t offset, DType dtype, Shape shape)
    : buffer_(std::move(buffer)), offset_(offset), dtype_(dtype), shape_(shape) {
  if (!buffer_ || offset_ + nbytes() > buffer_->size())
    throw std::length_error("tensor view of " + std::to_string(nbytes()) + " bytes at offset " +
                            std::to_string(offset_) + " does not fit its buffer");
}

Tensor Tensor::clone() const {
  Tensor t(dtype_, shape_);
  if (nbytes() > 0) std::memcpy(t.data(), data(), nbytes());
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  if (shape.numel() != numel())
    throw std::invalid_argument("cannot reshape " + shape_.to_string() + " to " +
                                shape.to_string());
  return Tensor(buffer_, offset_, dtype_, shape);
}

void Tensor::check_type(DType t) const {
  if (t != dtype_)
    throw std::invalid_argument("tensor holds " + std::string(dtype_name(dtype_)) + ", not " +
                                std::string(dtype_name(t)));
}

namespace {
struct DLPackHolder {
  Tensor tensor;
  std::array<std::int64_t, Shape::kMaxRank> shape{};
  DLManagedTensor managed{};
};
}  // namespace

DLManagedTensor* Tensor::to_dlpack() const {
  auto* h = new DLPackHolder{*this};
  for (std::size_t i = 0; i < shape_.rank(); ++i) h->shape[i] = shape_[i];
  DLTensor& t = h->managed.dl_tensor;
  t.data = buffer_->data();
  t.byte_offset = offset_;
  switch (device().kind) {
    case MemoryKind::kHost:
      t.device = {kDLCPU, 0};
      break;
    case MemoryKind::kPinned:
      t.device = {kDLCUDAHost, 0};
      break;
    case MemoryKind::kDevice:
      t.device = {kDLCUDA, device().index};
      break;
  }
  t.ndim = static_cast<std::int32_t>(shape_.rank());
  t.dtype = flowstate::to_dlpack(dtype_);
  t.shape = h->shape.data();
  t.strides = nullptr;  // compact row-major
  h->managed.manager_ctx = h;
  h->managed.deleter = [](DLManagedTensor* self) {
    delete static_cast<DLPackHolder*>(self->manager_ctx);
  };
  return &h->managed;
}

}  // namespace flowstate
