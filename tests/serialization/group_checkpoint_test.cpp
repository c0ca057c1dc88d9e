// Checkpoints of many ranks (issue 12): one step-N holding every rank's part, committed only
// when every part is durable, and a collective restore that agrees on the newest step every
// rank verifies. The ranks are threads here (testing::ThreadGroup); tests/mpi runs processes
// under mpirun.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"
#include "flowstate/serialization/checkpoint.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::TempDir;
using testing::ThreadGroup;

constexpr std::uint64_t kWorld = 3;

class GroupCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override { glob_ = testing::write_records(dir_ / "data", 1000, 16, 2); }
  Pipeline pipeline(std::uint64_t rank, std::uint64_t world = kWorld) const {
    return Pipeline::Builder()
        .seed(5)
        .records({.paths = {glob_}, .record_bytes = 16})
        .shard({.rank = rank, .world = world})
        .shuffle({})
        .batch({.size = 20})
        .build();
  }
  /// Digests of rank `r`'s batches from `loader` on.
  static std::vector<std::uint64_t> digests(Loader& loader) {
    std::vector<std::uint64_t> out;
    while (auto b = loader.next()) out.push_back(b->digest());
    return out;
  }
  std::string ck() const { return dir_ / "ck"; }
  static void expect_no_errors(const std::vector<std::string>& errors) {
    for (std::size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  }

  TempDir dir_;
  std::string glob_;
};

TEST_F(GroupCheckpoint, CommitsEveryRanksPartInOneStepAndResumesExactly) {
  std::vector<std::vector<std::uint64_t>> full(kWorld);
  for (std::uint64_t r = 0; r < kWorld; ++r) {
    Loader l(pipeline(r), {.epochs = 2});
    full[r] = digests(l);
  }
  ThreadGroup group(kWorld);
  expect_no_errors(group.run([&](std::uint64_t r, std::shared_ptr<Coordinator> c) {
    Loader l(pipeline(r), {.epochs = 2, .coordinator = c});
    for (int i = 0; i < 7; ++i) l.next();
    EXPECT_EQ(l.save_checkpoint(ck()), ck() + "/step-000000000007");
    for (int i = 0; i < 5; ++i) l.next();
    l.save_checkpoint_async(ck()).get();
  }));
  for (const char* name : {"MANIFEST.json", "rank-00000.bin", "rank-00001.bin", "rank-00002.bin"})
    EXPECT_TRUE(std::filesystem::exists(ck() + "/step-000000000012/" + name)) << name;
  expect_no_errors(group.run([&](std::uint64_t r, std::shared_ptr<Coordinator> c) {
    Loader l(pipeline(r), {.epochs = 2, .coordinator = c});
    auto found = l.restore(ck());
    ASSERT_TRUE(found);
    EXPECT_EQ(found->step, 12u);
    EXPECT_EQ(found->world, kWorld);
    EXPECT_EQ(digests(l), std::vector<std::uint64_t>(full[r].begin() + 12, full[r].end()));
  }));
}

TEST_F(GroupCheckpoint, ARankThatFailsItsPartCommitsNothingAndAllRanksSayWhy) {
  ThreadGroup group(kWorld);
  const auto errors = group.run([&](std::uint64_t r, std::shared_ptr<Coordinator> c) {
    Loader l(pipeline(r), {.coordinator = c});
    l.next();
    l.save_checkpoint(ck());
    l.next();
    CheckpointWriteOptions o;
    if (r == 1)
      o.hook = [](std::string_view phase) {
        if (phase == "part-written") throw CheckpointError("disk", "the disk is full");
      };
    l.save_checkpoint(ck(), o);
  });
  const std::string expected =
      "checkpoint '" + ck() + "/step-000000000002' failed: rank 1: the disk is full";
  for (std::uint64_t r = 0; r < kWorld; ++r) EXPECT_EQ(errors[r], expected) << "rank " << r;
  EXPECT_FALSE(std::filesystem::exists(ck() + "/step-000000000002"));
  EXPECT_FALSE(std::filesystem::exists(ck() + "/step-000000000002.tmp"));
  EXPECT_EQ(find_latest_checkpoint(ck())->step, 1u);
}

