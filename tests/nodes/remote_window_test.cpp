// The look-ahead window's rules without a server (nodes/sources/remote_window.h): a limit
// below the look-ahead and one file more is a ConfigError before any request; reads of cached
// copies are hits that need no request; copies the reads left behind are unpinned (the cache
// may evict them) while the look-ahead stays pinned; a download that fails is a DataError
// naming the URL; the windows of a process over one cache share its limit (reservations that
// do not fit together are a ConfigError; a window takes back what another holds beyond its
// reservation); what `prepare` makes of a copy comes with its bytes. Downloads through a real
// server, the cache's peak and a resume after SIGKILL are tests/python/test_remote_window.py
// and test_remote_lazy.py.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"
#include "flowstate/nodes/sources/object_cache.h"
#include "flowstate/nodes/sources/remote_listing.h"
#include "flowstate/nodes/sources/remote_window.h"
#include "flowstate/nodes/sources/tar.h"
#include "flowstate/tools/testing.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::cache_copy_pinned;
using testing::fast_failing_remote;
using testing::TempDir;
using testing::unreachable_object;

/// Puts a whole copy of `o`, `size` bytes of `fill`, in the cache as a download would.
void seed_copy(const TempDir& dir, const RemoteObject& o, char fill) {
  std::filesystem::create_directories(dir / "objects");
  std::ofstream(dir / ("objects/" + cache_key(o) + ".obj"), std::ios::binary)
      << std::string(o.size, fill);
}

/// Whether some process holds the copy of `o` pinned (a shared flock on it).
bool pinned(const TempDir& dir, const RemoteObject& o) {
  return cache_copy_pinned(dir.path(), cache_key(o));
}

TEST(RemoteWindow, ALimitBelowTheLookAheadAndOneMoreIsAConfigErrorBeforeAnyRequest) {
  TempDir dir;
  std::vector<RemoteObject> objects;
  for (int i = 0; i < 5; ++i) objects.push_back(unreachable_object("o" + std::to_string(i), 300));
  const auto before = remote_request_counts().gets;
  try {
    RemoteWindow window(objects, 2, {.dir = dir.path(), .limit = 800}, fast_failing_remote());
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.key(), "FLOWSTATE_CACHE_LIMIT");
    EXPECT_NE(m.find("800 bytes is smaller than the 900 bytes of the 3 largest"), std::string::npos)
        << m;
    EXPECT_NE(m.find("(lookahead: 2 files ahead of the one read, of 5)"), std::string::npos) << m;
  }
  EXPECT_EQ(remote_request_counts().gets, before);
  // Exactly the look-ahead and one more fits; fewer objects than that need only their total.
  EXPECT_NO_THROW(
      RemoteWindow(objects, 2, {.dir = dir.path(), .limit = 900}, fast_failing_remote()));
  EXPECT_NO_THROW(RemoteWindow({objects[0], objects[1]}, 4, {.dir = dir.path(), .limit = 600},
                               fast_failing_remote()));
}

