// Recycled shared objects: what a pipeline makes once per batch and shares with other threads
// (a batch's stamp and its node snapshots, a pooled buffer's owner) is handed out as a
// std::shared_ptr whose memory — the object itself and the shared_ptr's control block — goes
// back to a free list when the last holder drops it, instead of to malloc. In steady state a
// batch then allocates nothing for them, and a free on the consumer's thread of what the
// spine's thread allocated no longer takes glibc's arena lock (bench/RESULTS.md, issue 26).
//
//   Recycler<StampData> stamps;
//   std::shared_ptr<StampData> s = stamps.get([] { return std::make_unique<StampData>(); },
//                                             [](StampData& d) { d.snapshots.clear(); });
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace flowstate {

/// A thread-safe free list of memory blocks of one size (the first size taken): blocks given
/// back wait there for the next take of that size; blocks of another size go to the heap. Keeps
/// at most kMaxFree blocks (a pipeline holds a bounded number in flight).
class BlockFreeList {
 public:
  /// The most free blocks kept; more given back are freed.
  static constexpr std::size_t kMaxFree = 4096;

  BlockFreeList() = default;
  ~BlockFreeList() {
    for (void* p : free_) ::operator delete(p);
  }
  BlockFreeList(const BlockFreeList&) = delete;
  BlockFreeList& operator=(const BlockFreeList&) = delete;

  /// A block of `size` bytes (default new alignment): a free one, else a new one.
  void* take(std::size_t size) {
    {
      std::lock_guard lock(mu_);
      if (size_ == 0) size_ = size;
      if (size == size_ && !free_.empty()) {
        void* p = free_.back();
        free_.pop_back();
        return p;
      }
    }
    return ::operator new(size);
  }
  /// Gives back a block that take(size) returned.
  void give(void* p, std::size_t size) noexcept {
    {
      std::lock_guard lock(mu_);
      if (size == size_ && free_.size() < kMaxFree) {
        try {
          free_.push_back(p);
          return;
        } catch (...) {  // the list could not grow: free the block instead
        }
      }
    }
    ::operator delete(p);
  }

 private:
  std::mutex mu_;
  std::size_t size_ = 0;
  std::vector<void*> free_;
};

/// An allocator (for std::allocate_shared or a shared_ptr's control block) whose blocks come
/// from and go back to a BlockFreeList, which it keeps alive.
template <class T>
class RecyclingAllocator {
 public:
  using value_type = T;

  explicit RecyclingAllocator(std::shared_ptr<BlockFreeList> blocks) noexcept
      : blocks_(std::move(blocks)) {}
  template <class U>
  RecyclingAllocator(const RecyclingAllocator<U>& other) noexcept  // NOLINT: rebinding
      : blocks_(other.blocks()) {}

  T* allocate(std::size_t n) {
    static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__);
    return static_cast<T*>(blocks_->take(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) noexcept { blocks_->give(p, n * sizeof(T)); }

  const std::shared_ptr<BlockFreeList>& blocks() const noexcept { return blocks_; }
  template <class U>
  bool operator==(const RecyclingAllocator<U>& other) const noexcept {
    return blocks_ == other.blocks();
  }

 private:
  std::shared_ptr<BlockFreeList> blocks_;
};

/// Hands out std::shared_ptr<T> whose objects are reused once every holder has dropped them:
/// get() refills a given-back object (its vectors and strings keep their capacity) or makes a
/// new one, and its control block comes from a free list. Thread-safe: objects may be dropped on
/// any thread. Objects handed out may outlive the Recycler (each keeps the free lists alive).
/// Given-back objects are kept (at most BlockFreeList::kMaxFree) until the Recycler and every
/// object it handed out are gone.
template <class T>
class Recycler {
 public:
  /// `clear`, when given, runs on every object given back, before it waits for reuse: it drops
  /// what the object references (other shared objects), so a waiting object pins nothing.
  explicit Recycler(void (*clear)(T&) = nullptr) : shared_(std::make_shared<Shared>(clear)) {}

  /// An object for a new holder: a given-back one after `refill(T&)`, else `make()` (a
  /// std::unique_ptr<T>). Either may throw; nothing leaks.
  template <class Make, class Refill>
  std::shared_ptr<T> get(Make&& make, Refill&& refill) {
    std::unique_ptr<T> obj = shared_->take();
    if (obj)
      refill(*obj);
    else
      obj = make();
    // The control block holds the allocator (keeping the free lists alive until it is given
    // back) and the deleter, which only needs them alive while it runs.
    return std::shared_ptr<T>(obj.release(), GiveBack{shared_.get()},
                              RecyclingAllocator<T>(std::shared_ptr<BlockFreeList>(shared_)));
  }

 private:
  struct Shared : BlockFreeList {
    explicit Shared(void (*c)(T&)) : clear(c) {}
    ~Shared() {
      for (T* p : objects) delete p;
    }
    std::unique_ptr<T> take() {
      std::lock_guard lock(mu);
      if (objects.empty()) return nullptr;
      T* p = objects.back();
      objects.pop_back();
      return std::unique_ptr<T>(p);
    }
    void put(T* p) noexcept {
      if (clear != nullptr) clear(*p);
      {
        std::lock_guard lock(mu);
        if (objects.size() < kMaxFree) {
          try {
            objects.push_back(p);
            return;
          } catch (...) {  // the list could not grow: delete the object instead
          }
        }
      }
      delete p;
    }
    void (*clear)(T&);
    std::mutex mu;
    std::vector<T*> objects;
  };
  struct GiveBack {
    Shared* shared;
    void operator()(T* p) const noexcept { shared->put(p); }
  };

  std::shared_ptr<Shared> shared_;
};

}  // namespace flowstate
