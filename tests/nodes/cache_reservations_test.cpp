// What the processes of one machine reserve of a shared cache directory
// (nodes/sources/cache_reservations.h), with real processes: a forked child holds remote
// sources over the directory while the test builds others beside it. A reservation another
// process holds counts until that process dies — by SIGKILL too — and a look-ahead that does
// not fit beside it is a ConfigError at build naming the other process; range readers of the
// same objects share their blocks (counted once), those of other objects do not.
#include "flowstate/nodes/sources/cache_reservations.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "flowstate/core/error.h"
#include "flowstate/nodes/sources/remote_blocks.h"
#include "flowstate/nodes/sources/remote_window.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::fast_failing_remote;
using testing::TempDir;
using testing::unreachable_object;

std::vector<RemoteObject> objects(const std::string& prefix, int n, std::uint64_t size) {
  std::vector<RemoteObject> out;
  for (int i = 0; i < n; ++i) out.push_back(unreachable_object(prefix + std::to_string(i), size));
  return out;
}

/// A child process that runs `hold` (making sources it keeps) and then waits to be killed.
class Holder {
 public:
  explicit Holder(const std::function<void()>& hold) {
    int ready[2];
    if (::pipe(ready) != 0) throw std::runtime_error("pipe");
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork");
    if (pid_ == 0) {
      ::close(ready[0]);
      char ok = 1;
      try {
        hold();
      } catch (...) {
        ok = 0;
      }
      (void)::write(ready[1], &ok, 1);
      for (;;) ::pause();  // holds what `hold` made until killed
    }
    ::close(ready[1]);
    char ok = 0;
    const bool got = ::read(ready[0], &ok, 1) == 1;
    ::close(ready[0]);
    if (!got || ok != 1) {
      kill();
      throw std::runtime_error("the holder failed to build its sources");
    }
  }
  ~Holder() { kill(); }
  pid_t pid() const { return pid_; }
  /// SIGKILL: nothing of the child's runs after it.
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = 0;
  }

 private:
  pid_t pid_ = 0;
};

/// The directory's other processes are `pid` alone, with one claim: `want`.
void expect_one_claim(const TempDir& dir, pid_t pid, const CacheClaim& want) {
  const auto others = other_reservations(dir.path());
  ASSERT_EQ(others.size(), 1u);
  EXPECT_EQ(others[0].pid, pid);
  ASSERT_EQ(others[0].claims.size(), 1u);
  EXPECT_EQ(others[0].claims[0].bytes, want.bytes);
  EXPECT_EQ(others[0].claims[0].share, want.share);
}

std::string config_error(const std::function<void()>& build) {
  try {
    build();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "FLOWSTATE_CACHE_LIMIT");
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError";
  return "";
}

TEST(CacheReservations, SharesCountOnceAndTheCallersOwnShareNotAtAll) {
  const std::vector<ProcessReservation> others = {
      {.pid = 10, .claims = {{.bytes = 100}, {.bytes = 1000, .share = "a"}}},
      {.pid = 11, .claims = {{.bytes = 900, .share = "a"}, {.bytes = 50, .share = "b"}}},
      {.pid = 12, .claims = {{.bytes = 7}}}};
  EXPECT_EQ(reserved_bytes(others), 100u + 1000 + 50 + 7);
  EXPECT_EQ(reserved_bytes(others, "a"), 100u + 50 + 7);
  EXPECT_EQ(describe_other_processes(others),
            "3 other processes on this machine (pid 10: 1100 bytes, pid 11: 950 bytes, pid 12: "
            "7 bytes)");
  EXPECT_EQ(objects_share(objects("x", 3, 10), 4096), objects_share(objects("x", 3, 10), 4096));
  EXPECT_NE(objects_share(objects("x", 3, 10), 4096), objects_share(objects("y", 3, 10), 4096));
  EXPECT_NE(objects_share(objects("x", 3, 10), 4096), objects_share(objects("x", 3, 10), 8192));
}

