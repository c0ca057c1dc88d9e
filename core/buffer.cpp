#include "flowstate/core/buffer.h"

#include <cstdlib>
#include <new>

namespace flowstate {

std::string Device::to_string() const {
  switch (kind) {
    case MemoryKind::kHost:
      return "cpu";
    case MemoryKind::kPinned:
      return "pinned";
    case MemoryKind::kDevice:
      return "cuda:" + std::to_string(index);
  }
  return "?";
}

namespace {
constexpr std::size_t kAlign = 64;

void* aligned_host(std::size_t size) {
  std::size_t rounded = (size + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded == 0 ? kAlign : rounded);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace

std::shared_ptr<Buffer> Buffer::allocate(std::size_t size) {
  return std::make_shared<Buffer>(aligned_host(size), size, Device{},
                                  [](void* p, std::size_t) { std::free(p); });
}

std::shared_ptr<Buffer> Buffer::borrow(void* data, std::size_t size,
                                       std::shared_ptr<const void> owner, Device device) {
  return std::make_shared<Buffer>(data, size, device,
                                  [owner = std::move(owner)](void*, std::size_t) {});
}

std::shared_ptr<BufferPool> BufferPool::host() {
  return std::make_shared<BufferPool>(
      Allocator{Device{}, aligned_host, [](void* p) { std::free(p); }});
}

BufferPool::~BufferPool() {
  for (auto& [size, p] : free_) allocator_.deallocate(p);
}

std::shared_ptr<Buffer> BufferPool::acquire(std::size_t size) {
  void* p = nullptr;
  {
    std::lock_guard lock(mu_);
    for (std::size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].first == size) {
        p = free_[i].second;
        free_[i] = free_.back();
        free_.pop_back();
        break;
      }
    }
  }
  if (p == nullptr) {
    p = allocator_.allocate(size);  // may throw: only successful allocations are counted
    std::lock_guard lock(mu_);
    ++allocated_;
  }
  // The buffer keeps the pool alive, so a batch may outlive the pipeline that made it.
  return std::make_shared<Buffer>(
      p, size, allocator_.device,
      [pool = shared_from_this()](void* data, std::size_t n) { pool->give_back(data, n); });
}

void BufferPool::give_back(void* data, std::size_t size) {
  std::lock_guard lock(mu_);
  free_.emplace_back(size, data);
}

std::size_t BufferPool::allocated() const {
  std::lock_guard lock(mu_);
  return allocated_;
}

}  // namespace flowstate
