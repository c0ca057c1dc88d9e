// YAML for the nodes of issue 5: filter (named predicates), pack, mix, the batch node's
// collation, and the lines and tar sources — what they build and every error with its text.
#include <gtest/gtest.h>

#include <fstream>

#include "flowstate/config/yaml.h"
#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "tests/support/formats.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::TempDir;

class YamlNodes : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::write_records(dir_ / "data", 50, 16, 1);
    testing::write_lines(dir_ / "a.jsonl",
                         {R"({"id": 1, "tokens": [1, 2, 3]})", R"({"id": 2, "tokens": [4]})",
                          R"({"id": 3, "tokens": [5, 6, 7, 8, 9]})", R"({"id": 4, "tokens": []})"});
  }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(dir_ / name) << text;
  }
  /// The ConfigError loading `text` (as p.yaml in the temp dir) raises.
  std::string error_of(const std::string& text) const {
    write("p.yaml", text);
    try {
      load_yaml_file(dir_ / "p.yaml");
    } catch (const ConfigError& e) {
      std::string m = e.what();
      // Messages name files by their full path; the tests read them relative to the dir.
      for (auto at = m.find(dir_.str() + "/"); at != std::string::npos;
           at = m.find(dir_.str() + "/"))
        m.erase(at, dir_.str().size() + 1);
      return m;
    }
    return "no error";
  }
  std::vector<Batch> run(const std::string& text, std::uint64_t epochs = 1) const {
    write("p.yaml", text);
    Loader l(from_yaml_file(dir_ / "p.yaml"), {.epochs = epochs});
    std::vector<Batch> out;
    while (auto b = l.next()) out.push_back(*b);
    return out;
  }
  static std::string records() {
    return "source: {type: records, paths: data/*.bin, record_bytes: 16}\nnodes:\n";
  }
  TempDir dir_;
};

TEST_F(YamlNodes, JsonLinesFilterOnLengthPadAndBatch) {
  auto batches =
      run("source: {type: lines, paths: a.jsonl, format: jsonl, json_fields: [id, tokens]}\n"
          "nodes:\n"
          "  - filter: {fn: length, field: tokens, min: 1, max: 4}\n"
          "  - batch: {size: 2, collate: pad, fields: [tokens], pad_value: -1}\n");
  ASSERT_EQ(batches.size(), 1u);
  const Batch& b = batches[0];
  auto ids = b["id"].values<std::int64_t>();
  EXPECT_EQ(std::vector<std::int64_t>(ids.begin(), ids.end()), (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(b["tokens"].shape(), (Shape{2, 3}));
  auto t = b["tokens"].values<std::int64_t>();
  EXPECT_EQ(std::vector<std::int64_t>(t.begin(), t.end()),
            (std::vector<std::int64_t>{1, 2, 3, 4, -1, -1}));
  auto len = b["tokens_length"].values<std::int64_t>();
  EXPECT_EQ(len[0], 3);
  EXPECT_EQ(len[1], 1);
  EXPECT_TRUE(b.info.is_last_in_epoch);
}

TEST_F(YamlNodes, RaggedAndPack) {
  auto batches =
      run("source: {type: lines, paths: a.jsonl, format: jsonl, json_fields: [tokens]}\n"
          "nodes:\n"
          "  - pack: {length: 4, separator: 0}\n"
          "  - batch: {size: 8, collate: ragged}\n");
  ASSERT_EQ(batches.size(), 1u);
  // 1 2 3 0 | 4 0 5 6 | 7 8 9 0 | 0 (dropped remainder): three rows of 4, ragged offsets.
  auto t = batches[0]["tokens"].values<std::int64_t>();
  EXPECT_EQ(std::vector<std::int64_t>(t.begin(), t.end()),
            (std::vector<std::int64_t>{1, 2, 3, 0, 4, 0, 5, 6, 7, 8, 9, 0}));
  auto off = batches[0]["tokens_offsets"].values<std::int64_t>();
  EXPECT_EQ(std::vector<std::int64_t>(off.begin(), off.end()),
            (std::vector<std::int64_t>{0, 4, 8, 12}));
}

TEST_F(YamlNodes, KeepFractionIsSeededAndApproximate) {
  const std::string p = "seed: 5\n" + records() +
                        "  - filter: {fn: keep_fraction, fraction: 0.5}\n  - batch: {size: 1}\n";
  auto a = run(p, 2);
  auto b = run(p, 2);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].digest(), b[i].digest());
  EXPECT_GT(a.size(), 25u);
  EXPECT_LT(a.size(), 75u);
}

