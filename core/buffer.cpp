#include "flowstate/core/buffer.h"

#include <cstdlib>
#include <new>

#include "flowstate/core/recycle.h"

#if __has_include(<sys/mman.h>)
#include <sys/mman.h>
#endif

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
/// Blocks of at least this many bytes (a batch of images: 256 × 600 kB) are aligned to and
/// sized in 2 MB huge pages, and asked to be backed by them (MADV_HUGEPAGE; the kernel's
/// `transparent_hugepage` setting "madvise" honours only this): a first touch then faults
/// once per 2 MB instead of once per 4 kB, which on a virtual machine was ~10% of an image
/// pipeline's time (bench/RESULTS.md, "Toward 2×"). Where the kernel says no, nothing changes.
constexpr std::size_t kHugeThreshold = std::size_t{8} << 20;
constexpr std::size_t kHugePage = std::size_t{2} << 20;

void* aligned_host(std::size_t size) {
  const std::size_t align = size >= kHugeThreshold ? kHugePage : kAlign;
  std::size_t rounded = (size + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded == 0 ? align : rounded);
  if (p == nullptr) throw std::bad_alloc();
#if defined(MADV_HUGEPAGE)
  if (align == kHugePage) madvise(p, rounded, MADV_HUGEPAGE);
#endif
  return p;
}
}  // namespace

Buffer::~Buffer() {
  if (pool_)
    pool_->give_back(data_, size_);
  else if (release_)
    release_(data_, size_);
}

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

BufferPool::BufferPool(Allocator allocator)
    : allocator_(std::move(allocator)), buffers_(std::make_shared<BlockFreeList>()) {}

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
  // The buffer keeps the pool alive, so a batch may outlive the pipeline that made it; the
  // Buffer and its control block are one block of buffers_.
  try {
    return std::allocate_shared<Buffer>(RecyclingAllocator<Buffer>(buffers_), shared_from_this(), p,
                                        size, allocator_.device);
  } catch (...) {
    give_back(p, size);
    throw;
  }
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
