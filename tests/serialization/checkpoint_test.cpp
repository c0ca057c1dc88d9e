// The on-disk checkpoint format (serialization/checkpoint.h): layout, verification of every
// file, fallback, crash debris, replacement and pruning.
// Over 600 lines: one API (checkpoint.h) whose every file and crash state has a case, all on
// one fixture; the multi-rank commit is in group_checkpoint_test.cpp.
#include "flowstate/serialization/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cctype>
#include <thread>

#include <nlohmann/json.hpp>

#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"
#include "flowstate/serialization/pipeline_state.h"
#include "tests/serialization/checkpoint_testing.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::checkpoint_error;
using ::testing::ElementsAre;
using testing::flip_byte;
using ::testing::HasSubstr;
using testing::list_dir;
using testing::read_file;
using testing::step_dir;
using testing::TempDir;
using testing::write_file;

/// A valid encoded PipelineState; `tag` varies the bytes.
std::string make_state(std::uint64_t tag, std::uint32_t format_version = 1) {
  PipelineState s;
  s.format_version = format_version;
  s.canonical = {{"seed", "1234"}, {"records", "records"}, {"batch.size", "32"}};
  s.fingerprint = fingerprint_of(s.canonical);
  s.last_step = tag;
  s.last_epoch = 0;
  s.spine = std::string(40, 'x') + std::to_string(tag);
  return s.encode();
}

std::string fingerprint_hex() { return hex64(PipelineState::decode(make_state(0)).fingerprint); }

class CheckpointFiles : public ::testing::Test {
 protected:
  std::string ckpt() const { return dir_ / "ckpt"; }
  std::string at(std::uint64_t step) const { return ckpt() + "/" + step_dir(step); }
  std::string state_bin(std::uint64_t step) const { return at(step) + "/state.bin"; }
  std::string manifest(std::uint64_t step) const { return at(step) + "/MANIFEST.json"; }
  std::string write(std::uint64_t step, const CheckpointWriteOptions& o = {}) {
    return write_checkpoint(ckpt(), step, make_state(step), o);
  }
  /// The error reading checkpoint `step` fails with.
  std::string read_error(std::uint64_t step) {
    return checkpoint_error([&] { read_checkpoint(at(step)); });
  }
  /// The manifest of `step` with `edit` applied (as JSON), written back.
  template <class F>
  void edit_manifest(std::uint64_t step, F&& edit) {
    auto j = nlohmann::ordered_json::parse(read_file(manifest(step)));
    edit(j);
    write_file(manifest(step), j.dump(2) + "\n");
  }

  TempDir dir_;
};

TEST_F(CheckpointFiles, WritesTheDocumentedLayout) {
  const std::string state = make_state(100);
  EXPECT_EQ(write_checkpoint(ckpt(), 100, state), at(100));
  EXPECT_EQ(list_dir(ckpt()), (std::set<std::string>{".lock", "LATEST", "step-000000000100"}));
  EXPECT_EQ(list_dir(at(100)), (std::set<std::string>{"MANIFEST.json", "state.bin"}));
  EXPECT_EQ(read_file(ckpt() + "/LATEST"), "step-000000000100\n");
  EXPECT_EQ(read_file(state_bin(100)), state);
  auto m = nlohmann::json::parse(read_file(manifest(100)));
  EXPECT_EQ(m["format"], "flowstate-checkpoint");
  EXPECT_EQ(m["format_version"], 1);
  EXPECT_EQ(m["step"], 100);
  EXPECT_EQ(m["fingerprint"], fingerprint_hex());
  ASSERT_EQ(m["files"].size(), 1u);
  EXPECT_EQ(m["files"][0]["name"], "state.bin");
  EXPECT_EQ(m["files"][0]["size"], state.size());
  EXPECT_EQ(m["files"][0]["xxh3_64"], hex64(hash64(state)));
}

TEST_F(CheckpointFiles, RoundTripsTheState) {
  write(7);
  CheckpointFound f = read_checkpoint(at(7));
  EXPECT_EQ(f.path, at(7));
  EXPECT_EQ(f.step, 7u);
  EXPECT_EQ(f.state, make_state(7));
  EXPECT_TRUE(f.skipped.empty());
  // A trailing slash names the same checkpoint.
  EXPECT_EQ(read_checkpoint(at(7) + "/").step, 7u);
  auto latest = find_latest_checkpoint(ckpt());
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->path, at(7));
  EXPECT_EQ(latest->state, make_state(7));
  EXPECT_TRUE(latest->skipped.empty());
}

