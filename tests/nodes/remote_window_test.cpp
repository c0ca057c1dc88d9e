// The look-ahead window's rules without a server (nodes/sources/remote_window.h): a limit
// below the look-ahead and one file more is a ConfigError before any request; reads of cached
// copies are hits that need no request; copies the reads left behind are unpinned (the cache
// may evict them) while the look-ahead stays pinned; a download that fails is a DataError
// naming the URL. Downloads through a real server, the cache's peak and a resume after
// SIGKILL are tests/python/test_remote_window.py.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "flowstate/core/error.h"
#include "flowstate/nodes/sources/object_cache.h"
#include "flowstate/nodes/sources/remote_window.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::TempDir;

RemoteObject unreachable(const std::string& name, std::uint64_t size) {
  return {.url = "https://example.invalid/" + name,
          .fetch_url = "http://127.0.0.1:1/" + name,
          .size = size,
          .etag = "\"e-" + name + "\""};
}

/// Puts a whole copy of `o`, `size` bytes of `fill`, in the cache as a download would.
void seed_copy(const TempDir& dir, const RemoteObject& o, char fill) {
  std::filesystem::create_directories(dir / "objects");
  std::ofstream(dir / ("objects/" + cache_key(o) + ".obj"), std::ios::binary)
      << std::string(o.size, fill);
}

RemoteSettings fast_failing() {
  RemoteSettings s;
  s.attempts = 1;
  s.timeout = std::chrono::milliseconds(500);
  s.connections = 2;
  return s;
}

/// Whether some process holds the copy of `o` pinned (a shared flock on it).
bool pinned(const TempDir& dir, const RemoteObject& o) {
  const std::string path = dir / ("objects/" + cache_key(o) + ".obj");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool held = ::flock(fd, LOCK_EX | LOCK_NB) != 0;
  ::close(fd);
  return held;
}

TEST(RemoteWindow, ALimitBelowTheLookAheadAndOneMoreIsAConfigErrorBeforeAnyRequest) {
  TempDir dir;
  std::vector<RemoteObject> objects;
  for (int i = 0; i < 5; ++i) objects.push_back(unreachable("o" + std::to_string(i), 300));
  const auto before = remote_request_counts().gets;
  try {
    RemoteWindow window(objects, 2, {.dir = dir.path(), .limit = 800}, fast_failing());
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
  EXPECT_NO_THROW(RemoteWindow(objects, 2, {.dir = dir.path(), .limit = 900}, fast_failing()));
  EXPECT_NO_THROW(
      RemoteWindow({objects[0], objects[1]}, 4, {.dir = dir.path(), .limit = 600}, fast_failing()));
}

TEST(RemoteWindow, ReadsInOrderHitTheCacheAndUnpinWhatTheyLeftBehind) {
  TempDir dir;
  std::vector<RemoteObject> objects;
  for (int i = 0; i < 6; ++i) {
    objects.push_back(unreachable("o" + std::to_string(i), 100));
    seed_copy(dir, objects.back(), static_cast<char>('a' + i));
  }
  const auto before = remote_request_counts().gets;
  {
    RemoteWindow window(objects, 2, {.dir = dir.path(), .limit = 300}, fast_failing());
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

TEST(RemoteWindow, ALimitThatHoldsTheSourceFetchesEveryFileFromTheFirstReadAndUnpinsNone) {
  // A global shuffle reads files at random: its first read, wherever it falls, starts the
  // download of every file (round from the front), and no copy is unpinned while reading.
  TempDir dir;
  std::vector<RemoteObject> objects;
  for (int i = 0; i < 6; ++i) {
    objects.push_back(unreachable("o" + std::to_string(i), 100));
    seed_copy(dir, objects.back(), static_cast<char>('a' + i));
  }
  RemoteWindow window(objects, 1, {.dir = dir.path(), .limit = 600}, fast_failing());
  EXPECT_EQ(static_cast<char>(window.data(4)[0]), 'e');
  // Lookahead 1, yet the downloaders take every file: all six end up pinned.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (window.fetches() < objects.size() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(window.fetches(), objects.size());
  for (const auto& o : objects) EXPECT_TRUE(pinned(dir, o));
  // Reads in any order on two threads are hits; nothing is fetched twice or unpinned.
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t)
    readers.emplace_back([&, t] {
      for (int i = 0; i < 600; ++i) {
        const std::size_t k = static_cast<std::size_t>((i * 5 + t) % 6);
        EXPECT_EQ(static_cast<char>(window.data(k)[99]), static_cast<char>('a' + k));
      }
    });
  for (auto& r : readers) r.join();
  EXPECT_EQ(window.fetches(), objects.size());
  for (const auto& o : objects) EXPECT_TRUE(pinned(dir, o));
}

TEST(RemoteWindow, ADownloadThatFailsIsADataErrorNamingTheUrl) {
  TempDir dir;
  RemoteWindow window({unreachable("gone", 100), unreachable("other", 100)}, 1,
                      {.dir = dir.path(), .limit = 1000}, fast_failing());
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

}  // namespace
}  // namespace flowstate
