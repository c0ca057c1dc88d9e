// The YAML loader: what it builds, and every kind of error with its exact text (file, line,
// column and key path). Over 600 lines: one loader, and each of its errors is a case.
#include "flowstate/config/yaml.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "flowstate/config/registry.h"
#include "flowstate/config/transforms.h"
#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::TempDir;

constexpr const char* kBase =
    "seed: 3\n"                                                       // 1
    "source: {type: records, paths: data/*.bin, record_bytes: 64}\n"  // 2
    "nodes:\n"                                                        // 3
    "  - shard: {world: 1, rank: 0}\n"                                // 4
    "  - shuffle: {mode: buffer, size: 100}\n"                        // 5
    "  - batch: {size: 8}\n";                                         // 6

/// The ConfigError `text` raises, or a failure.
ConfigError error_of(const std::string& text, const YamlOptions& options = {}) {
  try {
    load_yaml_string(text, "p.yaml", options);
  } catch (const ConfigError& e) {
    return e;
  }
  ADD_FAILURE() << "no ConfigError for:\n" << text;
  return ConfigError("", "");
}

ConfigError override_error(const std::vector<std::string>& sets) {
  YamlOptions o;
  o.overrides = sets;
  return error_of(kBase, o);
}

void expect_error(const std::string& text, const std::string& key, const std::string& message) {
  ConfigError e = error_of(text);
  EXPECT_EQ(e.key(), key);
  EXPECT_EQ(std::string(e.what()), message);
}

std::string replace(std::string text, const std::string& from, const std::string& to) {
  auto pos = text.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  if (pos != std::string::npos) text.replace(pos, from.size(), to);
  return text;
}

// ---- what it builds ----

TEST(YamlPipeline, BuildsWhatTheBuilderBuilds) {
  Pipeline yaml =
      from_yaml_string(std::string(kBase) + "  - prefetch: {depth: 3}\nworkers: 3\n", "p.yaml");
  Pipeline cpp = Pipeline::Builder()
                     .seed(3)
                     .workers(3)
                     .records({.paths = {"data/*.bin"}, .record_bytes = 64})
                     .shard({.rank = 0, .world = 1})
                     .shuffle({.mode = ShuffleMode::kBuffer, .size = 100})
                     .batch({.size = 8})
                     .prefetch({.depth = 3})
                     .build();
  EXPECT_EQ(yaml.canonical(), cpp.canonical());
  EXPECT_EQ(yaml.fingerprint(), cpp.fingerprint());
  EXPECT_EQ(yaml.describe(), cpp.describe());
  EXPECT_EQ(yaml.workers(), 3);
}

TEST(YamlPipeline, FillsInDefaultsAndAcceptsBareNodeNames) {
  PipelineConfig c = load_yaml_string(
      "source: {type: records, paths: [a.bin, 'b*.bin'], record_bytes: 4}\n"
      "nodes: [shuffle, {batch: {size: 2}}, prefetch, device_copy]\n",
      "p.yaml");
  EXPECT_EQ(c.pipeline.seed(), 0u);
  EXPECT_EQ(c.pipeline.workers(), 2);
  EXPECT_EQ(c.epochs, 1u);
  EXPECT_FALSE(c.checkpoint);
  EXPECT_EQ(c.pipeline.describe(),
            "seed: 0\n"
            "workers: 2 (free)\n"
            "[0] records: records\n"
            "      paths: a.bin,b*.bin\n"
            "      record_bytes: 4\n"
            "      field: data\n"
            "[1] shuffle: shuffle\n"
            "      mode: global\n"
            "      seed: 0\n"
            "[2] batch: batch\n"
            "      size: 2\n"
            "      drop_last: false\n"
            "[3] prefetch: prefetch\n"
            "      depth: 4 (free)\n"
            "[4] device_copy: device_copy\n"
            "      device: auto (free)\n");
}

TEST(YamlPipeline, MapCarriesItsTransformAndParametersIntoTheFingerprint) {
  const std::string text =
      replace(kBase, "  - batch", "  - map: {fn: random_crop, length: 4, workers: 2}\n  - batch");
  Pipeline p = from_yaml_string(text, "p.yaml");
  const auto canonical = p.canonical();
  auto has = [&](const std::string& k, const std::string& v) {
    return std::find(canonical.begin(), canonical.end(), CanonicalParam{k, v}) != canonical.end();
  };
  EXPECT_TRUE(has("random_crop", "map"));
  EXPECT_TRUE(has("random_crop.fn", "random_crop"));
  EXPECT_TRUE(has("random_crop.field", "data"));
  EXPECT_TRUE(has("random_crop.length", "4"));
  // workers is free; length is not.
  EXPECT_EQ(from_yaml_string(replace(text, "workers: 2", "workers: 5"), "p.yaml").fingerprint(),
            p.fingerprint());
  EXPECT_NE(from_yaml_string(replace(text, "length: 4", "length: 5"), "p.yaml").fingerprint(),
            p.fingerprint());
}