TEST_F(CheckpointFiles, FindsTheNewestOfSeveral) {
  write(10);
  write(30);
  write(20, {.overwrite = true});
  // LATEST names the last one written (20), but it is only a hint: the newest step wins.
  EXPECT_EQ(read_file(ckpt() + "/LATEST"), step_dir(20) + "\n");
  EXPECT_EQ(find_latest_checkpoint(ckpt())->step, 30u);
  EXPECT_TRUE(find_latest_checkpoint(ckpt())->skipped.empty());
  std::filesystem::remove(ckpt() + "/LATEST");
  EXPECT_EQ(find_latest_checkpoint(ckpt())->step, 30u);
}

TEST_F(CheckpointFiles, ANewerValidStepWinsOverAnOlderLatest) {
  write(10);
  write(20);
  write_file(ckpt() + "/LATEST", step_dir(10) + "\n");  // stale, as after a power loss
  auto f = find_latest_checkpoint(ckpt());
  ASSERT_TRUE(f);
  EXPECT_EQ(f->step, 20u);
  EXPECT_TRUE(f->skipped.empty());
}

TEST_F(CheckpointFiles, RefusesToWriteBelowANewerCheckpointThatVerifies) {
  write(30);
  EXPECT_EQ(checkpoint_error([&] { write(20); }),
            "'" + ckpt() +
                "' holds checkpoints up to step 30, newer than this one (step 20); restore "
                "from it to continue that run, or write with overwrite to put an older step "
                "under it");
  EXPECT_EQ(list_dir(ckpt()), (std::set<std::string>{".lock", "LATEST", step_dir(30)}));
  // The same step, or a higher one, is fine; so is a newer checkpoint that does not verify.
  write(30);
  write(40);
  flip_byte(state_bin(40), 3);
  write(35);
  // overwrite writes below a valid one.
  write(20, {.overwrite = true});
  EXPECT_EQ(read_checkpoint(at(20)).state, make_state(20));
}

TEST_F(CheckpointFiles, EvidenceListsEverythingThatShowsCheckpointsWereWritten) {
  EXPECT_TRUE(find_checkpoint_evidence(ckpt()).empty());  // missing
  std::filesystem::create_directories(ckpt());
  write_file(ckpt() + "/.lock", "");
  write_file(ckpt() + "/notes.txt", "mine");
  EXPECT_TRUE(find_checkpoint_evidence(ckpt()).empty());  // nothing of a checkpoint's
  write_file(ckpt() + "/LATEST", step_dir(7700) + "\n");
  auto e = find_checkpoint_evidence(ckpt());
  EXPECT_THAT(e.entries, ElementsAre(ckpt() + "/LATEST: '" + ckpt() + "/LATEST' names '" +
                                     at(7700) + "', which does not exist"));
  EXPECT_EQ(e.highest_step, 7700u);
  std::filesystem::remove(ckpt() + "/LATEST");
  std::filesystem::create_directories(at(12) + ".tmp");
  e = find_checkpoint_evidence(ckpt());
  EXPECT_THAT(e.entries, ElementsAre(at(12) + ".tmp: '" + at(12) +
                                     ".tmp' is an unfinished checkpoint write or removal"));
  EXPECT_EQ(e.highest_step, 12u);
  write(5);  // (removes the debris)
  write(9);
  std::filesystem::remove(manifest(9));
  std::filesystem::create_directories(at(12) + ".tmp");
  e = find_checkpoint_evidence(ckpt());
  EXPECT_THAT(
      e.entries,
      ElementsAre(
          ckpt() + "/LATEST: '" + ckpt() + "/LATEST' names '" + at(9) + "'",
          at(12) + ".tmp: '" + at(12) + ".tmp' is an unfinished checkpoint write or removal",
          at(9) + ": '" + manifest(9) + "' is missing: the checkpoint is incomplete",
          at(5) + ": verifies"));
  EXPECT_EQ(e.highest_step, 12u);
}

