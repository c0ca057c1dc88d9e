// Range reads of remote objects without a server (nodes/sources/remote_blocks.h): the block
// arithmetic (the last block short, a range across a boundary, what the look-ahead needs);
// block keys that never name a whole copy; a limit below the look-ahead is a ConfigError before
// any request; reads of cached blocks — within one and across two — are the object's bytes
// and need no request; blocks the reads left behind are unpinned when the limit needs room; a
// block whose download fails is a DataError naming the URL and the range. Downloads through
// s3rver and nginx, the cache's peak and a resume after SIGKILL are
// tests/python/test_remote_blocks.py.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "flowstate/core/error.h"
#include "flowstate/nodes/sources/object_cache.h"
#include "flowstate/nodes/sources/remote_blocks.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::cache_copy_pinned;
using testing::fast_failing_remote;
using testing::TempDir;
using testing::unreachable_object;

/// Byte i of the test object: its position, mixed.
char byte_at(std::uint64_t i) { return static_cast<char>((i * 131 + i / 7) & 0xff); }

/// Puts block `k` of `o` (blocks of `block` bytes) in the cache as a download would.
void seed_block(const TempDir& dir, const RemoteObject& o, std::uint64_t block, std::uint64_t k) {
  std::filesystem::create_directories(dir / "objects");
  const ByteRange r = block_range(o.size, block, k);
  std::string bytes(r.length, '\0');
  for (std::uint64_t i = 0; i < r.length; ++i) bytes[i] = byte_at(r.offset + i);
  std::ofstream(dir / ("objects/" + block_key(o, r.offset, r.length) + ".obj"), std::ios::binary)
      << bytes;
}

/// Whether some process holds block `k`'s copy pinned (a shared flock on it).
bool pinned(const TempDir& dir, const RemoteObject& o, std::uint64_t block, std::uint64_t k) {
  const ByteRange r = block_range(o.size, block, k);
  return cache_copy_pinned(dir.path(), block_key(o, r.offset, r.length));
}

TEST(RemoteBlocks, BlockArithmetic) {
  EXPECT_EQ(block_count(0, 4096), 0u);
  EXPECT_EQ(block_count(1, 4096), 1u);
  EXPECT_EQ(block_count(4096, 4096), 1u);
  EXPECT_EQ(block_count(4097, 4096), 2u);
  EXPECT_EQ(block_range(10000, 4096, 0), (ByteRange{0, 4096}));
  EXPECT_EQ(block_range(10000, 4096, 2), (ByteRange{8192, 1808}));  // the last one short
  EXPECT_EQ(blocks_spanned(0, 4096, 4096), (BlockSpan{0, 0}));
  EXPECT_EQ(blocks_spanned(4095, 2, 4096), (BlockSpan{0, 1}));  // across a boundary
  EXPECT_EQ(blocks_spanned(4096, 1, 4096), (BlockSpan{1, 1}));
  EXPECT_EQ(blocks_spanned(100, 9000, 4096), (BlockSpan{0, 2}));
  // The look-ahead and the block read: the largest lookahead + 1 blocks of all objects.
  EXPECT_EQ(blocks_needed({10000}, 4096, 1), 8192u);
  EXPECT_EQ(blocks_needed({10000}, 4096, 8), 10000u);  // fewer blocks than that: all
  EXPECT_EQ(blocks_needed({100, 5000, 300}, 4096, 1), 4096u + 904u);
  EXPECT_EQ(blocks_needed({}, 4096, 3), 0u);
}

TEST(RemoteBlocks, BlockKeysNeverNameAWholeCopyAndDifferByRange) {
  const RemoteObject o = unreachable_object("a.bin", 8192);
  EXPECT_NE(block_key(o, 0, 8192), cache_key(o));
  EXPECT_NE(block_key(o, 0, 4096), block_key(o, 4096, 4096));
  EXPECT_EQ(block_key(o, 0, 4096).size(), 32u);
  RemoteObject changed = o;
  changed.etag = "\"other\"";
  EXPECT_NE(block_key(o, 0, 4096), block_key(changed, 0, 4096));
}