TEST(YamlPipeline, FreeParametersDoNotChangeTheFingerprint) {
  const std::string base = std::string(kBase) + "  - prefetch: {depth: 2}\n  - device_copy\n";
  const std::uint64_t f = from_yaml_string(base, "p.yaml").fingerprint();
  EXPECT_EQ(from_yaml_string(base + "workers: 7\n", "p.yaml").fingerprint(), f);
  EXPECT_EQ(from_yaml_string(replace(base, "depth: 2", "depth: 9"), "p.yaml").fingerprint(), f);
  EXPECT_EQ(
      from_yaml_string(replace(base, "- device_copy", "- device_copy: {device: cpu}"), "p.yaml")
          .fingerprint(),
      f);
  EXPECT_NE(from_yaml_string(replace(base, "seed: 3", "seed: 4"), "p.yaml").fingerprint(), f);
}

TEST(YamlPipeline, OverridesReplaceValuesBeforeValidation) {
  YamlOptions o;
  o.overrides = {"seed=7",
                 "nodes[1].shuffle.size=1024",
                 "nodes[0].shard.world=2",
                 "source.paths=[x.bin, y.bin]",
                 "checkpoint.dir=/ck",
                 "epochs=0"};
  PipelineConfig c = load_yaml_string(kBase, "p.yaml", o);
  std::string expected = replace(kBase, "seed: 3", "seed: 7");
  expected = replace(expected, "size: 100", "size: 1024");
  expected = replace(expected, "world: 1", "world: 2");
  expected = replace(expected, "paths: data/*.bin", "paths: [x.bin, y.bin]");
  EXPECT_EQ(c.pipeline.canonical(), from_yaml_string(expected, "p.yaml").canonical());
  ASSERT_TRUE(c.checkpoint);
  EXPECT_EQ(c.checkpoint->dir, "/ck");
  EXPECT_EQ(c.checkpoint->every_steps, 0u);
  EXPECT_EQ(c.epochs, 0u);
}

TEST(YamlPipeline, OverridesAddressNodesByName) {
  const std::string text = std::string(kBase) + "  - map: {fn: normalize, std: 2}\n";
  YamlOptions o;
  o.overrides = {"shuffle.size=1024", "normalize.std=4", "batch.drop_last=true"};
  PipelineConfig c = load_yaml_string(text, "p.yaml", o);
  std::string expected = replace(text, "size: 100", "size: 1024");
  expected = replace(expected, "std: 2", "std: 4");
  expected = replace(expected, "size: 8}", "size: 8, drop_last: true}");
  EXPECT_EQ(c.pipeline.canonical(), from_yaml_string(expected, "p.yaml").canonical());
  // A name several nodes share is refused, listing them.
  o.overrides = {"map.workers=2"};
  EXPECT_EQ(std::string(error_of(text + "  - map: {fn: normalize, std: 3}\n", o).what()),
            "--set map.workers=2: 'map' names 2 nodes: nodes[3].map, nodes[4].map; address "
            "one by its index");
  o.overrides = {"normalize.std=1"};
  EXPECT_EQ(std::string(error_of(text + "  - map: {fn: normalize, std: 3}\n", o).what()),
            "--set normalize.std=1: 'normalize' names 2 nodes: nodes[3].map, nodes[4].map; "
            "address one by its index");
}

TEST(YamlPipeline, OverrideGivesParametersToABareNodeName) {
  YamlOptions o;
  o.overrides = {"nodes[0].shuffle.mode=buffer"};
  Pipeline p = load_yaml_string(
                   "source: {type: records, paths: a, record_bytes: 4}\n"
                   "nodes: [shuffle, {batch: {size: 2}}]\n",
                   "p.yaml", o)
                   .pipeline;
  EXPECT_NE(p.describe().find("mode: buffer"), std::string::npos) << p.describe();
}

TEST(YamlPipeline, RelativePathsResolveAgainstTheFilesDirectory) {
  TempDir dir;
  std::filesystem::create_directories(dir.path() / "project");
  testing::write_records(dir / "project/data", 40, 64, 2);
  {
    std::ofstream out(dir.path() / "project/p.yaml");
    out << kBase << "checkpoint: {dir: ck, every_steps: 5, keep: 2}\n";
  }
  PipelineConfig c = load_yaml_file(dir / "project/p.yaml");
  ASSERT_TRUE(c.checkpoint);
  EXPECT_EQ(c.checkpoint->dir, dir / "project/ck");
  EXPECT_EQ(c.checkpoint->every_steps, 5u);
  EXPECT_EQ(c.checkpoint->keep, 2u);
  // The process's directory is not the project's: the source still opens its files.
  Loader loader(c.pipeline);
  EXPECT_EQ(testing::drain(loader).size(), 5u);
  // The description keeps the paths as written, so the project can move.
  EXPECT_NE(c.pipeline.describe().find("paths: data/*.bin"), std::string::npos);
}