TEST_F(CheckpointFiles, RemoveCheckpointsLeavesOnlyOtherFiles) {
  write(5);
  write(9);
  std::filesystem::create_directories(at(12) + ".tmp");
  write_file(ckpt() + "/notes.txt", "mine");
  remove_checkpoints(ckpt());
  EXPECT_EQ(list_dir(ckpt()), (std::set<std::string>{".lock", "notes.txt"}));
  EXPECT_TRUE(find_checkpoint_evidence(ckpt()).empty());
  remove_checkpoints(ckpt() + "/missing");  // not an error
  write(1);                                 // the directory is usable again from any step
  EXPECT_EQ(find_latest_checkpoint(ckpt())->step, 1u);
}

TEST_F(CheckpointFiles, NothingThereIsNotAnError) {
  EXPECT_FALSE(find_latest_checkpoint(ckpt()));  // does not exist
  std::filesystem::create_directories(ckpt());
  EXPECT_FALSE(find_latest_checkpoint(ckpt()));  // empty
  EXPECT_EQ(checkpoint_error([&] { read_checkpoint(at(3)); }), "'" + at(3) + "' does not exist");
}

TEST_F(CheckpointFiles, RefusesToWriteBytesThatAreNotAState) {
  EXPECT_EQ(checkpoint_error([&] { write_checkpoint(ckpt(), 1, "garbage"); }),
            "'state' is not a flowstate state (bad magic)");
  EXPECT_FALSE(std::filesystem::exists(ckpt()));
}

TEST_F(CheckpointFiles, HookSeesEveryPhaseInOrder) {
  std::vector<std::string> phases;
  CheckpointWriteOptions o;
  o.hook = [&](std::string_view p) { phases.emplace_back(p); };
  write(1, o);
  EXPECT_THAT(phases, ElementsAre("tmp-created", "state-written", "manifest-written", "renamed",
                                  "latest-written"));
  phases.clear();
  write(1, o);  // replacing an existing step adds one phase
  EXPECT_THAT(phases, ElementsAre("tmp-created", "state-written", "manifest-written", "moved-aside",
                                  "renamed", "latest-written"));
}

TEST_F(CheckpointFiles, AReaderAlwaysFindsAValidCheckpointDuringAWrite) {
  // At every phase of a write, a reader finds either the previous checkpoint or the new one,
  // complete, with nothing skipped.
  std::vector<std::string> seen;
  CheckpointWriteOptions o;
  o.hook = [&](std::string_view p) {
    auto f = find_latest_checkpoint(ckpt());
    ASSERT_TRUE(f) << p;
    EXPECT_TRUE(f->skipped.empty()) << p << ": " << f->skipped.front();
    seen.push_back(std::string(p) + " " + std::filesystem::path(f->path).filename().string());
  };
  write(1);
  write(2, o);
  EXPECT_THAT(seen, ElementsAre("tmp-created step-000000000001", "state-written step-000000000001",
                                "manifest-written step-000000000001",
                                "renamed step-000000000002",  // committed: LATEST is a hint
                                "latest-written step-000000000002"));
  seen.clear();
  // Replacing step 2: the old copy is found under its aside name while it is out of the way.
  write_checkpoint(ckpt(), 2, make_state(22), o);
  EXPECT_THAT(seen,
              ElementsAre("tmp-created step-000000000002", "state-written step-000000000002",
                          "manifest-written step-000000000002", "moved-aside step-000000000002.old",
                          "renamed step-000000000002", "latest-written step-000000000002"));
  EXPECT_EQ(read_checkpoint(at(2)).state, make_state(22));
  EXPECT_EQ(list_dir(ckpt()),
            (std::set<std::string>{".lock", "LATEST", "step-000000000001", "step-000000000002"}));
}

