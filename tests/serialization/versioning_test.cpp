// Checkpoints written by other versions of flowstate, kept as small fixtures (see
// fixtures/README.md for what each holds and how it was made).
//
// The fixtures' pipeline reads "data/part-*.bin", a relative path (the fingerprint holds the
// paths as written), so each test runs in a fresh directory holding those records.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "flowstate/config/inspect.h"
#include "flowstate/config/yaml.h"
#include "flowstate/core/error.h"
#include "flowstate/core/version.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"
#include "flowstate/serialization/checkpoint.h"
#include "tests/serialization/checkpoint_testing.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::BatchTrace;
using testing::checkpoint_error;
using testing::drain;
using testing::TempDir;

const std::string kFixtures = FLOWSTATE_FIXTURES_DIR;

/// The pipeline every fixture was saved from, after 10 batches (so with a shuffle key-frame).
Pipeline fixture_pipeline() {
  return Pipeline::Builder()
      .seed(99)
      .workers(2)
      .records({.paths = {"data/part-*.bin"}, .record_bytes = 16})
      .shuffle({.mode = ShuffleMode::kBuffer, .size = 64})
      .batch({.size = 16})
      .build();
}

class StateVersions : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::write_records(dir_ / "data", 600, 16, 2);
    Loader l(fixture_pipeline(), options_);
    full_ = drain(l);
    ASSERT_EQ(full_.size(), 76u);
  }
  /// Restores fixture `name` and checks the run continues exactly after its step 10.
  void expect_resumes_exactly(const std::string& name) {
    Loader l(fixture_pipeline(), options_);
    auto found = l.restore(kFixtures + "/" + name);
    ASSERT_TRUE(found);
    EXPECT_EQ(found->step, 10u);
    EXPECT_TRUE(found->skipped.empty());
    auto rest = drain(l);
    EXPECT_EQ(rest, std::vector<BatchTrace>(full_.begin() + 10, full_.end()));
  }

  TempDir dir_;
  testing::ChangeDirectory cwd_{dir_.str()};
  LoaderOptions options_{.epochs = 2};
  std::vector<BatchTrace> full_;
};

TEST_F(StateVersions, LoadsACheckpointOfTheCurrentVersions) {
  // Every state struct at version 1. If this fails, a struct's layout changed without a
  // version bump and a version branch: old checkpoints would no longer load.
  expect_resumes_exactly("current-v1");
}

TEST_F(StateVersions, LoadsACheckpointOfTheEntryStampFormat) {
  // Node states as length-prefixed entries (the node API's stamp), written by `flowstate run`
  // from the YAML form of the same pipeline.
  expect_resumes_exactly("entries-v1");
}

TEST_F(StateVersions, LoadsAMixStateOfVersionOne) {
  // MixState version 1 saved every input's nodes; version 2 leaves out the inputs not pulled
  // since their epoch started (issue 26). A version-1 checkpoint of a three-input mix, written
  // by `flowstate run` of fixtures/mix-v1/pipeline/mix.yaml, still resumes exactly.
  for (const char* f : {"mix.yaml", "in_a.yaml", "in_b.yaml", "in_c.yaml"})
    std::filesystem::copy_file(kFixtures + "/mix-v1/pipeline/" + f, dir_ / f);
  const Pipeline p = from_yaml_file(dir_ / "mix.yaml");
  Loader full(p, options_);
  const auto all = drain(full);
  ASSERT_GT(all.size(), 10u);
  Loader l(p, options_);
  auto found = l.restore(kFixtures + "/mix-v1");
  ASSERT_TRUE(found);
  EXPECT_EQ(found->step, 10u);
  EXPECT_EQ(drain(l), std::vector<BatchTrace>(all.begin() + 10, all.end()));
  // inspect decodes it: every input's nodes are there.
  const auto state =
      PipelineState::decode(read_checkpoint(kFixtures + "/mix-v1/step-000000000010").state);
  const auto nodes =
      nlohmann::json::parse(describe_node_states(state.spine, state.canonical, "mix-v1"));
  ASSERT_EQ(nodes[0]["state"]["inputs"].size(), 3u);
  EXPECT_EQ(nodes[0]["state"]["inputs"][1]["taken"], 93);
  EXPECT_EQ(nodes[0]["state"]["inputs"][1]["nodes"][1]["state"]["cursor"], 93);
}