TEST(YamlPipeline, AMixInputReadsWithTheCallersRegistries) {
  // A node and a transform known only to the caller's registries work inside a mix's input
  // files too: the inputs are read with the same YamlOptions registries as the top file.
  TempDir dir;
  const std::string glob = testing::write_records(dir.str(), 12, 8, 1);
  Registry nodes = Registry::with_builtins();
  nodes.add({.type = "ones",
             .doc = "sets every byte of the data to 1",
             .add =
                 [](NodeContext& ctx) {
                   ctx.builder.map(
                       [](Sample& s, MapContext&) {
                         Tensor t = s.at("data").clone();
                         std::memset(t.data(), 1, t.nbytes());
                         s.set("data", t);
                       },
                       MapOptions{.name = "ones"});
                 },
             .node_name = [](const Params&) { return std::string("ones"); }});
  TransformRegistry transforms = TransformRegistry::with_builtins();
  transforms.add({.name = "double",
                  .doc = "doubles every uint8",
                  .params = {field_param()},
                  .make_sample = [](const Params&) -> SampleFn {
                    return [](Sample& s, MapContext&) {
                      Tensor t = s.at("data").clone();
                      for (auto& b : t.values<std::uint8_t>()) b = static_cast<std::uint8_t>(2 * b);
                      s.set("data", t);
                    };
                  }});
  const std::string source = "source: {type: records, paths: '" + glob + "', record_bytes: 8}\n";
  std::ofstream(dir.path() / "in_a.yaml") << source << "nodes: [ones, {map: {fn: double}}]\n";
  std::ofstream(dir.path() / "in_b.yaml") << source << "nodes: [ones]\n";
  YamlOptions o;
  o.registry = &nodes;
  o.transforms = &transforms;
  o.base_dir = dir.path();
  const std::string text =
      "source: {type: mix, inputs: [in_a.yaml, in_b.yaml], weights: [1, 1]}\n"
      "nodes: [{batch: {size: 24}}]\n";
  Loader loader(from_yaml_string(text, "p.yaml", o));
  auto b = loader.next();
  ASSERT_TRUE(b);
  // Every sample went through its input's nodes: all ones (in_b), or doubled ones (in_a).
  std::size_t twos = 0, ones = 0, other = 0;
  for (auto x : (*b)["data"].values<std::uint8_t>()) ++(x == 2 ? twos : x == 1 ? ones : other);
  EXPECT_GT(twos, 0u);
  EXPECT_GT(ones, 0u);
  EXPECT_EQ(other, 0u);
  // Without the caller's registries, the input names a node nobody registered.
  YamlOptions plain;
  plain.base_dir = dir.path();
  try {
    from_yaml_string(text, "p.yaml", plain);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown node type 'ones'"), std::string::npos)
        << e.what();
  }
}

/// A predicate of a program's own: keeps the records whose id (the index in the file) is even.
struct EvenOptions {
  std::uint64_t every = 2;
  static constexpr auto table() {
    return std::tuple{
        param("every", &EvenOptions::every, {.min = 1, .doc = "keeps one record in `every`"})};
  }
};