TEST_F(CheckpointFiles, AFailedWriteLeavesThePreviousCheckpointsAsTheyWere) {
  const std::vector<std::string> phases{"tmp-created", "state-written", "manifest-written",
                                        "moved-aside", "renamed",       "latest-written"};
  auto no_debris = [](const std::string& root) {
    for (const auto& name : list_dir(root)) {
      EXPECT_FALSE(name.ends_with(".tmp")) << name;
      EXPECT_FALSE(name.ends_with(".old")) << name;
    }
  };
  for (const auto& fail_at : phases) {
    SCOPED_TRACE("hook throws at " + fail_at);
    const bool committed = fail_at == "renamed" || fail_at == "latest-written";
    TempDir d;
    const std::string root = d / "ckpt";
    write_checkpoint(root, 1, make_state(1));
    write_checkpoint(root, 2, make_state(2));
    CheckpointWriteOptions o;
    o.overwrite = true;  // replacing step 2 below step 3
    o.hook = [&](std::string_view p) {
      if (p == fail_at) throw std::runtime_error("injected");
    };

    // A new step. ("moved-aside" only happens when a step is replaced.)
    if (fail_at == "moved-aside") {
      write_checkpoint(root, 3, make_state(3), o);
    } else {
      EXPECT_THROW(write_checkpoint(root, 3, make_state(3), o), std::runtime_error);
    }
    auto f = find_latest_checkpoint(root);
    ASSERT_TRUE(f);
    EXPECT_TRUE(f->skipped.empty());
    // Until the rename commits it, the reader stays on step 2.
    EXPECT_EQ(f->step, committed || fail_at == "moved-aside" ? 3u : 2u);
    EXPECT_EQ(std::filesystem::exists(root + "/" + step_dir(3)),
              committed || fail_at == "moved-aside");
    if (!committed) no_debris(root);

    // Replacing step 2.
    EXPECT_THROW(write_checkpoint(root, 2, make_state(22), o), std::runtime_error);
    EXPECT_EQ(read_checkpoint(root + "/" + step_dir(2)).state,
              committed ? make_state(22) : make_state(2));
    if (!committed) no_debris(root);

    // The next write cleans up whatever the failed ones left.
    write_checkpoint(root, 9, make_state(9));
    no_debris(root);
    EXPECT_EQ(read_checkpoint(root + "/" + step_dir(1)).state, make_state(1));
    EXPECT_EQ(read_checkpoint(root + "/" + step_dir(2)).state,
              committed ? make_state(22) : make_state(2));
  }
}

TEST_F(CheckpointFiles, ReplacesAnExistingStep) {
  write_checkpoint(ckpt(), 5, make_state(1));
  write_checkpoint(ckpt(), 5, make_state(2));
  EXPECT_EQ(read_checkpoint(at(5)).state, make_state(2));
  EXPECT_EQ(list_dir(ckpt()), (std::set<std::string>{".lock", "LATEST", "step-000000000005"}));
}

TEST_F(CheckpointFiles, RecoversFromAReplacementInterruptedByACrash) {
  // A writer died between moving the old step-5 aside and renaming the new one in.
  write(5);
  std::filesystem::rename(at(5), at(5) + ".old");
  auto f = find_latest_checkpoint(ckpt());
  ASSERT_TRUE(f);
  EXPECT_EQ(f->step, 5u);
  EXPECT_EQ(f->path, at(5) + ".old");
  EXPECT_TRUE(f->skipped.empty());  // an expected state, not damage
  // The next writer puts it back under its name.
  write(6);
  EXPECT_EQ(list_dir(ckpt()),
            (std::set<std::string>{".lock", "LATEST", "step-000000000005", "step-000000000006"}));
  EXPECT_EQ(read_checkpoint(at(5)).state, make_state(5));

  // It died after the new one was in place: the aside is simply removed.
  write_checkpoint(ckpt(), 6, make_state(66));
  testing::copy_tree(at(5), at(6) + ".old");
  write(7);
  EXPECT_EQ(read_checkpoint(at(6)).state, make_state(66));
  EXPECT_FALSE(std::filesystem::exists(at(6) + ".old"));
}

TEST_F(CheckpointFiles, IgnoresStaleTmpDirectoriesAndTheNextWriteRemovesThem) {
  write(10);
  // Debris of writers that died: a complete-looking newer checkpoint still under .tmp, a
  // half-written one, a LATEST.tmp, and a checkpoint being pruned.
  testing::copy_tree(at(10), at(50) + ".tmp");
  std::filesystem::create_directories(at(60) + ".tmp");
  write_file(at(60) + ".tmp/state.bin", "partial");
  write_file(ckpt() + "/LATEST.tmp", "step-000000000050\n");
  testing::copy_tree(at(10), at(3) + ".prune.tmp");
  auto f = find_latest_checkpoint(ckpt());
  ASSERT_TRUE(f);
  EXPECT_EQ(f->step, 10u);
  EXPECT_TRUE(f->skipped.empty());
  write(11);
  EXPECT_EQ(list_dir(ckpt()),
            (std::set<std::string>{".lock", "LATEST", "step-000000000010", "step-000000000011"}));
}