TEST(CacheReservations, AnotherProcesssLookAheadCountsUntilItIsKilled) {
  TempDir dir;
  const CacheSettings cache{.dir = dir.path(), .limit = 500};
  const auto a = objects("a", 4, 100), b = objects("b", 4, 100);
  Holder holder([&] { new RemoteWindow(a, 2, cache, fast_failing_remote()); });  // reserves 300
  expect_one_claim(dir, holder.pid(), {.bytes = 300});
  // Alone, this window's 300 bytes fit the 500; beside the other process's 300, not.
  const std::string m = config_error([&] { RemoteWindow(b, 2, cache, fast_failing_remote()); });
  EXPECT_NE(m.find("the cache limit 500 bytes of '" + dir.path().string() +
                   "' is smaller than the 600 bytes the look-ahead windows of 1 remote sources "
                   "of this process reserve together (300 bytes for this one's lookahead of 2 "
                   "files and one more, 0 bytes for 0 others) with the 300 bytes that 1 other "
                   "process on this machine (pid " +
                   std::to_string(holder.pid()) +
                   ": 300 bytes) reserve of it; raise FLOWSTATE_CACHE_LIMIT, lower the "
                   "sources' lookahead or give each process a cache directory of its own"),
            std::string::npos)
      << m;
  EXPECT_NO_THROW(RemoteWindow(b, 1, cache, fast_failing_remote()));  // 200 + 300 fit
  // The kernel lets go of a killed process's lock: its reservation no longer counts, and the
  // next reservation removes its file.
  const auto file = dir.path() / "reservations" / std::to_string(holder.pid());
  EXPECT_TRUE(std::filesystem::exists(file));
  holder.kill();
  EXPECT_TRUE(other_reservations(dir.path()).empty());
  EXPECT_NO_THROW(RemoteWindow(b, 3, cache, fast_failing_remote()));  // 400 of 500
  EXPECT_FALSE(std::filesystem::exists(file));
}

TEST(CacheReservations, RangeReadersOfTheSameObjectsShareTheirBlocksAcrossProcesses) {
  TempDir dir;
  constexpr std::uint64_t kMiB = 1 << 20;
  const CacheSettings cache{.dir = dir.path(), .limit = 4 * kMiB};
  const auto same = objects("s", 3, kMiB), other = objects("o", 3, kMiB);
  // The other process holds every block of `same` (3 MiB of the 4).
  Holder holder([&] { new RemoteBlocks(same, 1, kMiB, cache, fast_failing_remote()); });
  expect_one_claim(dir, holder.pid(), {.bytes = 3 * kMiB, .share = objects_share(same, kMiB)});
  {
    // The same objects: the same copies, counted once; this reader holds them all too.
    RemoteBlocks reader(same, 1, kMiB, cache, fast_failing_remote());
    EXPECT_TRUE(reader.holds_all());
  }
  // Other objects: 1 MiB of room beside the other process's 3, less than a look-ahead of one
  // block and one more.
  const std::string m =
      config_error([&] { RemoteBlocks(other, 1, kMiB, cache, fast_failing_remote()); });
  EXPECT_NE(m.find("the cache limit 4194304 bytes (4.00 MiB) of '" + dir.path().string() +
                   "' (less the 3145728 bytes (3.00 MiB) that 1 other process on this machine "
                   "(pid " +
                   std::to_string(holder.pid()) +
                   ": 3145728 bytes (3.00 MiB)) reserve of it) is smaller than the 2097152 "
                   "bytes (2.00 MiB) of the blocks the look-ahead holds together"),
            std::string::npos)
      << m;
  holder.kill();
  RemoteBlocks reader(other, 1, kMiB, cache, fast_failing_remote());
  EXPECT_TRUE(reader.holds_all());
}

}  // namespace
}  // namespace flowstate