TEST(RemoteBlocks, ALimitBelowTheLookAheadIsAConfigErrorBeforeAnyRequest) {
  TempDir dir;
  const std::vector<RemoteObject> objects{unreachable_object("a.bin", 40000),
                                          unreachable_object("b", 9000)};
  const auto before = remote_request_counts().gets;
  try {
    RemoteBlocks blocks(objects, 2, 4096, {.dir = dir.path(), .limit = 13000},
                        fast_failing_remote(),
                        /*reserved=*/1000);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.key(), "FLOWSTATE_CACHE_LIMIT");
    EXPECT_NE(m.find("13000 bytes (less the 1000 bytes of the source's index files) is smaller "
                     "than the 12288 bytes of the blocks the look-ahead holds together "
                     "(lookahead: 2 blocks of up to 4096 bytes"),
              std::string::npos)
        << m;
  }
  EXPECT_EQ(remote_request_counts().gets, before);
  EXPECT_NO_THROW(RemoteBlocks(objects, 2, 4096, {.dir = dir.path(), .limit = 13288},
                               fast_failing_remote(), 1000));
  EXPECT_THROW(RemoteBlocks(objects, 2, 4096, {.dir = dir.path(), .limit = 13287},
                            fast_failing_remote(), 1000),
               ConfigError);
}

TEST(RemoteBlocks, ReadsOfCachedBlocksAreTheBytesWithinAndAcrossBlocksWithoutARequest) {
  TempDir dir;
  const RemoteObject o = unreachable_object("tokens.bin", 5 * 4096 + 100);
  for (std::uint64_t k = 0; k < block_count(o.size, 4096); ++k) seed_block(dir, o, 4096, k);
  const auto before = remote_request_counts().gets;
  RemoteBlocks blocks({o}, 2, 4096, {.dir = dir.path(), .limit = 1 << 20}, fast_failing_remote());
  auto expect_bytes = [&](std::uint64_t offset, std::size_t length) {
    const auto got = blocks.read(0, offset, length);
    ASSERT_EQ(got.size(), length);
    for (std::size_t i = 0; i < length; ++i)
      ASSERT_EQ(static_cast<char>(got[i]), byte_at(offset + i)) << offset << "+" << i;
  };
  expect_bytes(0, 100);
  expect_bytes(4000, 200);           // across the boundary of blocks 0 and 1
  expect_bytes(4096 * 5, 100);       // the short last block
  expect_bytes(100, 4096 * 5);       // across all six
  expect_bytes(4096 * 2 + 5, 4091);  // the rest of block 2
  EXPECT_EQ(blocks.read(0, 7, 0).size(), 0u);
  EXPECT_THROW(blocks.read(0, o.size - 10, 11), DataError);  // past the listed size
  EXPECT_EQ(remote_request_counts().gets, before);
}

TEST(RemoteBlocks, BlocksTheReadsLeftBehindAreUnpinnedWhenTheLimitNeedsRoom) {
  TempDir dir;
  const RemoteObject o = unreachable_object("r.bin", 16 * 4096);
  for (std::uint64_t k = 0; k < 16; ++k) seed_block(dir, o, 4096, k);
  // Room for 3 blocks (not all 16: none is held for good); a look-ahead of 1: the block read.
  RemoteBlocks blocks({o}, 1, 4096, {.dir = dir.path(), .limit = 3 * 4096}, fast_failing_remote());
  // Random reads (jumps: no look-ahead), each of a block of its own.
  for (const std::uint64_t k : {10u, 3u, 14u, 7u, 12u}) {
    blocks.read(0, k * 4096 + 1, 10);
    std::size_t held = 0;
    for (std::uint64_t j = 0; j < 16; ++j) held += pinned(dir, o, 4096, j) ? 1 : 0;
    EXPECT_LE(held, 3u) << "after reading block " << k;
    EXPECT_TRUE(pinned(dir, o, 4096, k)) << k;
  }
  // The first blocks read were the least recently read: unpinned, the cache may evict them.
  EXPECT_FALSE(pinned(dir, o, 4096, 10));
  EXPECT_FALSE(pinned(dir, o, 4096, 3));
}

