// End to end: a `lines` source and a `tar` source, mixed, filtered, packed and batched —
// built in C++ and from YAML — resume exactly at every breakpoint, across epochs, with
// different worker counts.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "flowstate/config/yaml.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"
#include "tests/support/formats.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::TempDir;

/// A document of `n` lowercase letters drawn from (seed, i).
std::string document(std::uint64_t seed, std::uint64_t i) {
  const std::size_t n = (seed * 31 + i * 17) % 23;  // 0..22 letters: some are filtered out
  std::string s;
  for (std::size_t j = 0; j < n; ++j) s.push_back(static_cast<char>('a' + (i * 7 + j * 3) % 26));
  return s;
}

class MixedFormats : public ::testing::Test {
 protected:
  void SetUp() override {
    // Two text shards (CRLF in one, no final newline in the other) ...
    for (int f = 0; f < 2; ++f) {
      std::vector<std::string> lines;
      for (std::uint64_t i = 0; i < 45; ++i) lines.push_back(document(f, i));
      testing::write_lines(dir_ / ("docs-" + std::to_string(f) + ".txt"), lines,
                           {.crlf = f == 0, .final_newline = f == 0});
    }
    // ... and three WebDataset shards whose samples hold tokens and a label.
    for (int f = 0; f < 3; ++f) {
      std::vector<testing::TarEntry> members;
      for (std::uint64_t i = 0; i < 20; ++i) {
        const std::string key = "s" + std::to_string(f) + "_" + std::to_string(i);
        members.push_back({key + ".tokens", document(10 + f, i)});
        members.push_back({key + ".cls", std::to_string(i % 3)});
      }
      testing::write_tar(dir_ / ("shard-" + std::to_string(f) + ".tar"), members);
    }
    write(dir_ / "lines_input.yaml",
          "seed: 3\nsource: {type: lines, paths: 'docs-*.txt', field: tokens}\n"
          "nodes:\n  - shuffle: {mode: global}\n");
    write(dir_ / "tar_input.yaml",
          "seed: 4\nsource: {type: tar, paths: 'shard-*.tar', fields: [tokens]}\n"
          "nodes:\n  - shuffle: {mode: buffer, size: 7}\n");
    write(dir_ / "pipeline.yaml",
          "seed: 11\n"
          "source: {type: mix, inputs: [lines_input.yaml, tar_input.yaml], weights: [2, 1],\n"
          "         stop: all_exhausted}\n"
          "nodes:\n"
          "  - filter: {fn: length, field: tokens, min: 3}\n"
          "  - pack: {length: 24, separator: 10, drop_remainder: false, pad: 0}\n"
          "  - batch: {size: 4}\n");
  }
  static void write(const std::string& path, const std::string& text) {
    std::ofstream(path) << text;
  }
  Pipeline built_in_cpp() const {
    Pipeline lines = Pipeline::Builder()
                         .seed(3)
                         .lines({.paths = {dir_ / "docs-*.txt"}, .field = "tokens"})
                         .shuffle({.mode = ShuffleMode::kGlobal})
                         .build_input();
    Pipeline tar = Pipeline::Builder()
                       .seed(4)
                       .tar({.paths = {dir_ / "shard-*.tar"}, .fields = {"tokens"}})
                       .shuffle({.mode = ShuffleMode::kBuffer, .size = 7})
                       .build_input();
    return Pipeline::Builder()
        .seed(11)
        .mix({lines, tar}, {.weights = {2, 1}, .stop = MixStop::kAllExhausted})
        .filter([](const Sample& s, MapContext&) { return s.at("tokens").shape()[0] >= 3; },
                {.name = "length", .params = {{"field", "tokens"}, {"min", "3"}}})
        .pack({.length = 24, .separator = 10, .drop_remainder = false, .pad = 0})
        .batch({.size = 4})
        .build();
  }
  TempDir dir_;
};

TEST_F(MixedFormats, EveryDocumentLongEnoughIsPackedExactlyOnce) {
  Loader l(from_yaml_file(dir_ / "pipeline.yaml"), {.epochs = 1});
  std::string stream;
  bool saw_last = false;
  while (auto b = l.next()) {
    EXPECT_FALSE(saw_last) << "a batch after the one marked last";
    saw_last = b->info.is_last_in_epoch;
    for (auto t : (*b)["tokens"].values<std::uint8_t>()) stream.push_back(static_cast<char>(t));
  }
  EXPECT_TRUE(saw_last);
  // Split the row stream at separators: the documents of both formats, each once.
  std::multiset<std::string> got, want;
  std::string cur;
  for (char c : stream) {
    if (c == '\n') {
      got.insert(cur);
      cur.clear();
    } else if (c != '\0') {
      cur.push_back(c);
    }
  }
  for (int f = 0; f < 2; ++f)
    for (std::uint64_t i = 0; i < 45; ++i)
      if (document(f, i).size() >= 3) want.insert(document(f, i));
  for (int f = 0; f < 3; ++f)
    for (std::uint64_t i = 0; i < 20; ++i)
      if (document(10 + f, i).size() >= 3) want.insert(document(10 + f, i));
  EXPECT_EQ(got, want);
}

TEST_F(MixedFormats, YamlAndCppPipelinesAgree) {
  Loader a(from_yaml_file(dir_ / "pipeline.yaml"), {.epochs = 2});
  Loader b(built_in_cpp(), {.epochs = 2});
  EXPECT_EQ(testing::drain(a), testing::drain(b));
}

TEST_F(MixedFormats, ResumesExactlyAtEveryBreakpointWithOtherWorkerCounts) {
  auto make = [&] { return from_yaml_file(dir_ / "pipeline.yaml"); };
  testing::expect_save_restore(make, {.epochs = 3, .workers = 1}, {.epochs = 3, .workers = 2});
  testing::expect_save_restore(make, {.epochs = 2, .workers = 3}, {.epochs = 2, .workers = 1});
}

TEST_F(MixedFormats, ResumesFromADurableCheckpoint) {
  auto make = [&] { return built_in_cpp(); };
  std::vector<testing::BatchTrace> full;
  {
    Loader l(make(), {.epochs = 2});
    full = testing::drain(l);
  }
  ASSERT_GT(full.size(), 10u);
  const std::string ckpt = dir_ / "ckpt";
  std::vector<testing::BatchTrace> got;
  {
    Loader l(make(), {.epochs = 2, .workers = 2});
    got = testing::drain(l, full.size() / 2 + 1);
    l.save_checkpoint(ckpt);
  }
  Loader resumed(make(), {.epochs = 2, .workers = 1});
  ASSERT_TRUE(resumed.restore(ckpt).has_value());
  auto rest = testing::drain(resumed);
  got.insert(got.end(), rest.begin(), rest.end());
  EXPECT_EQ(got, full);
}

}  // namespace
}  // namespace flowstate