TEST(YamlPipeline, AProgramsPredicateIsDeclaredByItsTableAndWorksInAMixInput) {
  TempDir dir;
  const std::string glob = testing::write_records(dir.str(), 40, 8, 1);
  TransformRegistry functions = TransformRegistry::with_builtins();
  functions.add(define_predicate<EvenOptions>(
      "one_in", "keeps one record in `every`", [](const EvenOptions& o, const Params&) {
        return Predicate{.fn = [every = o.every](const Sample& s, MapContext&) {
          return s.ref.record().index % every == 0;
        }};
      }));
  // The table is the predicate's parameters: its default, bound and doc.
  const PredicateSchema* one_in = functions.find_predicate("one_in");
  ASSERT_NE(one_in, nullptr);
  ASSERT_EQ(one_in->params.size(), 1u);
  EXPECT_EQ(std::get<std::uint64_t>(*one_in->params[0].default_value), 2u);
  EXPECT_EQ(*one_in->params[0].min, 1.0);
  EXPECT_THROW(
      functions.add(define_predicate<EvenOptions>(
          "length", "taken", [](const EvenOptions&, const Params&) { return Predicate{}; })),
      std::invalid_argument);

  const std::string source = "source: {type: records, paths: '" + glob + "', record_bytes: 8}\n";
  std::ofstream(dir.path() / "in.yaml") << source << "nodes: [{filter: {fn: one_in, every: 4}}]\n";
  YamlOptions o;
  o.transforms = &functions;
  o.base_dir = dir.path();
  const std::string text =
      "source: {type: mix, inputs: [in.yaml, in.yaml], weights: [1, 1]}\n"
      "nodes: [{batch: {size: 10}}]\n";
  Loader loader(from_yaml_string(text, "p.yaml", o));
  std::vector<std::uint64_t> records;
  while (auto b = loader.next())
    for (const Ref& r : b->info.refs) records.push_back(r.record().index);
  // Each input keeps 10 of its 40 records.
  ASSERT_GE(records.size(), 10u);
  ASSERT_LE(records.size(), 20u);
  for (auto r : records) EXPECT_EQ(r % 4, 0u) << r;
  // A bound is the table's, said at the input's entry.
  std::ofstream(dir.path() / "in.yaml") << source << "nodes: [{filter: {fn: one_in, every: 0}}]\n";
  try {
    from_yaml_string(text, "p.yaml", o);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("nodes[0].filter.every: 0 is out of range (must be at "
                                         "least 1)"),
              std::string::npos)
        << e.what();
  }
  // Without the program's registry, the input names a predicate nobody registered.
  std::ofstream(dir.path() / "in.yaml") << source << "nodes: [{filter: {fn: one_in}}]\n";
  YamlOptions plain;
  plain.base_dir = dir.path();
  try {
    from_yaml_string(text, "p.yaml", plain);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "nodes[0].filter.fn: unknown predicate 'one_in' (known: length, value, "
                  "keep_fraction)"),
              std::string::npos)
        << e.what();
  }
}

TEST(YamlPipeline, AProgramRegistersItsOwnNodesAndTransforms) {
  TempDir dir;
  const std::string glob = testing::write_records(dir.str(), 12, 8, 1);
  Registry nodes = Registry::with_builtins();
  nodes.add({.type = "tag",
             .doc = "sets every byte of the data to a constant",
             .params = {{.name = "value",
                         .type = ParamType::kUInt,
                         .doc = "the byte",
                         .required = true,
                         .max = 255}},
             .add =
                 [](NodeContext& ctx) {
                   auto v = static_cast<std::byte>(ctx.params.uint("value"));
                   MapOptions o{.name = "tag", .params = ctx.params.describe({})};
                   o.params.push_back({"value", std::to_string(ctx.params.uint("value"))});
                   ctx.builder.map(
                       [v](Sample& s, MapContext&) {
                         Tensor t = s.at("data").clone();
                         std::memset(t.data(), static_cast<int>(v), t.nbytes());
                         s.set("data", t);
                       },
                       o);
                 },
             .node_name = [](const Params&) { return std::string("tag"); }});
  TransformRegistry transforms = TransformRegistry::with_builtins();
  transforms.add(
      {.name = "plus",
       .doc = "adds a constant to every uint8",
       .params = {field_param(), {.name = "amount", .type = ParamType::kUInt, .doc = "added"}},
       .make_sample = [](const Params& p) -> SampleFn {
         auto amount = static_cast<std::uint8_t>(p.uint("amount"));
         return [amount](Sample& s, MapContext&) {
           Tensor t = s.at("data").clone();
           for (auto& b : t.values<std::uint8_t>()) b += amount;
           s.set("data", t);
         };
       }});
  YamlOptions o;
  o.registry = &nodes;
  o.transforms = &transforms;
  const std::string text = "source: {type: records, paths: '" + glob +
                           "', record_bytes: 8}\n"
                           "nodes: [{tag: {value: 5}}, {map: {fn: plus, amount: 2}}, "
                           "{batch: {size: 4}}]\n";
  Loader loader(from_yaml_string(text, "p.yaml", o));
  auto b = loader.next();
  ASSERT_TRUE(b);
  for (auto x : (*b)["data"].values<std::uint8_t>()) EXPECT_EQ(x, 7);
  // The built-in registry does not know them.
  EXPECT_EQ(std::string(error_of(text).what()),
            "p.yaml:2:10: nodes[0]: unknown node type 'tag' (known: shard, shuffle, map, "
            "filter, tokenize, decode_image, pack, batch, prefetch, device_copy)");
}