TEST(RemoteBlocks, WhenTheLimitHoldsEveryBlockAllArePinnedAndViewsStayValid) {
  TempDir dir;
  const RemoteObject o = unreachable_object("all.bin", 6 * 4096 + 10);
  for (std::uint64_t k = 0; k < block_count(o.size, 4096); ++k) seed_block(dir, o, 4096, k);
  RemoteBlocks blocks({o}, 1, 4096, {.dir = dir.path(), .limit = o.size}, fast_failing_remote());
  ASSERT_TRUE(blocks.holds_all());
  const auto across = blocks.view(0, 4000, 5000);  // blocks 0 to 2
  const auto within = blocks.view(0, 4096 * 6 + 1, 9);
  // Every block is downloaded (here: found cached) in the background and stays pinned.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  // (A fetch is counted when it starts; its pin is taken when it ends: wait for the pins.)
  const auto all_pinned = [&] {
    for (std::uint64_t k = 0; k < 7; ++k)
      if (!pinned(dir, o, 4096, k)) return false;
    return true;
  };
  while (!all_pinned() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(blocks.fetches(), 7u);
  for (std::uint64_t k = 0; k < 7; ++k) EXPECT_TRUE(pinned(dir, o, 4096, k)) << k;
  // Reads meanwhile do not move the views.
  for (std::uint64_t k = 0; k < 7; ++k) blocks.read(0, k * 4096, 10);
  for (std::size_t i = 0; i < across.size(); ++i)
    ASSERT_EQ(static_cast<char>(across[i]), byte_at(4000 + i)) << i;
  for (std::size_t i = 0; i < within.size(); ++i)
    ASSERT_EQ(static_cast<char>(within[i]), byte_at(4096 * 6 + 1 + i)) << i;
  EXPECT_EQ(blocks.view(0, 4000, 5000).data(), across.data());  // copied once, kept
  // One byte less and the limit no longer holds them all.
  EXPECT_FALSE(
      RemoteBlocks({o}, 1, 4096, {.dir = dir.path(), .limit = o.size - 1}, fast_failing_remote())
          .holds_all());
}

TEST(RemoteBlocks, AReaderThatHoldsEveryBlockPinsAllCachedOnesAtItsFirstRead) {
  TempDir dir;
  const RemoteObject o = unreachable_object("warm.bin", 6 * 4096 + 10);
  // Blocks 0 to 5 cached; block 6 not (its download fails: the server is unreachable).
  for (std::uint64_t k = 0; k < 6; ++k) seed_block(dir, o, 4096, k);
  RemoteBlocks blocks({o}, 1, 4096, {.dir = dir.path(), .limit = o.size}, fast_failing_remote());
  ASSERT_TRUE(blocks.holds_all());
  const auto first = blocks.view(0, 4096 * 5 + 3, 20);
  // Every cached block is pinned (and mapped) by the first read, not later by the downloaders.
  for (std::uint64_t k = 0; k < 6; ++k) EXPECT_TRUE(pinned(dir, o, 4096, k)) << k;
  EXPECT_GE(blocks.fetches(), 6u);
  for (std::size_t i = 0; i < first.size(); ++i)
    ASSERT_EQ(static_cast<char>(first[i]), byte_at(4096 * 5 + 3 + i)) << i;
  const auto across = blocks.view(0, 4090, 4096 * 4);  // blocks 0 to 4
  for (std::size_t i = 0; i < across.size(); ++i)
    ASSERT_EQ(static_cast<char>(across[i]), byte_at(4090 + i)) << i;
  // The block not cached is downloaded, and its failure raised to the read that needs it.
  EXPECT_THROW(blocks.view(0, 4096 * 6, 10), DataError);
  EXPECT_EQ(static_cast<char>(blocks.view(0, 7, 1)[0]), byte_at(7));
}

TEST(RemoteBlocks, AFailedBlockDownloadIsADataErrorNamingTheUrlAndTheRange) {
  TempDir dir;
  const RemoteObject o = unreachable_object("gone.bin", 3 * 4096);
  seed_block(dir, o, 4096, 0);
  RemoteBlocks blocks({o}, 1, 4096, {.dir = dir.path(), .limit = 1 << 20}, fast_failing_remote());
  EXPECT_NO_THROW(blocks.read(0, 0, 10));
  try {
    blocks.read(0, 4096 * 2 + 1, 10);
    FAIL() << "no error";
  } catch (const DataError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("https://example.invalid/gone.bin bytes 8192-12287"), std::string::npos) << m;
    EXPECT_NE(m.find("(after 1 attempt)"), std::string::npos) << m;
  }
  // Nothing partial is left counted as a copy.
  std::size_t copies = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir / "objects"))
    copies += e.path().extension() == ".obj" ? 1 : 0;
  EXPECT_LE(copies, 2u);  // block 0, and block 1 if the look-ahead found it (it cannot: not seeded)
}

/// Sets an environment variable for a scope, then removes it (the tests' runs leave it unset).
class PlanEnv {
 public:
  PlanEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~PlanEnv() { ::unsetenv(name_); }
  PlanEnv(const PlanEnv&) = delete;
  PlanEnv& operator=(const PlanEnv&) = delete;

