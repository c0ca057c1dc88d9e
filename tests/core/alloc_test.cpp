// What a pipeline allocates per batch in steady state: the stamp (StampData and every node's
// snapshot) and a pooled buffer come from free lists (core/recycle.h), so making and dropping
// them allocates nothing once warm. Its own executable: it replaces the global operator new to
// count allocations, which no other test binary should carry.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "flowstate/core/buffer.h"
#include "flowstate/core/recycle.h"
#include "flowstate/core/state.h"
#include "flowstate/graph/spine.h"
#include "flowstate/nodes/builtin.h"
#include "tests/support/testing.h"

namespace {
std::atomic<std::uint64_t> g_allocations{0};

void* counted(std::size_t size, std::size_t align) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (size == 0) size = 1;
  void* p = align <= alignof(std::max_align_t)
                ? std::malloc(size)
                : std::aligned_alloc(align, (size + align - 1) / align * align);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace

void* operator new(std::size_t size) { return counted(size, alignof(std::max_align_t)); }
void* operator new[](std::size_t size) { return counted(size, alignof(std::max_align_t)); }
void* operator new(std::size_t size, std::align_val_t a) {
  return counted(size, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t size, std::align_val_t a) {
  return counted(size, static_cast<std::size_t>(a));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace flowstate {
namespace {

std::uint64_t allocations() { return g_allocations.load(std::memory_order_relaxed); }

struct Thing {
  std::vector<int> values;
};

/// Whether `t` holds `n` values `n` (without allocating, unlike a comparison with a vector).
bool filled(const Thing& t, int n) {
  return t.values.size() == static_cast<std::size_t>(n) &&
         std::all_of(t.values.begin(), t.values.end(), [n](int v) { return v == n; });
}

TEST(Recycler, ReusesObjectsAndControlBlocksOnceDropped) {
  Recycler<Thing> things([](Thing& t) { t.values.clear(); });
  int made = 0;
  auto get = [&](int n) {
    return things.get(
        [&] {
          ++made;
          auto t = std::make_unique<Thing>();
          t->values.assign(static_cast<std::size_t>(n), n);
          return t;
        },
        [&](Thing& t) { t.values.assign(static_cast<std::size_t>(n), n); });
  };
  {
    auto a = get(8);
    auto b = get(8);  // a is held: a second object
    EXPECT_NE(a.get(), b.get());
  }
  const std::uint64_t before = allocations();
  for (int i = 0; i < 100; ++i) {
    auto a = get(8);
    auto b = get(4);
    ASSERT_TRUE(filled(*a, 8));  // refilled, not left as given back
    ASSERT_TRUE(filled(*b, 4));
  }
  EXPECT_EQ(allocations() - before, 0u);
  EXPECT_EQ(made, 2);
}

TEST(Recycler, ObjectsMayOutliveTheRecyclerAndMoveBetweenThreads) {
  std::vector<std::shared_ptr<Thing>> kept;
  {
    Recycler<Thing> things;
    for (int i = 0; i < 64; ++i)
      kept.push_back(things.get([] { return std::make_unique<Thing>(); }, [](Thing&) {}));
  }
  // Dropped on another thread after the recycler is gone: ASan and LSan see any misuse.
  std::thread([&] { kept.clear(); }).join();
  EXPECT_TRUE(kept.empty());
}

TEST(BufferPool, AcquireAllocatesNothingOnceWarm) {
  auto pool = BufferPool::host();
  for (int i = 0; i < 2; ++i) {
    auto a = pool->acquire(4096);
    auto b = pool->acquire(512);
  }
  const std::uint64_t before = allocations();
  for (int i = 0; i < 100; ++i) {
    auto a = pool->acquire(4096);
    auto b = pool->acquire(512);
    std::memset(a->data(), 1, 4096);
  }
  EXPECT_EQ(allocations() - before, 0u);
  EXPECT_EQ(pool->allocated(), 2u);
}

class SpineStamps : public ::testing::Test {
 protected:
  void SetUp() override {
    glob_ = testing::write_records(dir_.str(), 200, 16, 2);
    Pipeline::Builder b;
    b.seed(7)
        .records({.paths = {glob_}, .record_bytes = 16})
        .shuffle({.mode = ShuffleMode::kGlobal})
        .batch({.size = 8});
    pipeline_ = std::make_unique<Pipeline>(b.build());
  }
  testing::TempDir dir_;
  std::string glob_;
  std::unique_ptr<Pipeline> pipeline_;
};

TEST_F(SpineStamps, AStampAllocatesNothingOnceWarm) {
  Spine spine(*pipeline_, 1);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(spine.next());
  for (int i = 0; i < 2; ++i) ASSERT_EQ(spine.snapshot()->snapshots.size(), 3u);
  const std::uint64_t before = allocations();
  for (int i = 0; i < 100; ++i) {
    Stamp s = spine.snapshot();
    ASSERT_EQ(s->snapshots.size(), 3u);
  }
  EXPECT_EQ(allocations() - before, 0u);
}

TEST_F(SpineStamps, AHeldStampNeverChangesAndAReusedOneIsCurrent) {
  Spine spine(*pipeline_, 1);
  Stamp a = spine.snapshot();
  const std::string a_bytes = serialize_stamp(*a);
  ASSERT_TRUE(spine.next());
  Stamp b = spine.snapshot();
  const std::string b_bytes = serialize_stamp(*b);
  EXPECT_NE(b_bytes, a_bytes);
  ASSERT_TRUE(spine.next());
  EXPECT_EQ(serialize_stamp(*a), a_bytes) << "a stamp still held is not reused";
  EXPECT_EQ(serialize_stamp(*b), b_bytes);
  const StampData* a_memory = a.get();
  a.reset();
  Stamp c = spine.snapshot();  // a's memory, refilled with the state after the second batch
  EXPECT_EQ(c.get(), a_memory);
  EXPECT_NE(serialize_stamp(*c), b_bytes);
  // The spine restored from b's bytes stamps what b held.
  Spine again(*pipeline_, 1);
  again.restore(b_bytes);
  EXPECT_EQ(serialize_stamp(*again.snapshot()), b_bytes);
  ASSERT_TRUE(again.next());
  EXPECT_EQ(serialize_stamp(*again.snapshot()), serialize_stamp(*c));
}

// A stamp given back keeps its node snapshots, and the next stamp refills them in place (one
// recycled object a batch, not one per node) — except a snapshot someone else still holds,
// which must keep the state it was taken with.
TEST_F(SpineStamps, AReusedStampRefillsItsSnapshotsInPlaceButNeverOneHeldElsewhere) {
  Spine spine(*pipeline_, 1);
  ASSERT_TRUE(spine.next());
  Stamp a = spine.snapshot();
  std::vector<const NodeSnapshot*> objects;
  for (const auto& s : a->snapshots) objects.push_back(s.get());
  auto bytes_of = [](const NodeSnapshot& s) {
    std::ostringstream os;
    {
      OutArchive ar(os);
      s.save(ar);
    }
    return os.str();
  };
  std::shared_ptr<const NodeSnapshot> held = a->snapshots[1];  // the shuffle's, kept
  const std::string held_bytes = bytes_of(*held);
  const std::string a_bytes = serialize_stamp(*a);
  a.reset();
  ASSERT_TRUE(spine.next());
  Stamp b = spine.snapshot();  // a's memory again
  ASSERT_EQ(b->snapshots.size(), objects.size());
  EXPECT_EQ(b->snapshots[0].get(), objects[0]) << "refilled in place";
  EXPECT_EQ(b->snapshots[2].get(), objects[2]) << "refilled in place";
  EXPECT_NE(b->snapshots[1].get(), held.get()) << "a held snapshot is never refilled";
  EXPECT_EQ(bytes_of(*held), held_bytes) << "the held snapshot kept its state";
  EXPECT_NE(serialize_stamp(*b), a_bytes);
  // What the refilled stamp says is the spine's state now: a spine restored from it goes on
  // with the same batches.
  Spine again(*pipeline_, 1);
  again.restore(serialize_stamp(*b));
  for (int i = 0; i < 3; ++i) {
    auto x = spine.next();
    auto y = again.next();
    ASSERT_TRUE(x && y);
    EXPECT_EQ(x->info.refs, y->info.refs);
  }
}

}  // namespace
}  // namespace flowstate