TEST_F(CheckpointFiles, KeepPrunesOlderCheckpointsAfterCommitting) {
  CheckpointWriteOptions keep2{.keep = 2};
  for (std::uint64_t s = 1; s <= 5; ++s) write(s, keep2);
  EXPECT_EQ(list_dir(ckpt()),
            (std::set<std::string>{".lock", "LATEST", "step-000000000004", "step-000000000005"}));
  // keep = 0 keeps everything.
  write(6);
  write(7);
  EXPECT_EQ(list_dir(ckpt()).size(), 2u + 4u);
  // Only checkpoints that verify count: a corrupt one is removed, not kept in place of a
  // good one.
  flip_byte(state_bin(6), 3);
  write(8, keep2);
  EXPECT_EQ(list_dir(ckpt()),
            (std::set<std::string>{".lock", "LATEST", "step-000000000007", "step-000000000008"}));
  flip_byte(state_bin(8), 3);  // the newest older one is damaged: step 7 is kept instead
  write(9, keep2);
  EXPECT_EQ(list_dir(ckpt()),
            (std::set<std::string>{".lock", "LATEST", "step-000000000007", "step-000000000009"}));
}

TEST_F(CheckpointFiles, KeepNeverRemovesTheNewCheckpointOrHigherSteps) {
  // A run resumed from step 20 while step 30 exists: the new step 25 must survive keep = 1,
  // and step 30 is left for the run to replace when it gets there.
  write(20);
  write(30);
  write(25, {.keep = 1, .overwrite = true});
  EXPECT_EQ(list_dir(ckpt()),
            (std::set<std::string>{".lock", "LATEST", "step-000000000025", "step-000000000030"}));
  EXPECT_EQ(find_latest_checkpoint(ckpt())->step, 30u);  // the newest step; LATEST says 25
}

// ---- damage: every file, every way ----

TEST_F(CheckpointFiles, DetectsATruncatedStateAtAnyLength) {
  write(1);
  const std::size_t size = make_state(1).size();
  for (std::size_t len : {std::size_t{0}, std::size_t{1}, std::size_t{8}, size / 2, size - 1}) {
    SCOPED_TRACE(len);
    testing::truncate_file(state_bin(1), len);
    EXPECT_EQ(read_error(1), "'" + state_bin(1) + "' is truncated: it has " + std::to_string(len) +
                                 " bytes, the manifest lists " + std::to_string(size));
  }
}

TEST_F(CheckpointFiles, DetectsAStateThatGrew) {
  write(1);
  const std::string bytes = make_state(1);
  write_file(state_bin(1), bytes + "x");
  EXPECT_EQ(read_error(1), "'" + state_bin(1) + "' has " + std::to_string(bytes.size() + 1) +
                               " bytes, the manifest lists " + std::to_string(bytes.size()));
}

TEST_F(CheckpointFiles, DetectsAFlippedByteAnywhereInTheState) {
  write(1);
  const std::string good = make_state(1);
  const std::string expected = hex64(hash64(good));
  for (std::size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x10);
    testing::overwrite_file(state_bin(1), bad);
    ASSERT_EQ(read_error(1), "'" + state_bin(1) + "' is corrupt: its XXH3-64 checksum is " +
                                 hex64(hash64(bad)) + ", the manifest lists " + expected)
        << "byte " << i;
  }
}

TEST_F(CheckpointFiles, DetectsAFlippedByteAnywhereInTheManifest) {
  write(1);
  const std::string good = read_file(manifest(1));
  // The writer's version is for people and never trusted: a flip that leaves it a version
  // ("flowstate 0.1.0" -> "flowstate 1.1.0") changes nothing restored. Every other flip, and
  // any that breaks its form, is an error.
  const std::size_t writer = good.find("\"flowstate ") + 11;
  for (unsigned char mask : {0x01, 0x20, 0x80}) {
    for (std::size_t i = 0; i < good.size(); ++i) {
      std::string bad = good;
      bad[i] = static_cast<char>(static_cast<unsigned char>(bad[i]) ^ mask);
      if (i >= writer && std::isdigit(static_cast<unsigned char>(good[i])) &&
          std::isdigit(static_cast<unsigned char>(bad[i])))
        continue;
      testing::overwrite_file(manifest(1), bad);
      std::string error = read_error(1);
      ASSERT_FALSE(error.empty()) << "byte " << i << " ^ " << int(mask) << " went unnoticed";
    }
  }
  write_file(manifest(1), good);
  EXPECT_EQ(read_checkpoint(at(1)).step, 1u);
}