 private:
  const char* name_;
};

/// Waits up to 10 s for `done()`.
template <class F>
bool eventually(F done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

/// A planned read of `length` bytes at `offset` of object 0.
PlannedRead at(std::uint64_t offset, std::uint64_t length = 10) { return {0, offset, length}; }

TEST(RemoteBlocksPlan, ThePlanDownloadsItsBlocksInOrderWithinTheLimitLessOneBlock) {
  TempDir dir;
  PlanEnv on("FLOWSTATE_REMOTE_PLAN", "1");  // off by default
  const RemoteObject o = unreachable_object("p.bin", 16 * 4096);
  for (std::uint64_t k = 0; k < 16; ++k) seed_block(dir, o, 4096, k);
  // Room for 3 blocks: a look-ahead of 2 (the plan's pins) and the block a read downloads.
  RemoteBlocks blocks({o}, 2, 4096, {.dir = dir.path(), .limit = 3 * 4096}, fast_failing_remote());
  ASSERT_TRUE(blocks.plans());
  // Reads of blocks 10, 3, 5, then one across 5 and 6, then 12: random, as a global shuffle's.
  const std::vector<PlannedRead> reads{at(10 * 4096 + 7), at(3 * 4096), at(5 * 4096 + 100),
                                       at(6 * 4096 - 5), at(12 * 4096)};
  blocks.plan(reads);
  // The first two blocks of the plan, and no more: the limit less one block is two blocks.
  ASSERT_TRUE(eventually([&] { return pinned(dir, o, 4096, 10) && pinned(dir, o, 4096, 3); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(pinned(dir, o, 4096, 5));
  EXPECT_EQ(blocks.stats().planned_fetches, 2u);
  // Each read finds its blocks downloaded by the plan (waited for here: reads of cached blocks
  // outrun the downloaders); reading them lets the plan's next block come.
  for (std::size_t i = 0; i < reads.size(); ++i) {
    const PlannedRead& r = reads[i];
    const BlockSpan span = blocks_spanned(r.offset, r.length, 4096);
    ASSERT_TRUE(eventually([&] {
      return pinned(dir, o, 4096, span.first) && pinned(dir, o, 4096, span.last);
    })) << "read "
        << i;
    const auto got = blocks.read(0, r.offset, r.length);
    for (std::size_t j = 0; j < got.size(); ++j)
      ASSERT_EQ(static_cast<char>(got[j]), byte_at(r.offset + j)) << i;
  }
  const BlockReadStats s = blocks.stats();
  EXPECT_EQ(s.planned_reads, 5u);
  EXPECT_EQ(s.planned_fetches, 5u);  // 10, 3, 5, 6, 12: every block the plan named
  EXPECT_EQ(s.on_demand, 0u);        // no read downloaded its own block
  // Blocks opened: 10, 3, 5, 6 (the read across 5 and 6 found 5 still its thread's), 12.
  EXPECT_EQ(s.held + s.in_flight, 5u);
  EXPECT_EQ(s.fetches, 5u);
}

TEST(RemoteBlocksPlan, APlannedBlockStaysPinnedUntilItsLastPlannedRead) {
  TempDir dir;
  PlanEnv on("FLOWSTATE_REMOTE_PLAN", "1");  // off by default
  const RemoteObject o = unreachable_object("q.bin", 20 * 4096);
  for (std::uint64_t k = 0; k < 20; ++k) seed_block(dir, o, 4096, k);
  RemoteBlocks blocks({o}, 2, 4096, {.dir = dir.path(), .limit = 3 * 4096}, fast_failing_remote());
  const std::vector<PlannedRead> plan{at(7 * 4096), at(9 * 4096), at(7 * 4096 + 50)};
  blocks.plan(plan);
  ASSERT_TRUE(eventually([&] { return pinned(dir, o, 4096, 7) && pinned(dir, o, 4096, 9); }));
  blocks.read(0, 7 * 4096, 10);  // the first of block 7's two planned reads
  blocks.read(0, 9 * 4096, 10);
  // Reads the plan did not name need room: they unpin what the plan is done with (9) and each
  // other, never block 7, which a planned read still wants.
  for (const std::uint64_t k : {12u, 13u, 14u}) {
    blocks.read(0, k * 4096, 10);
    EXPECT_TRUE(pinned(dir, o, 4096, 7)) << "after reading block " << k;
  }
  EXPECT_FALSE(pinned(dir, o, 4096, 9));
  blocks.read(0, 7 * 4096 + 50, 10);  // its last planned read: an ordinary block from here on
  for (const std::uint64_t k : {15u, 16u, 17u}) blocks.read(0, k * 4096, 10);
  EXPECT_FALSE(pinned(dir, o, 4096, 7));
  const BlockReadStats s = blocks.stats();
  EXPECT_EQ(s.on_demand, 6u);  // 12 to 17, which no plan named
  EXPECT_EQ(s.planned_fetches, 2u);
}

TEST(RemoteBlocksPlan, APlanNeverKeepsAReadWaitingOnTheLeastLimit) {
  TempDir dir;
  PlanEnv on("FLOWSTATE_REMOTE_PLAN", "1");  // off by default
  const RemoteObject o = unreachable_object("w.bin", 16 * 4096);
  for (std::uint64_t k = 0; k < 16; ++k) seed_block(dir, o, 4096, k);
  // The least limit: the look-ahead's 2 blocks and one.
  RemoteBlocks blocks({o}, 2, 4096, {.dir = dir.path(), .limit = 3 * 4096}, fast_failing_remote());
  // A plan whose reads never come (a run that stops), holding the plan's two blocks.
  blocks.plan(std::vector<PlannedRead>{at(1 * 4096), at(2 * 4096), at(4 * 4096)});
  ASSERT_TRUE(eventually([&] { return pinned(dir, o, 4096, 1) && pinned(dir, o, 4096, 2); }));
  // The front (block 5) is held for a straggler; then a read behind it needs a fourth block:
  // one of the plan's pins gives way.
  blocks.read(0, 5 * 4096, 10);
  auto done = std::async(std::launch::async, [&] {
    const auto got = blocks.read(0, 3 * 4096 + 1, 100);
    for (std::size_t j = 0; j < got.size(); ++j)
      if (static_cast<char>(got[j]) != byte_at(3 * 4096 + 1 + j)) return false;
    return true;
  });
  ASSERT_EQ(done.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "a read waits";
  EXPECT_TRUE(done.get());
  std::size_t held = 0;
  for (std::uint64_t k = 0; k < 16; ++k) held += pinned(dir, o, 4096, k) ? 1 : 0;
  EXPECT_LE(held, 3u);
}

TEST(RemoteBlocksPlan, ThePlanIsOffUnlessFlowstateRemotePlanIs1AndAHeldSourceNeedsNone) {
  TempDir dir;
  const RemoteObject o = unreachable_object("e.bin", 16 * 4096);
  for (std::uint64_t k = 0; k < 16; ++k) seed_block(dir, o, 4096, k);
  // Off by default: FLOWSTATE_REMOTE_PLAN unset (PlanEnv leaves it unset).
  ::unsetenv("FLOWSTATE_REMOTE_PLAN");
  EXPECT_FALSE(
      RemoteBlocks({o}, 2, 4096, {.dir = dir.path(), .limit = 3 * 4096}, fast_failing_remote())
          .plans());
  {
    PlanEnv on("FLOWSTATE_REMOTE_PLAN", "1");
    EXPECT_TRUE(
        RemoteBlocks({o}, 2, 4096, {.dir = dir.path(), .limit = 3 * 4096}, fast_failing_remote())
            .plans());
  }
  {
    PlanEnv off("FLOWSTATE_REMOTE_PLAN", "0");
    RemoteBlocks blocks({o}, 2, 4096, {.dir = dir.path(), .limit = 3 * 4096},
                        fast_failing_remote());
    EXPECT_FALSE(blocks.plans());
    blocks.plan(std::vector<PlannedRead>{at(9 * 4096)});
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(pinned(dir, o, 4096, 9));
    EXPECT_EQ(blocks.stats().planned_reads, 0u);
  }
  {
    PlanEnv bad("FLOWSTATE_REMOTE_PLAN", "yes");
    try {
      RemoteBlocks blocks({o}, 2, 4096, {.dir = dir.path(), .limit = 3 * 4096},
                          fast_failing_remote());
      FAIL() << "no error";
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.key(), "FLOWSTATE_REMOTE_PLAN");
    }
  }
  // A reader that holds every block downloads them all: nothing to plan.
  EXPECT_FALSE(
      RemoteBlocks({o}, 2, 4096, {.dir = dir.path(), .limit = o.size}, fast_failing_remote())
          .plans());
}

}  // namespace
}  // namespace flowstate
