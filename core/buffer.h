// Buffer: a block of memory with an owner. Tensors share Buffers; when the last user drops
// one, its release function runs — freeing the memory, or returning it to a BufferPool so a
// pipeline in steady state allocates nothing.
//
//   auto pool = BufferPool::host();
//   std::shared_ptr<Buffer> b = pool->acquire(256 * 1024);  // back to the pool when dropped
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace flowstate {

class BlockFreeList;
class BufferPool;

/// Where a buffer's bytes live.
enum class MemoryKind : std::uint8_t { kHost, kPinned, kDevice };

/// A memory location: host memory, pinned host memory, or device `index`.
struct Device {
  MemoryKind kind = MemoryKind::kHost;
  int index = 0;
  bool operator==(const Device&) const = default;
  std::string to_string() const;
};

/// An owned, contiguous block of bytes. Not copyable; shared through std::shared_ptr.
/// Thread-safety: the object is immutable; writing to its bytes is the owner's business.
class Buffer {
 public:
  using Release = std::function<void(void* data, std::size_t size)>;

  /// Wraps `data`; `release(data, size)` runs when the Buffer is destroyed (may be empty).
  Buffer(void* data, std::size_t size, Device device, Release release)
      : data_(data), size_(size), device_(device), release_(std::move(release)) {}
  /// Wraps a block of `pool` (BufferPool::acquire), given back to it when the Buffer is
  /// destroyed; the Buffer keeps the pool alive. No function object: nothing is allocated for
  /// the release.
  Buffer(std::shared_ptr<BufferPool> pool, void* data, std::size_t size, Device device)
      : data_(data), size_(size), device_(device), pool_(std::move(pool)) {}
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  /// A new 64-byte-aligned host buffer of `size` bytes (uninitialized).
  static std::shared_ptr<Buffer> allocate(std::size_t size);
  /// A buffer over memory owned by `owner` (kept alive as long as the buffer).
  static std::shared_ptr<Buffer> borrow(void* data, std::size_t size,
                                        std::shared_ptr<const void> owner,
                                        Device device = Device{});

  void* data() const { return data_; }
  std::size_t size() const { return size_; }
  const Device& device() const { return device_; }

 private:
  void* data_;
  std::size_t size_;
  Device device_;
  Release release_;
  std::shared_ptr<BufferPool> pool_;  ///< set: the block goes back to this pool
};

/// Allocation functions for a BufferPool (host, pinned host, or device memory).
struct Allocator {
  Device device;
  std::function<void*(std::size_t)> allocate;  ///< throws on failure
  std::function<void(void*)> deallocate;
};

/// A free list of blocks, recycled when the Buffers handed out are dropped; a request reuses a
/// free block of exactly its size. Thread-safe. Free blocks are kept until the pool and every
/// buffer it handed out are gone (a pipeline's batch sizes are few and fixed). The Buffer
/// objects' own memory (with their shared_ptr's control block) is recycled too: in steady
/// state acquire() allocates nothing.
class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  explicit BufferPool(Allocator allocator);
  ~BufferPool();
  /// A pool of aligned host memory.
  static std::shared_ptr<BufferPool> host();

  /// A buffer of at least `size` bytes (exactly `size` visible).
  std::shared_ptr<Buffer> acquire(std::size_t size);
  /// Number of blocks ever allocated (for tests and benchmarks).
  std::size_t allocated() const;
  const Device& device() const { return allocator_.device; }

 private:
  friend class Buffer;
  void give_back(void* data, std::size_t size);

  Allocator allocator_;
  /// The memory of the Buffer objects handed out (core/recycle.h).
  std::shared_ptr<BlockFreeList> buffers_;
  mutable std::mutex mu_;
  std::vector<std::pair<std::size_t, void*>> free_;
  std::size_t allocated_ = 0;
};

}  // namespace flowstate