TEST_F(CheckpointFiles, NamesWhatIsWrongWithADamagedManifest) {
  write(1);
  const std::string good = read_file(manifest(1));
  const std::string m = manifest(1);
  auto restore_good = [&] { write_file(m, good); };

  testing::truncate_file(m, good.size() / 2);
  EXPECT_THAT(read_error(1), HasSubstr("'" + m + "' is not valid JSON: "));
  restore_good();

  testing::truncate_file(m, 0);
  EXPECT_THAT(read_error(1), HasSubstr("'" + m + "' is not valid JSON: "));
  restore_good();

  edit_manifest(1, [](auto& j) { j["step"] = 2; });
  EXPECT_EQ(read_error(1), "'" + m + "' is for step 2, but '" + at(1) + "' is named for step 1");
  restore_good();

  edit_manifest(1, [](auto& j) { j["fingerprint"] = "00000000000000ff"; });
  EXPECT_EQ(read_error(1), "'" + m + "' lists fingerprint 00000000000000ff, but '" + state_bin(1) +
                               "' holds " + fingerprint_hex());
  restore_good();

  edit_manifest(1, [](auto& j) { j["fingerprint"] = "ABCDEF0123456789"; });
  EXPECT_EQ(read_error(1), "'" + m + "' is invalid: 'fingerprint' is not 16 lowercase hex digits");
  restore_good();

  edit_manifest(1, [](auto& j) { j["files"][0]["name"] = "../state.bin"; });
  EXPECT_EQ(read_error(1),
            "'" + m + "' is invalid: files[0] has an invalid file name '../state.bin'");
  restore_good();

  edit_manifest(1, [](auto& j) { j["files"][0]["name"] = "other.bin"; });
  EXPECT_EQ(read_error(1), "'" + m + "' is invalid: it does not list state.bin");
  restore_good();

  edit_manifest(1, [](auto& j) { j["stpe"] = j["step"]; });
  EXPECT_EQ(read_error(1), "'" + m + "' is invalid: it has an unknown key 'stpe'");
  restore_good();

  edit_manifest(1, [](auto& j) { j.erase("files"); });
  EXPECT_EQ(read_error(1), "'" + m + "' is invalid: it has no 'files'");
  restore_good();

  edit_manifest(1, [](auto& j) { j["format"] = "something-else"; });
  EXPECT_EQ(read_error(1), "'" + m + "' is invalid: 'format' is not \"flowstate-checkpoint\"");
  restore_good();

  EXPECT_EQ(read_checkpoint(at(1)).step, 1u);
}

TEST_F(CheckpointFiles, DetectsMissingFiles) {
  write(1);
  std::filesystem::remove(manifest(1));
  EXPECT_EQ(read_error(1), "'" + manifest(1) + "' is missing: the checkpoint is incomplete");
  write(2);
  std::filesystem::remove(state_bin(2));
  EXPECT_EQ(read_error(2), "'" + state_bin(2) + "' is missing");
}

TEST_F(CheckpointFiles, RefusesANewerManifestFormat) {
  write(1);
  edit_manifest(1, [](auto& j) {
    j["format_version"] = 3;
    j["something_new"] = true;  // a newer format may add anything: the version is checked first
  });
  EXPECT_EQ(read_error(1), "'" + manifest(1) +
                               "' has checkpoint format version 3, newer than this build's 2; "
                               "upgrade flowstate");
}

TEST_F(CheckpointFiles, RefusesANewerStateFormat) {
  // Written whole by a newer build: the files verify, but this build cannot decode the state.
  write(1);
  const std::string newer = make_state(1, /*format_version=*/3);
  write_file(state_bin(1), newer);
  edit_manifest(1, [&](auto& j) {
    j["files"][0]["size"] = newer.size();
    j["files"][0]["xxh3_64"] = hex64(hash64(newer));
  });
  EXPECT_EQ(read_error(1), "'" + state_bin(1) +
                               "' has state format version 3, newer than this build's 2; "
                               "upgrade flowstate");
}