TEST_F(StateVersions, InspectReadsBothStampFormatsThroughTheNodeDefinitions) {
  for (const std::string name : {"current-v1", "entries-v1"}) {
    SCOPED_TRACE(name);
    const auto found = read_checkpoint(kFixtures + "/" + name + "/step-000000000010");
    const PipelineState s = PipelineState::decode(found.state);
    const auto nodes = nlohmann::json::parse(describe_node_states(s.spine, s.canonical, name));
    ASSERT_EQ(nodes.size(), 3u);
    EXPECT_EQ(nodes[0]["name"], "records");
    EXPECT_EQ(nodes[0]["state"]["cursor"], 0);
    EXPECT_EQ(nodes[1]["type"], "shuffle");
    EXPECT_EQ(nodes[1]["state"]["draws"], 160);
    EXPECT_EQ(nodes[1]["state"]["keyframe"]["draws"], 128);
    EXPECT_EQ(nodes[2]["state"]["next_step"], 10);
  }
}

TEST_F(StateVersions, InspectShowsANodeOfAnUnknownTypeBySize) {
  // A registry without the shuffle (as a pipeline whose plugin is not loaded): its entry is
  // shown by size and the nodes after it are still decoded.
  Registry without;
  for (const auto& n : Registry::builtin().nodes())
    if (n.type != "shuffle") without.add(n);
  const auto found = read_checkpoint(kFixtures + "/entries-v1/step-000000000010");
  const PipelineState s = PipelineState::decode(found.state);
  const auto nodes =
      nlohmann::json::parse(describe_node_states(s.spine, s.canonical, "entries-v1", without));
  ASSERT_EQ(nodes.size(), 3u);
  EXPECT_EQ(nodes[1]["unknown_type"], true);
  EXPECT_GT(nodes[1]["state_bytes"].get<int>(), 0);
  EXPECT_EQ(nodes[2]["state"]["next_step"], 10);
}

TEST_F(StateVersions, WritesTheManifestFormatTheFixtureHas) {
  // The manifest of the same state written today is the committed one plus the line that
  // names its writer (manifests without it, like the fixture's, still restore).
  const std::string fixture = kFixtures + "/current-v1/step-000000000010";
  auto found = read_checkpoint(fixture);
  TempDir out;
  write_checkpoint(out.str(), 10, found.state);
  const std::string written = testing::read_file(out / "step-000000000010/MANIFEST.json");
  std::string expected = testing::read_file(fixture + "/MANIFEST.json");
  ASSERT_EQ(expected.substr(expected.size() - 3), "\n}\n");
  expected.insert(expected.size() - 3,
                  std::string(",\n  \"writer\": \"flowstate ") + version() + "\"");
  EXPECT_EQ(written, expected);
  EXPECT_EQ(testing::read_file(out / "LATEST"),
            testing::read_file(kFixtures + "/current-v1/LATEST"));
}

// The two tests below need a version branch in the nodes' serialize (the diff for
// nodes/shuffle.cpp and nodes/sources/records.h is in the review notes of this change); enable
// them with it. Today the shuffle fixture fails as a corrupt key-frame and the records fixture
// as "node states are truncated or corrupt" — a CheckpointError, loader unchanged, but not
// the precise behaviour asked for.
TEST_F(StateVersions, LoadsAShuffleStateOfVersionZero) {
  // Version 0 of BufferShuffleState stored its key-frame as a plain vector of positions.
  expect_resumes_exactly("shuffle-v0");
}

TEST_F(StateVersions, RefusesANewerRecordsStateAndSaysWhy) {
  Loader l(fixture_pipeline(), options_);
  auto before = drain(l, 3);
  EXPECT_EQ(checkpoint_error([&] { l.restore(kFixtures + "/records-v2"); }),
            "cannot restore " + kFixtures +
                "/records-v2/step-000000000010: CursorState version 2 is newer than this "
                "build's 1; upgrade flowstate");
  auto rest = drain(l);
  before.insert(before.end(), rest.begin(), rest.end());
  EXPECT_EQ(before, full_);
}

TEST_F(StateVersions, ANewerStateIsRefusedWithoutChangingTheLoader) {
  // Whatever the message, a state this build cannot read is never half-loaded.
  Loader l(fixture_pipeline(), options_);
  auto before = drain(l, 3);
  EXPECT_THAT(
      checkpoint_error([&] { l.restore(kFixtures + "/records-v2"); }),
      ::testing::StartsWith("cannot restore " + kFixtures + "/records-v2/step-000000000010: "));
  EXPECT_EQ(l.last_step(), 2u);
  auto rest = drain(l);
  before.insert(before.end(), rest.begin(), rest.end());
  EXPECT_EQ(before, full_);
}

}  // namespace
}  // namespace flowstate