TEST(RemoteWindow, ReadsInOrderHitTheCacheAndUnpinWhatTheyLeftBehind) {
  TempDir dir;
  std::vector<RemoteObject> objects;
  for (int i = 0; i < 6; ++i) {
    objects.push_back(unreachable_object("o" + std::to_string(i), 100));
    seed_copy(dir, objects.back(), static_cast<char>('a' + i));
  }
  const auto before = remote_request_counts().gets;
  {
    RemoteWindow window(objects, 2, {.dir = dir.path(), .limit = 300}, fast_failing_remote());
    for (std::size_t k = 0; k < objects.size(); ++k) {
      const std::byte* bytes = window.data(k);
      EXPECT_EQ(static_cast<char>(bytes[0]), static_cast<char>('a' + k));
      EXPECT_EQ(static_cast<char>(bytes[99]), static_cast<char>('a' + k));
      EXPECT_EQ(window.data(k), bytes);  // the same file again: the thread's held mapping
    }
    EXPECT_EQ(remote_request_counts().gets, before);  // every copy was cached
    // Three copies fit the limit: the oldest reads were unpinned, the last one is held.
    EXPECT_FALSE(pinned(dir, objects[0]));
    EXPECT_FALSE(pinned(dir, objects[1]));
    EXPECT_FALSE(pinned(dir, objects[2]));
    EXPECT_TRUE(pinned(dir, objects[5]));
    // A straggler just behind the front, still held: a hit that moves nothing.
    EXPECT_EQ(static_cast<char>(window.data(4)[0]), 'e');
    EXPECT_TRUE(pinned(dir, objects[5]));
    // A copy not held behind the front: a straggler, read again (a hit here) without moving
    // the front, unpinning the least recently read other copy.
    EXPECT_EQ(static_cast<char>(window.data(1)[0]), 'b');
    EXPECT_TRUE(pinned(dir, objects[1]));
    EXPECT_TRUE(pinned(dir, objects[5]));
    EXPECT_FALSE(pinned(dir, objects[3]));
    // The next epoch: the first read behind the front moves it there, and the look-ahead
    // (files 0 and 1) stays pinned while the reads go on.
    window.new_pass();
    EXPECT_EQ(static_cast<char>(window.data(0)[0]), 'a');
    EXPECT_EQ(static_cast<char>(window.data(2)[0]), 'c');
    EXPECT_TRUE(pinned(dir, objects[2]));
    EXPECT_TRUE(pinned(dir, objects[0]) || pinned(dir, objects[1]));
    EXPECT_LE(window.fetches(), 12u);
  }
  for (const auto& o : objects) EXPECT_FALSE(pinned(dir, o));  // a closed window pins nothing
}