TEST_F(GroupCheckpoint, RestoreAgreesOnTheNewestStepEveryRankVerifies) {
  ThreadGroup group(kWorld);
  expect_no_errors(group.run([&](std::uint64_t r, std::shared_ptr<Coordinator> c) {
    Loader l(pipeline(r), {.coordinator = c});
    for (int step : {5, 10}) {
      while (!l.last_step() || *l.last_step() + 1 < static_cast<std::uint64_t>(step)) l.next();
      l.save_checkpoint(ck());
    }
  }));
  // Rank 2's part of step 10 is damaged: only rank 2 cannot verify it, so every rank takes 5.
  {
    std::fstream f(ck() + "/step-000000000010/rank-00002.bin",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('\x7f');
  }
  std::vector<std::uint64_t> steps(kWorld);
  expect_no_errors(group.run([&](std::uint64_t r, std::shared_ptr<Coordinator> c) {
    Loader l(pipeline(r), {.coordinator = c});
    steps[r] = l.restore(ck())->step;
  }));
  EXPECT_EQ(steps, (std::vector<std::uint64_t>{5, 5, 5}));
}

TEST_F(GroupCheckpoint, WhenARankVerifiesNoStepItsReasonsReachEveryRanksError) {
  ThreadGroup group(kWorld);
  expect_no_errors(group.run([&](std::uint64_t r, std::shared_ptr<Coordinator> c) {
    Loader l(pipeline(r), {.coordinator = c});
    for (int step : {5, 10}) {
      while (!l.last_step() || *l.last_step() + 1 < static_cast<std::uint64_t>(step)) l.next();
      l.save_checkpoint(ck());
    }
  }));
  // Rank 1's part of every step is damaged: the directory is shared, its parts fail their
  // checksums, and the error says so for rank 1 (not that the directory must be shared).
  for (const char* step : {"step-000000000005", "step-000000000010"}) {
    std::fstream f(ck() + "/" + step + "/rank-00001.bin",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('\x7f');
  }
  const auto errors = group.run([&](std::uint64_t r, std::shared_ptr<Coordinator> c) {
    Loader l(pipeline(r), {.coordinator = c});
    l.restore(ck());
  });
  for (std::uint64_t r = 0; r < kWorld; ++r) {
    const std::string& e = errors[r];
    EXPECT_EQ(e, errors[0]) << "rank " << r;
    EXPECT_EQ(e.find("shared by every rank"), std::string::npos) << e;
    EXPECT_NE(e.find("verifies on every rank:\n  rank 0 verifies steps 10, 5\n  rank 1 verifies "
                     "no step; it refuses:\n    " +
                     ck() + "/step-000000000010: '" + ck() +
                     "/step-000000000010/rank-00001.bin' is corrupt: its XXH3-64 checksum is "),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("\n    " + ck() + "/step-000000000005: '" + ck() +
                     "/step-000000000005/rank-00001.bin' is corrupt: its XXH3-64 checksum is "),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("\n  rank 2 verifies steps 10, 5"), std::string::npos) << e;
  }
}

TEST_F(GroupCheckpoint, AJobHoldsItsDirectoryOnceAndASecondJobIsRefusedOnEveryRank) {
  // One job's ranks share the directory: rank 0 holds it for them all, none refuses another.
  ThreadGroup group(kWorld);
  std::vector<int> holds(kWorld);
  expect_no_errors(group.run([&](std::uint64_t r, std::shared_ptr<Coordinator> c) {
    holds[r] = hold_checkpoint_directory(ck(), c.get()).has_value() ? 1 : 0;
  }));
  EXPECT_EQ(holds, (std::vector<int>{1, 0, 0}));

  // Another process (another job) holds it: every rank of this job is refused alike, naming it.
  int ready[2], done[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(done), 0);
  const pid_t holder = ::fork();
  ASSERT_GE(holder, 0);
  if (holder == 0) {
    RunLock lock(ck() + "/.run.lock", "ck");
    char c = 1;
    if (::write(ready[1], &c, 1) != 1 || ::read(done[0], &c, 1) < 0) ::_exit(1);
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  const auto errors = group.run([&](std::uint64_t, std::shared_ptr<Coordinator> c) {
    hold_checkpoint_directory(ck(), c.get());
  });
  for (std::uint64_t r = 0; r < kWorld; ++r)
    EXPECT_EQ(errors[r], "rank 0: checkpoint directory '" + ck() +
                             "' is in use by another run (pid " + std::to_string(holder) +
                             ", which holds the lock '" + ck() +
                             "/.run.lock'): two runs writing one directory would overwrite each "
                             "other's checkpoints; wait for that run to end, or give this one "
                             "another directory")
        << "rank " << r;
  // Its end (a SIGKILL) releases it.
  ::kill(holder, SIGKILL);
  int status = 0;
  ::waitpid(holder, &status, 0);
  expect_no_errors(group.run([&](std::uint64_t, std::shared_ptr<Coordinator> c) {
    hold_checkpoint_directory(ck(), c.get());
  }));
  for (int fd : {ready[0], ready[1], done[0], done[1]}) ::close(fd);
}

TEST_F(GroupCheckpoint, NodeLocalDirectoriesAreRefused) {
  ThreadGroup group(kWorld);
  // Each rank given a directory of its own, as a node-local path per host would be.
  const auto errors = group.run([&](std::uint64_t r, std::shared_ptr<Coordinator> c) {
    Loader l(pipeline(r), {.coordinator = c});
    l.next();
    l.save_checkpoint(dir_ / ("local-" + std::to_string(r)));
  });
  for (std::uint64_t r = 0; r < kWorld; ++r)
    EXPECT_NE(errors[r].find("rank 1: rank 1 cannot see '" + (dir_ / "local-1") +
                             "/step-000000000001.tmp', which rank 0 created: the checkpoint "
                             "directory must be one directory shared by every rank"),
              std::string::npos)
        << errors[r];
  // Restoring where only rank 0 sees checkpoints: the same error on every rank.
  expect_no_errors(group.run([&](std::uint64_t r, std::shared_ptr<Coordinator> c) {
    Loader l(pipeline(r), {.coordinator = c});
    l.next();
    l.save_checkpoint(ck());
  }));
  const auto restore_errors = group.run([&](std::uint64_t r, std::shared_ptr<Coordinator> c) {
    Loader l(pipeline(r), {.coordinator = c});
    l.restore(r == 0 ? ck() : dir_ / ("empty-" + std::to_string(r)));
  });
  // The same words on every rank (the directory named is each rank's own here).
  auto words = [](const std::string& e) { return e.substr(e.find(" verifies on every rank")); };
  for (std::uint64_t r = 0; r < kWorld; ++r)
    EXPECT_EQ(words(restore_errors[r]), words(restore_errors[0])) << "rank " << r;
  EXPECT_NE(restore_errors[0].find("verifies on every rank (the directory must be one directory "
                                   "shared by every rank):\n  rank 0 verifies steps 1\n  rank 1 "
                                   "verifies no step\n  rank 2 verifies no step"),
            std::string::npos)
      << restore_errors[0];
}

TEST_F(GroupCheckpoint, AWorldChangeInThePerRankLayoutFailsOnEveryRank) {
  ThreadGroup three(3);
  expect_no_errors(three.run([&](std::uint64_t r, std::shared_ptr<Coordinator> c) {
    Loader l(pipeline(r), {.coordinator = c});
    l.next();
    l.save_checkpoint(ck());
  }));
  ThreadGroup two(2);
  const auto errors = two.run([&](std::uint64_t r, std::shared_ptr<Coordinator> c) {
    Loader l(pipeline(r, 2), {.coordinator = c});
    l.restore(ck());
  });
  ASSERT_EQ(errors[0], errors[1]);
  EXPECT_NE(errors[0].find("rank 0: cannot restore " + ck() + "/step-000000000001: "),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[0].find("shard.world: 3 in checkpoint, 2 now"), std::string::npos) << errors[0];
}

}  // namespace
}  // namespace flowstate