TEST(Registry, RejectsDuplicateAndNamelessTypes) {
  Registry r = Registry::with_builtins();
  EXPECT_THROW(r.add(NodeSchema{.type = "shuffle", .add = [](NodeContext&) {}}),
               std::invalid_argument);
  EXPECT_THROW(r.add(NodeSchema{.type = "", .add = [](NodeContext&) {}}), std::invalid_argument);
  EXPECT_THROW(r.add(NodeSchema{.type = "x"}), std::invalid_argument);
  TransformRegistry t = TransformRegistry::with_builtins();
  EXPECT_THROW(t.add({.name = "decode", .make_sample = [](const Params&) { return SampleFn(); }}),
               std::invalid_argument);
  EXPECT_THROW(t.add({.name = "y",
                      .params = {{.name = "workers", .type = ParamType::kUInt}},
                      .make_sample = [](const Params&) { return SampleFn(); }}),
               std::invalid_argument);
}

TEST(Registry, EveryBuiltinParameterHasADocAndAConsistentDefault) {
  auto check = [](const std::string& owner, const std::vector<ParamSchema>& params) {
    for (const auto& p : params) {
      SCOPED_TRACE(owner + "." + p.name);
      EXPECT_FALSE(p.doc.empty());
      EXPECT_FALSE(p.required && p.default_value);
      if (p.default_value) {
        EXPECT_EQ(check_param(p, *p.default_value), "");
      }
    }
  };
  for (const auto& n : Registry::builtin().nodes()) check(n.type, n.params);
  for (const auto& t : TransformRegistry::builtin().transforms()) check(t.name, t.params);
  check("pipeline", pipeline_params());
  check("checkpoint", checkpoint_params());
  EXPECT_EQ(Registry::builtin().names(true),
            (std::vector<std::string>{"records", "lines", "tar", "indexed", "mix"}));
}

TEST(YamlPipeline, ManyNodesGetUniqueNamesInOrder) {
  // 2 000 maps of one transform: named map-style "cast", "cast#2", ... "cast#2000", built in
  // time linear in the node count (bench/RESULTS.md has the time).
  std::string text = "source: {type: records, paths: data/*.bin, record_bytes: 64}\nnodes:\n";
  for (int i = 0; i < 2000; ++i) text += "  - map: {fn: cast, dtype: uint8}\n";
  text += "  - batch: {size: 8}\n";
  Pipeline p = load_yaml_string(text, "p.yaml").pipeline;
  ASSERT_EQ(p.nodes().size(), 2002u);
  EXPECT_EQ(p.nodes()[1].name, "cast");
  EXPECT_EQ(p.nodes()[2].name, "cast#2");
  EXPECT_EQ(p.nodes()[2000].name, "cast#2000");
}

TEST(YamlErrors, TooManyNodesIsRefusedWithTheLimit) {
  // 100 000 nodes from one alias: refused before any is built, not expanded for minutes.
  std::string text =
      "source: {type: records, paths: data/*.bin, record_bytes: 64}\nnodes:\n"
      "  - &p prefetch\n";
  for (int i = 1; i < 100000; ++i) text += "  - *p\n";
  expect_error(text, "nodes",
               "p.yaml:3:3: nodes: the pipeline has 100000 nodes; at most 10000 are allowed");
}