TEST_F(CheckpointFiles, RefusesDirectoriesThatAreNotCheckpoints) {
  std::filesystem::create_directories(ckpt() + "/other");
  EXPECT_EQ(
      checkpoint_error([&] { read_checkpoint(ckpt() + "/other"); }),
      "'" + ckpt() + "/other' is not a checkpoint directory: its name is not step-NNNNNNNNNNNN");
  // Only the canonical spelling of a step is a checkpoint.
  write(1);
  std::filesystem::rename(at(1), ckpt() + "/step-1");
  EXPECT_FALSE(find_latest_checkpoint(ckpt()));
}

// ---- fallback ----

TEST_F(CheckpointFiles, FallsBackToTheNewestThatVerifiesAndSaysWhatItSkipped) {
  write(10);
  write(20);
  write(30);
  flip_byte(state_bin(30), 12);
  std::filesystem::remove(manifest(20));
  auto f = find_latest_checkpoint(ckpt());
  ASSERT_TRUE(f);
  EXPECT_EQ(f->step, 10u);
  EXPECT_EQ(f->state, make_state(10));
  ASSERT_EQ(f->skipped.size(), 2u);
  EXPECT_THAT(f->skipped[0],
              HasSubstr(at(30) + ": '" + state_bin(30) + "' is corrupt: its XXH3-64 checksum is "));
  EXPECT_EQ(f->skipped[1],
            at(20) + ": '" + manifest(20) + "' is missing: the checkpoint is incomplete");
}

TEST_F(CheckpointFiles, FallsBackWhenLatestIsGarbage) {
  write(10);
  write(20);
  write_file(ckpt() + "/LATEST", "\x01garbage\xff");
  auto f = find_latest_checkpoint(ckpt());
  ASSERT_TRUE(f);
  EXPECT_EQ(f->step, 20u);
  EXPECT_THAT(f->skipped, ElementsAre(ckpt() + "/LATEST: '" + ckpt() +
                                      "/LATEST' does not name a checkpoint: "
                                      "\"\\x01garbage\\xff\""));

  write_file(ckpt() + "/LATEST", "step-000000000099\n");
  f = find_latest_checkpoint(ckpt());
  ASSERT_TRUE(f);
  EXPECT_EQ(f->step, 20u);
  EXPECT_THAT(f->skipped, ElementsAre(ckpt() + "/LATEST: '" + ckpt() + "/LATEST' names '" + at(99) +
                                      "', which does not exist"));

  write_file(ckpt() + "/LATEST", "");
  EXPECT_THAT(find_latest_checkpoint(ckpt())->skipped,
              ElementsAre(HasSubstr("does not name a checkpoint: \"\"")));
}

TEST_F(CheckpointFiles, FindsNothingWhenNothingVerifies) {
  write(1);
  write(2);
  testing::truncate_file(state_bin(1), 3);
  std::filesystem::remove(manifest(2));
  EXPECT_FALSE(find_latest_checkpoint(ckpt()));
}

TEST_F(CheckpointFiles, ConcurrentWritersToOneDirectoryDoNotCorruptIt) {
  // The directory lock serializes writers: one's clean-up never removes another's work.
  constexpr std::uint64_t kPerThread = 6;
  auto writer = [&](std::uint64_t base) {
    // (overwrite: the two writers' steps interleave.)
    for (std::uint64_t i = 0; i < kPerThread; ++i) write(base + i, {.keep = 3, .overwrite = true});
  };
  std::thread a(writer, 100), b(writer, 200);
  a.join();
  b.join();
  auto names = list_dir(ckpt());
  names.erase(".lock");
  names.erase("LATEST");
  EXPECT_LE(names.size(), 2u * 3u);  // each writer prunes below its own commit
  for (const auto& n : names) EXPECT_EQ(read_checkpoint(ckpt() + "/" + n).path, ckpt() + "/" + n);
  auto f = find_latest_checkpoint(ckpt());
  ASSERT_TRUE(f);
  EXPECT_TRUE(f->skipped.empty());
}

}  // namespace
}  // namespace flowstate