TEST(RemoteWindow, ADownloadThatFailsIsADataErrorNamingTheUrl) {
  TempDir dir;
  RemoteWindow window({unreachable_object("gone", 100), unreachable_object("other", 100)}, 1,
                      {.dir = dir.path(), .limit = 1000}, fast_failing_remote());
  try {
    window.data(0);
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_EQ(e.file(), "https://example.invalid/gone");
    EXPECT_NE(std::string(e.what()).find("cannot download 'https://example.invalid/gone'"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(window.data(0), DataError);  // again: the same error, not a hang
}

TEST(RemoteWindow, WindowsOverOneCacheWhoseReservationsDoNotFitAreAConfigError) {
  TempDir dir;
  std::vector<RemoteObject> a, b;
  for (int i = 0; i < 4; ++i) {
    a.push_back(unreachable_object("a" + std::to_string(i), 100));
    b.push_back(unreachable_object("b" + std::to_string(i), 100));
  }
  const CacheSettings cache{.dir = dir.path(), .limit = 500};
  RemoteWindow first(a, 2, cache, fast_failing_remote());  // reserves 300 bytes
  EXPECT_EQ(first.reservation(), 300u);
  try {
    RemoteWindow second(b, 2, cache, fast_failing_remote());
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.key(), "FLOWSTATE_CACHE_LIMIT");
    EXPECT_NE(m.find("the cache limit 500 bytes of '" + dir.path().string() +
                     "' is smaller than the 600 bytes the look-ahead windows of 2 remote sources "
                     "of this process reserve together (300 bytes for this one's lookahead of 2 "
                     "files and one more, 300 bytes for 1 other)"),
              std::string::npos)
        << m;
  }
  // Another cache directory has a budget of its own; a smaller look-ahead fits this one.
  TempDir other;
  EXPECT_NO_THROW(RemoteWindow(b, 2, {.dir = other.path(), .limit = 500}, fast_failing_remote()));
  EXPECT_NO_THROW(RemoteWindow(b, 1, cache, fast_failing_remote()));
}

TEST(RemoteWindow, AWindowTakesBackWhatAnotherHoldsBeyondItsReservation) {
  TempDir dir;
  std::vector<RemoteObject> a, b;
  for (int i = 0; i < 6; ++i) {
    a.push_back(unreachable_object("a" + std::to_string(i), 100));
    seed_copy(dir, a.back(), static_cast<char>('a' + i));
    b.push_back(unreachable_object("b" + std::to_string(i), 100));
    seed_copy(dir, b.back(), static_cast<char>('A' + i));
  }
  const CacheSettings cache{.dir = dir.path(), .limit = 600};
  RemoteWindow first(a, 1, cache, fast_failing_remote());  // reserves 200
  // Alone, the window keeps what it read while the limit has room: all 6 copies.
  for (std::size_t k = 0; k < a.size(); ++k)
    EXPECT_EQ(static_cast<char>(first.data(k)[0]), static_cast<char>('a' + k));
  int held = 0;
  for (const auto& o : a) held += pinned(dir, o) ? 1 : 0;
  EXPECT_EQ(held, 6);
  RemoteWindow second(b, 1, cache, fast_failing_remote());  // reserves 200: 400 of 600 reserved
  // The second window reads everything; it needs its reservation, which the first one's
  // borrowed copies hold: they are taken back (unpinned), not waited for.
  const auto t = std::chrono::steady_clock::now();
  for (std::size_t k = 0; k < b.size(); ++k)
    EXPECT_EQ(static_cast<char>(second.data(k)[0]), static_cast<char>('A' + k));
  EXPECT_LT(std::chrono::steady_clock::now() - t, std::chrono::milliseconds(400));
  int total = 0;
  for (const auto& o : a) total += pinned(dir, o) ? 1 : 0;
  for (const auto& o : b) total += pinned(dir, o) ? 1 : 0;
  EXPECT_LE(total * 100, 600);  // both windows together within the limit
  held = 0;
  for (const auto& o : a) held += pinned(dir, o) ? 1 : 0;
  EXPECT_LE(held, 4);  // the first window gave back at least its 2 oldest copies
  // The first window still reads (its look-ahead was never taken).
  EXPECT_EQ(static_cast<char>(first.data(5)[0]), 'f');
  EXPECT_EQ(static_cast<char>(first.data(0)[0]), 'a');
}

TEST(RemoteWindow, WhatPrepareMakesOfACopyComesWithItsBytesAndItsErrorWithEveryRead) {
  TempDir dir;
  std::vector<RemoteObject> objects;
  for (int i = 0; i < 3; ++i) {
    objects.push_back(unreachable_object("p" + std::to_string(i), 100));
    seed_copy(dir, objects.back(), static_cast<char>('a' + i));
  }
  std::atomic<int> prepared{0};
  RemoteWindow window(objects, 1, {.dir = dir.path(), .limit = 200}, fast_failing_remote(),
                      [&](std::size_t k, const MappedFile& copy) -> std::shared_ptr<const void> {
                        ++prepared;
                        if (k == 2) throw DataError("x", 7, "malformed copy");
                        return std::make_shared<const std::string>(
                            std::to_string(k) + static_cast<char>(copy.data()[0]));
                      });
  for (std::size_t k = 0; k < 2; ++k) {
    const auto held = window.read(k);
    EXPECT_EQ(*static_cast<const std::string*>(held.prepared),
              std::to_string(k) + static_cast<char>('a' + k));
    EXPECT_EQ(static_cast<char>(held.data[0]), static_cast<char>('a' + k));
  }
  EXPECT_THROW(window.read(2), DataError);
  EXPECT_THROW(window.read(2), DataError);
  // Read again after the copy was unpinned: prepared again.
  const int before = prepared.load();
  window.rewind();
  EXPECT_EQ(*static_cast<const std::string*>(window.read(0).prepared), "0a");
  EXPECT_GT(prepared.load(), before);
}

/// 4 tar shards of different sizes, written locally and seeded as cached copies of
/// https://example.invalid/shard-{0..3}.tar (nothing listens there: every read is a cache hit),
/// with the job's listing saved in `ck`. Returns the local glob.
std::string remote_tar_fixture(const TempDir& data, const TempDir& cache, const TempDir& ck,
                               std::uint64_t& limit) {
  const std::string pattern = "https://example.invalid/shard-{0..3}.tar";
  std::vector<RemoteObject> objects;
  std::vector<std::uint64_t> sizes;
  for (int f = 0; f < 4; ++f) {
    std::string tar;
    for (int i = 0; i < 20 + 10 * f; ++i) {
      const std::string key = std::to_string(1000 + f * 100 + i);
      append_tar_member(tar, key + ".txt", "sample " + key + std::string(i % 9, '.'));
      append_tar_member(tar, key + ".cls", std::to_string(i % 7));
    }
    append_tar_end(tar);
    const std::string name = "shard-" + std::to_string(f) + ".tar";
    std::ofstream(data / name, std::ios::binary) << tar;
    RemoteObject o{.url = "https://example.invalid/" + name,
                   .fetch_url = "https://example.invalid/" + name,
                   .size = tar.size(),
                   .etag = "\"t" + std::to_string(f) + "\""};
    std::filesystem::create_directories(cache / "objects");
    std::ofstream(cache / ("objects/" + cache_key(o) + ".obj"), std::ios::binary) << tar;
    objects.push_back(o);
    sizes.push_back(tar.size());
  }
  std::filesystem::create_directories(ck / "listings");
  std::ofstream(listing_file(ck.path(), pattern)) << encode_listing(pattern, objects);
  std::sort(sizes.begin(), sizes.end(), std::greater<>());
  limit = sizes[0] + sizes[1];  // lookahead 1 and one more
  return data / "shard-*.tar";
}

TEST(RemoteWindow, ALazyTarSourcePassesTheOracleOnACacheOfTwoShardsAndEqualsLocalFiles) {
  TempDir data, cache, ck;
  std::uint64_t limit = 0;
  const std::string local = remote_tar_fixture(data, cache, ck, limit);
  ::setenv("FLOWSTATE_CACHE_DIR", cache.path().c_str(), 1);
  ::setenv("FLOWSTATE_CACHE_LIMIT", std::to_string(limit).c_str(), 1);
  auto make = [&](const std::string& paths) {
    return [paths] {
      return Pipeline::Builder()
          .seed(17)
          .tar({.paths = {paths}, .fields = {"txt", "cls"}, .lookahead = 1})
          .shuffle({.mode = ShuffleMode::kBuffer, .size = 8})
          .batch({.size = 8, .collate = CollateMode::kRagged})
          .build();
    };
  };
  const std::string remote = "https://example.invalid/shard-{0..3}.tar";
  const auto before = remote_request_counts().gets;
  LoaderOptions options{.epochs = 2, .workers = 2};
  options.checkpoint_dir = ck.path().string();
  // The same batches as on local files (digests include the provenance: file and record).
  {
    // One Loader over the cache at a time: two alive would reserve the limit twice.
    Loader a(make(local)(), {.epochs = 2, .workers = 2});
    const auto want = testing::drain(a);
    Loader b(make(remote)(), options);
    const auto got = testing::drain(b);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].digest, want[i].digest) << i;
    // Two windows over the cache whose reservations do not fit: refused when built.
    EXPECT_THROW(Loader(make(remote)(), options), ConfigError);
  }
  // The counts were saved with the listing; every later build reads them.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(ck / "listings"),
                          std::filesystem::directory_iterator{}),
            2);
  testing::expect_save_restore(make(remote), options, options);
  EXPECT_EQ(remote_request_counts().gets, before);  // every copy came from the cache
  ::unsetenv("FLOWSTATE_CACHE_DIR");
  ::unsetenv("FLOWSTATE_CACHE_LIMIT");
}

}  // namespace
}  // namespace flowstate