TEST(Registry, SchemaDefaultsAreTheOptionsDefaults) {
  // For every node type: the defaults YAML fills in (its schema) read back to exactly the
  // options type's own defaults, Options{}, option by option.
  int checked = 0;
  for (const auto& n : Registry::builtin().nodes()) {
    if (n.def == nullptr || !n.def->from_params) continue;
    SCOPED_TRACE(n.type);
    std::vector<std::pair<std::string, ParamValue>> given;
    for (const auto& p : n.def->params)
      if (p.default_value) given.emplace_back(p.name, *p.default_value);
    const auto from_yaml = n.def->values(n.def->from_params(Params(n.type, given), {}));
    const auto defaults = n.def->values(n.def->defaults());
    EXPECT_EQ(from_yaml, defaults);
    for (const auto& p : n.def->params) {
      SCOPED_TRACE(p.name);
      auto it = std::find_if(defaults.begin(), defaults.end(),
                             [&](const auto& d) { return d.first == p.name; });
      ASSERT_NE(it, defaults.end());
      if (p.default_value) {
        EXPECT_EQ(it->second, p.default_value);
      }
    }
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

// ---- errors: file, line, column, key path ----

TEST(YamlErrors, UnknownParameterSuggestsTheClosestOne) {
  expect_error(replace(kBase, "size: 100", "sise: 100"), "nodes[1].shuffle.sise",
               "p.yaml:5:29: nodes[1].shuffle.sise: unknown parameter 'sise' of shuffle "
               "(known: mode, size, seed); did you mean 'size'?");
}

TEST(YamlErrors, UnknownNodeTypeListsTheKnownOnes) {
  expect_error(replace(kBase, "- shuffle:", "- shufle:"), "nodes[1]",
               "p.yaml:5:5: nodes[1]: unknown node type 'shufle' (known: shard, shuffle, map, "
               "filter, tokenize, decode_image, pack, batch, prefetch, device_copy); did you mean "
               "'shuffle'?");
}

TEST(YamlErrors, UnknownTopLevelKey) {
  expect_error(std::string(kBase) + "epoch: 2\n", "epoch",
               "p.yaml:7:1: epoch: unknown top-level key 'epoch' (known: seed, source, nodes, "
               "epochs, workers, checkpoint, plugins); did you mean 'epochs'?");
}

TEST(YamlErrors, WrongTypes) {
  expect_error(replace(kBase, "size: 100", "size: abc"), "nodes[1].shuffle.size",
               "p.yaml:5:35: nodes[1].shuffle.size: expected an unsigned integer, got 'abc'");
  expect_error(replace(kBase, "size: 100", "size: \"100\""), "nodes[1].shuffle.size",
               "p.yaml:5:35: nodes[1].shuffle.size: expected an unsigned integer, got the "
               "quoted string \"100\"");
  expect_error(replace(kBase, "size: 100", "size: 1.5"), "nodes[1].shuffle.size",
               "p.yaml:5:35: nodes[1].shuffle.size: expected an unsigned integer, got '1.5'");
  expect_error(replace(kBase, "size: 8}", "size: 8, drop_last: yes}"), "nodes[2].batch.drop_last",
               "p.yaml:6:33: nodes[2].batch.drop_last: expected a boolean (true or false), got "
               "'yes'");
  expect_error(replace(kBase, "paths: data/*.bin", "paths: {a: 1}"), "source.paths",
               "p.yaml:2:32: source.paths: expected a string or a list of strings, got a map");
  expect_error(replace(kBase, "paths: data/*.bin", "paths: [a, [b]]"), "source.paths[1]",
               "p.yaml:2:36: source.paths[1]: expected a string, got a list");
  expect_error(replace(kBase, "seed: 3", "seed: [3]"), "seed",
               "p.yaml:1:7: seed: expected an unsigned integer, got a list");
  expect_error(replace(kBase, "  - shard: {world: 1, rank: 0}", "  - shard: [1]"), "nodes[0].shard",
               "p.yaml:4:12: nodes[0].shard: parameters must be a map, got a list");
}

TEST(YamlErrors, OutOfRangeValues) {
  expect_error(replace(kBase, "size: 100", "size: 0"), "nodes[1].shuffle.size",
               "p.yaml:5:35: nodes[1].shuffle.size: 0 is out of range (must be at least 1)");
  expect_error(replace(kBase, "size: 100", "size: -4"), "nodes[1].shuffle.size",
               "p.yaml:5:35: nodes[1].shuffle.size: -4 is out of range (must be at least 1)");
  expect_error(replace(kBase, "seed: 3", "seed: 18446744073709551616"), "seed",
               "p.yaml:1:7: seed: 18446744073709551616 is out of range (must be at most "
               "18446744073709551615)");
  expect_error(replace(kBase, "  - batch", "  - prefetch: {depth: 5000}\n  - batch"),
               "nodes[2].prefetch.depth",
               "p.yaml:6:23: nodes[2].prefetch.depth: 5000 is out of range (must be between 1 "
               "and 4096)");
  expect_error(replace(kBase, "mode: buffer", "mode: random"), "nodes[1].shuffle.mode",
               "p.yaml:5:21: nodes[1].shuffle.mode: 'random' is not one of: global, buffer");
  expect_error(replace(kBase, "paths: data/*.bin", "paths: []"), "source.paths",
               "p.yaml:2:32: source.paths: must name at least one file or glob");
  expect_error(std::string(kBase) + "  - device_copy: {device: gpu}\n",
               "nodes[3].device_copy.device",
               "p.yaml:7:27: nodes[3].device_copy.device: 'gpu' is not a device (use auto, cpu "
               "or cuda:N)");
}

TEST(YamlErrors, MissingRequiredKeys) {
  expect_error(replace(kBase, "{size: 8}", "{drop_last: true}"), "nodes[2].batch.size",
               "p.yaml:6:12: nodes[2].batch.size: missing required parameter 'size'");
  expect_error(replace(kBase, "- batch: {size: 8}", "- batch"), "nodes[2].batch.size",
               "p.yaml:6:5: nodes[2].batch.size: missing required parameter 'size'");
  expect_error(replace(kBase, ", record_bytes: 64", ""), "source.record_bytes",
               "p.yaml:2:9: source.record_bytes: missing required parameter 'record_bytes'");
  expect_error(replace(kBase, "type: records, ", ""), "source.type",
               "p.yaml:2:9: source.type: missing required key 'type' (known: records, lines, tar, "
               "indexed, mix)");
  expect_error("seed: 1\nnodes: [{batch: {size: 1}}]\n", "source",
               "p.yaml:1:1: source: missing required key 'source' (e.g. source: {type: "
               "records, ...})");
  expect_error("source: {type: records, paths: a, record_bytes: 1}\n", "nodes",
               "p.yaml:1:1: nodes: missing required key 'nodes' (a pipeline needs at least a "
               "batch node)");
  expect_error(std::string(kBase) + "checkpoint: {keep: 2}\n", "checkpoint.dir",
               "p.yaml:7:13: checkpoint.dir: missing required parameter 'dir'");
}

TEST(YamlErrors, StructureMistakes) {
  expect_error(replace(kBase, "  - batch: {size: 8}", "  - batch: {size: 8}\n    prefetch: {}"),
               "nodes[2]",
               "p.yaml:6:5: nodes[2]: a node is a one-key map like '- shuffle: {size: 1024}', "
               "got a map with 2 keys");
  expect_error(replace(kBase, "size: 100}", "size: 100, size: 5}"), "nodes[1].shuffle.size",
               "p.yaml:5:40: nodes[1].shuffle.size: duplicate key 'size'");
  expect_error(std::string(kBase) + "  - records: {paths: a, record_bytes: 1}\n", "nodes[3]",
               "p.yaml:7:5: nodes[3]: 'records' is a source; it goes under 'source:'");
  expect_error(replace(kBase, "type: records", "type: shuffle"), "source.type",
               "p.yaml:2:16: source.type: 'shuffle' is not a source (sources: records, lines, tar, "
               "indexed, mix); put it "
               "in nodes");
  expect_error("source: {type: records, paths: a, record_bytes: 1}\nnodes: 4\n", "nodes",
               "p.yaml:2:8: nodes: expected a list of nodes, got '4'");
  expect_error("- a\n- b\n", "",
               "p.yaml:1:1: a pipeline is a map with the keys seed, source, nodes, ... (got a "
               "list)");
  expect_error("", "", "p.yaml: the pipeline is empty (expected a map with source, nodes, ...)");
  expect_error(std::string(kBase) + "---\nseed: 1\n", "",
               "p.yaml:7:1: a pipeline file holds one YAML document, and another one starts here");
}

TEST(YamlErrors, InvalidYamlNamesTheLine) {
  expect_error(replace(kBase, "size: 100}", "size: 100"), "",
               "p.yaml:6:10: invalid YAML: end of map flow not found");
}

TEST(YamlErrors, PipelineRulesPointAtTheNode) {
  expect_error(replace(kBase, "  - batch: {size: 8}", "  - batch: {size: 8}\n  - batch: {size: 2}"),
               "nodes[3].batch",
               "p.yaml:7:5: nodes[3].batch: a pipeline has exactly one batch node, and nodes[2] "
               "is one");
  expect_error(replace(kBase, "  - batch: {size: 8}", "  - shard"), "nodes",
               "p.yaml:4:3: nodes: a pipeline needs a batch node (e.g. '- batch: {size: 256}')");
  expect_error(replace(kBase, "  - shard", "  - device_copy\n  - shard"), "nodes[0].device_copy",
               "p.yaml:4:5: nodes[0].device_copy: device_copy must be the last node");
  // The builder's ordering rule, placed at the node it names.
  expect_error(replace(kBase, "  - shuffle", "  - map: {fn: cast, dtype: int8}\n  - shuffle"),
               "nodes[2].shuffle",
               "p.yaml:6:5: nodes[2].shuffle: 'shuffle' must come before any map, filter or pack "
               "and before batch");
  // The builder's cross-parameter check, placed at the parameter.
  expect_error(replace(kBase, "rank: 0", "rank: 1"), "nodes[0].shard.rank",
               "p.yaml:4:29: nodes[0].shard.rank: rank 1 is out of range for world 1");
  expect_error(replace(kBase, "mode: buffer, size: 100", "mode: global, size: 100"),
               "nodes[1].shuffle.size",
               "p.yaml:5:35: nodes[1].shuffle.size: size applies only to mode: buffer (this "
               "shuffle is global)");
}

TEST(YamlErrors, MapTransforms) {
  expect_error(replace(kBase, "  - batch", "  - map: {fn: decod, dtype: uint16}\n  - batch"),
               "nodes[2].map.fn",
               "p.yaml:6:15: nodes[2].map.fn: unknown transform 'decod' (known: decode, cast, "
               "normalize, slice, random_crop, parse_int, resize, center_crop, "
               "random_resized_crop, flip, normalize_image); did you mean 'decode'?");
  expect_error(
      replace(kBase, "  - batch", "  - map: {fn: decode, dtype: uint16, size: 2}\n  - batch"),
      "nodes[2].map.size",
      "p.yaml:6:38: nodes[2].map.size: unknown parameter 'size' of map (known: fn, "
      "workers, field, dtype, shape)");
  expect_error(replace(kBase, "  - batch", "  - map: {fn: decode, dtype: u16}\n  - batch"),
               "nodes[2].map.dtype",
               "p.yaml:6:30: nodes[2].map.dtype: 'u16' is not one of: uint8, int8, uint16, "
               "int16, uint32, int32, uint64, int64, float32, float64, bool, float16, "
               "bfloat16");
  expect_error(replace(kBase, "  - batch",
                       "  - map: {fn: decode, dtype: uint8, shape: [-1, -1]}\n  - batch"),
               "nodes[2].map.shape",
               "p.yaml:6:44: nodes[2].map.shape: may infer (-1) at most one dimension");
  expect_error(replace(kBase, "  - batch", "  - map: {fn: slice}\n  - batch"),
               "nodes[2].map.length",
               "p.yaml:6:10: nodes[2].map.length: missing required parameter 'length'");
  expect_error(replace(kBase, "  - batch", "  - map: {fn: normalize, std: 0}\n  - batch"),
               "nodes[2].map.std", "p.yaml:6:31: nodes[2].map.std: must be greater than zero");
  expect_error(std::string(kBase) + "  - map: {fn: random_crop, length: 2}\n", "nodes[3].map.fn",
               "p.yaml:7:15: nodes[3].map.fn: transform 'random_crop' works on single samples; "
               "put this map before batch");
}

TEST(YamlErrors, OverridesAreNamedInsteadOfALine) {
  ConfigError e = override_error({"nodes[1].shuffle.size=zero"});
  EXPECT_EQ(e.key(), "nodes[1].shuffle.size");
  EXPECT_EQ(std::string(e.what()),
            "--set nodes[1].shuffle.size=zero: nodes[1].shuffle.size: expected an unsigned "
            "integer, got 'zero'");
  // A misspelt node type, or a parameter without the type: named, with what was meant.
  EXPECT_EQ(std::string(override_error({"nodes[1].shufle.size=3"}).what()),
            "--set nodes[1].shufle.size=3: nodes[1] is a 'shuffle' node, whose parameters are "
            "set as nodes[1].shuffle.KEY; did you mean 'shuffle'?");
  EXPECT_EQ(std::string(override_error({"nodes[1].size=10"}).what()),
            "--set nodes[1].size=10: nodes[1] is a 'shuffle' node, whose parameters are set as "
            "nodes[1].shuffle.KEY; did you mean nodes[1].shuffle.size?");
  EXPECT_EQ(std::string(override_error({"nodes[7].shuffle.size=3"}).what()),
            "--set nodes[7].shuffle.size=3: 'nodes' has 3 entries; there is no nodes[7]");
  EXPECT_EQ(std::string(override_error({"seed"}).what()),
            "--set seed: expected key.path=value (e.g. --set seed=7)");
  EXPECT_EQ(std::string(override_error({"nodes[x]=1"}).what()),
            "--set nodes[x]=1: bad key path 'nodes[x]': '[x]' is not a list index");
  EXPECT_EQ(std::string(override_error({"seed=[1"}).what())
                .rfind("--set seed=[1: the value is not valid YAML: ", 0),
            0u);
  EXPECT_EQ(std::string(override_error({"sede=1"}).what()),
            "--set sede=1: unknown top-level key or node name 'sede' (top-level keys: seed, "
            "source, nodes, epochs, workers, checkpoint, plugins; nodes: shard, shuffle, batch); "
            "did you mean 'seed'?");
  EXPECT_EQ(std::string(override_error({"shufle.size=3"}).what()),
            "--set shufle.size=3: unknown top-level key or node name 'shufle' (top-level keys: "
            "seed, source, nodes, epochs, workers, checkpoint, plugins; nodes: shard, shuffle, "
            "batch); did you mean 'shuffle'?");
  // A value set through a node's name is named by the override too.
  e = override_error({"shuffle.size=zero"});
  EXPECT_EQ(e.key(), "nodes[1].shuffle.size");
  EXPECT_EQ(std::string(e.what()),
            "--set shuffle.size=zero: nodes[1].shuffle.size: expected an unsigned integer, got "
            "'zero'");
  // An error elsewhere still names the file's line.
  YamlOptions o;
  o.overrides = {"seed=9"};
  EXPECT_EQ(std::string(error_of(replace(kBase, "size: 100", "size: 0"), o).what()),
            "p.yaml:5:35: nodes[1].shuffle.size: 0 is out of range (must be at least 1)");
}

TEST(YamlErrors, UnreadableFile) {
  try {
    load_yaml_file("/nonexistent/p.yaml");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "cannot read pipeline '/nonexistent/p.yaml': No such file or directory");
  }
}

}  // namespace
}  // namespace flowstate