TEST_F(YamlNodes, FilterErrorsNameTheKey) {
  EXPECT_EQ(error_of(records() + "  - filter: {fn: length, min: 2}\n  - batch: {size: 2}\n"),
            "p.yaml:3:5: nodes[0].filter.field: length needs a field");
  EXPECT_EQ(error_of(records() + "  - filter: {fn: value, field: data}\n  - batch: {size: 2}\n"),
            "p.yaml:3:5: nodes[0].filter.min: value needs min or max");
  EXPECT_EQ(error_of(records() + "  - filter: {fn: keep_fraction}\n  - batch: {size: 2}\n"),
            "p.yaml:3:5: nodes[0].filter.fraction: keep_fraction needs a fraction");
  EXPECT_NE(error_of(records() + "  - filter: {fn: keep_fraction, fraction: 2}\n"
                                 "  - batch: {size: 2}\n")
                .find("nodes[0].filter.fraction"),
            std::string::npos);
  EXPECT_NE(error_of(records() + "  - filter: {fn: shortest}\n  - batch: {size: 2}\n")
                .find("nodes[0].filter.fn"),
            std::string::npos);
}

TEST_F(YamlNodes, BatchCollateErrors) {
  EXPECT_EQ(error_of(records() + "  - batch: {size: 2, fields: [data]}\n"),
            "p.yaml:3:30: nodes[0].batch.fields: fields and pad_value apply to collate: pad or "
            "ragged");
  EXPECT_NE(error_of(records() + "  - batch: {size: 2, collate: squash}\n")
                .find("nodes[0].batch.collate"),
            std::string::npos);
}

TEST_F(YamlNodes, MixLoadsItsInputsRelativeToTheFile) {
  testing::write_records(dir_ / "other", 30, 16, 1);
  write("in_a.yaml", "source: {type: records, paths: data/*.bin, record_bytes: 16}\n");
  write("in_b.yaml",
        "source: {type: records, paths: other/*.bin, record_bytes: 16}\n"
        "nodes:\n  - shuffle: {mode: global}\n");
  auto batches =
      run("source: {type: mix, inputs: [in_a.yaml, in_b.yaml], weights: [0.25, 0.75], stop: "
          "all_exhausted}\n"
          "nodes:\n  - batch: {size: 10}\n");
  std::size_t n = 0;
  for (const auto& b : batches) n += b.info.num_samples;
  EXPECT_EQ(n, 80u);
}

TEST_F(YamlNodes, MixErrors) {
  write("in_a.yaml", "source: {type: records, paths: data/*.bin, record_bytes: 16}\n");
  write("in_batch.yaml",
        "source: {type: records, paths: data/*.bin, record_bytes: 16}\nnodes:\n"
        "  - batch: {size: 2}\n");
  EXPECT_EQ(error_of("source: {type: mix, inputs: [in_a.yaml, in_a.yaml], weights: [1, x]}\n"
                     "nodes:\n  - batch: {size: 2}\n"),
            "p.yaml:1:62: source.weights: weights[1]: 'x' is not a positive number");
  EXPECT_EQ(error_of("source: {type: mix, inputs: [in_a.yaml, in_a.yaml], weights: [1]}\n"
                     "nodes:\n  - batch: {size: 2}\n"),
            "p.yaml:1:62: source.weights: mix has 2 inputs but 1 weights");
  EXPECT_NE(error_of("source: {type: mix, inputs: [in_a.yaml, in_batch.yaml], weights: [1, 1]}\n"
                     "nodes:\n  - batch: {size: 2}\n")
                .find("'batch' cannot be part of a mix input"),
            std::string::npos);
}

TEST_F(YamlNodes, TarSourceFromYaml) {
  testing::write_tar(dir_ / "s.tar", {{"a.txt", "hello"}, {"a.cls", "1"}, {"b.txt", "hi"}});
  auto batches =
      run("source: {type: tar, paths: s.tar, fields: [txt, cls], on_missing: skip}\n"
          "nodes:\n  - batch: {size: 4, collate: ragged, fields: [txt]}\n");
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0].info.num_samples, 1u);  // b lacks .cls and is skipped
  EXPECT_EQ(batches[0]["txt"].shape(), (Shape{5}));
}

}  // namespace
}  // namespace flowstate
