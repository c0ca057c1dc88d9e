// `flowstate gen lines` and `flowstate gen tar` run as a user would: the files they write,
// read back by the `lines` and `tar` sources (and by GNU tar when it is installed), and every
// error they report.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "flowstate/nodes/sources/index_cache.h"
#include "flowstate/nodes/sources/indexed.h"
#include "flowstate/nodes/sources/lines.h"
#include "flowstate/nodes/sources/tar.h"
#include "tests/cli/cli_support.h"

namespace flowstate {
namespace {

using testing::CliResult;
using testing::read_file;
using testing::read_lines;
using testing::run_cli;
using testing::TempDir;
using testing::write_file;

namespace fs = std::filesystem;

class Gen : public ::testing::Test {
 protected:
  CliResult run(const std::vector<std::string>& args) { return run_cli(args, dir_.str()); }
  std::string path(const std::string& name) const { return dir_ / name; }
  /// The names of the files in `sub`, sorted.
  std::vector<std::string> files(const std::string& sub) const {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(path(sub)))
      names.insert(e.path().filename().string());
    return {names.begin(), names.end()};
  }
  TempDir dir_;
};

/// The bytes of a uint8 tensor as text.
std::string text_of(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::kUInt8);
  return std::string(static_cast<const char*>(t.data()), t.nbytes());
}

/// Every record of a source, read in index order with `read`.
template <class Source>
std::vector<Sample> read_all(const Source& src) {
  std::vector<Sample> out;
  for (std::uint64_t i = 0; i < src.size(0); ++i) {
    Sample s;
    src.read(src.at(0, i), s);
    out.push_back(std::move(s));
  }
  return out;
}

/// The output of a shell command (its status in `status`).
std::string shell(const std::string& command, int* status) {
  std::string out;
  std::FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) {
    *status = -1;
    return out;
  }
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  *status = ::pclose(p);
  return out;
}

bool gnu_tar_installed() {
  int status = 0;
  return shell("tar --version 2>/dev/null", &status).find("GNU tar") != std::string::npos &&
         status == 0;
}

// ---- lines ----

TEST_F(Gen, LinesWritesShardsOfLowercaseDocumentsOfVaryingLength) {
  CliResult r = run({"gen", "lines", "--out", "data", "--docs", "300", "--shards", "3"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex("^flowstate: wrote 300 documents \\([0-9.]+ kB\\) in 3 files to "
                        "data/docs-\\*\\.txt in [0-9.]+ s\n$")))
      << r.err;
  EXPECT_EQ(files("data"),
            (std::vector<std::string>{"docs-00000.txt", "docs-00001.txt", "docs-00002.txt"}));
  std::vector<std::string> docs;
  for (int s = 0; s < 3; ++s) {
    const std::string text = read_file(path("data/docs-0000" + std::to_string(s) + ".txt"));
    ASSERT_FALSE(text.empty());
    EXPECT_EQ(text.back(), '\n');  // every line ends, an empty last one too
    const auto lines = read_lines(path("data/docs-0000" + std::to_string(s) + ".txt"));
    EXPECT_EQ(lines.size(), 100u) << "shard " << s;
    docs.insert(docs.end(), lines.begin(), lines.end());
  }
  std::size_t empty = 0, short_ones = 0;
  for (const auto& d : docs) {
    EXPECT_LE(d.size(), 200u);
    empty += d.empty();
    short_ones += !d.empty() && d.size() < 3;
    for (std::size_t j = 0; j < d.size(); ++j) {
      const bool letter = d[j] >= 'a' && d[j] <= 'z';
      const bool space = d[j] == ' ' && j > 0 && j + 1 < d.size() && d[j - 1] != ' ';
      EXPECT_TRUE(letter || space) << "'" << d << "' byte " << j;
    }
  }
  // About 1 in 10 of each: some for a length filter to drop.
  EXPECT_GT(empty, 10u);
  EXPECT_LT(empty, 60u);
  EXPECT_GT(short_ones, 5u);
  // The same data set in one shard: the same documents; another seed: others.
  ASSERT_EQ(run({"gen", "lines", "--out", "one", "--docs", "300"}).status, 0);
  EXPECT_EQ(read_lines(path("one/docs-00000.txt")), docs);
  ASSERT_EQ(run({"gen", "lines", "--out", "again", "--docs", "300", "--shards", "3", "--seed", "7"})
                .status,
            0);
  EXPECT_EQ(read_file(path("again/docs-00001.txt")), read_file(path("data/docs-00001.txt")));
  ASSERT_EQ(run({"gen", "lines", "--out", "s8", "--docs", "300", "--seed", "8"}).status, 0);
  EXPECT_NE(read_lines(path("s8/docs-00000.txt")), docs);
}

TEST_F(Gen, JsonLinesHoldTheSameDocumentsAsTokenIds) {
  ASSERT_EQ(run({"gen", "lines", "--out", "data", "--docs", "120", "--shards", "2"}).status, 0);
  CliResult r = run({"gen", "lines", "--out", "data", "--docs", "120", "--shards", "2", "--jsonl"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find(" in 2 files to data/docs-*.jsonl in "), std::string::npos) << r.err;
  // Text and JSON Lines data sets live side by side: their globs differ.
  EXPECT_EQ(files("data"), (std::vector<std::string>{"docs-00000.jsonl", "docs-00000.txt",
                                                     "docs-00001.jsonl", "docs-00001.txt"}));
  std::uint64_t id = 0;
  for (int s = 0; s < 2; ++s) {
    const auto text = read_lines(path("data/docs-0000" + std::to_string(s) + ".txt"));
    const auto json = read_lines(path("data/docs-0000" + std::to_string(s) + ".jsonl"));
    ASSERT_EQ(json.size(), text.size());
    for (std::size_t k = 0; k < json.size(); ++k, ++id) {
      const auto j = nlohmann::json::parse(json[k]);
      EXPECT_EQ(j.size(), 2u);
      EXPECT_EQ(j["id"], id);
      std::string doc;
      for (const auto& t : j["tokens"]) doc.push_back(static_cast<char>(t.get<int>()));
      EXPECT_EQ(doc, text[k]) << json[k];
    }
  }
  EXPECT_EQ(id, 120u);
  EXPECT_EQ(read_lines(path("data/docs-00000.jsonl"))[1], R"({"id": 1, "tokens": []})");
}

TEST_F(Gen, TextWritesEnglishLikeDocumentsAsJsonLinesAndAsPlainLines) {
  CliResult r =
      run({"gen", "text", "--out", "t", "--docs", "60", "--words", "40", "--shards", "2"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("wrote 60 documents ("), std::string::npos) << r.err;
  ASSERT_EQ(run({"gen", "text", "--out", "t", "--docs", "60", "--words", "40", "--txt"}).status, 0);
  EXPECT_EQ(files("t"),
            (std::vector<std::string>{"text-00000.jsonl", "text-00000.txt", "text-00001.jsonl"}));
  // JSON Lines {"text": ...} the lines source reads back as the documents' bytes; the same
  // documents, their paragraph breaks as spaces, one per line with --txt.
  LinesSource json(
      "lines",
      {.paths = {path("t/text-*.jsonl")}, .format = LinesFormat::kJsonl, .json_fields = {"text"}});
  const auto lines = read_lines(path("t/text-00000.txt"));
  ASSERT_EQ(json.size(0), 60u);
  ASSERT_EQ(lines.size(), 60u);
  std::vector<std::size_t> words;
  bool paragraphs = false, accents = false;
  for (std::uint64_t i = 0; i < 60; ++i) {
    Sample s;
    json.read(json.at(0, i), s);
    const std::string doc = text_of(s.at("text"));
    EXPECT_EQ(doc, synthetic_text(7, i, 40));
    std::string flat = doc;
    std::replace(flat.begin(), flat.end(), '\n', ' ');
    EXPECT_EQ(lines[i], flat);
    // Sentences: a capital first, a full stop, question or exclamation mark last.
    ASSERT_FALSE(doc.empty());
    EXPECT_TRUE(std::isupper(static_cast<unsigned char>(doc[0])) || doc[0] < 0) << doc;
    EXPECT_NE(std::string(".?!").find(doc.back()), std::string::npos) << doc;
    words.push_back(static_cast<std::size_t>(std::count(flat.begin(), flat.end(), ' ') + 1));
    paragraphs = paragraphs || doc.find("\n\n") != std::string::npos;
    accents = accents || doc.find("\xc3") != std::string::npos;
  }
  std::sort(words.begin(), words.end());
  EXPECT_GT(words[30], 25u);  // the median near --words 40
  EXPECT_LT(words[30], 65u);
  EXPECT_LT(words.front(), words.back() / 2);  // varied lengths
  EXPECT_TRUE(paragraphs);
  EXPECT_TRUE(accents);  // "café", "Zürich": not all ASCII
  EXPECT_NE(synthetic_text(8, 0, 40), synthetic_text(7, 0, 40));  // the seed matters
}

TEST_F(Gen, TheLinesSourceReadsBothForms) {
  ASSERT_EQ(run({"gen", "lines", "--out", "data", "--docs", "90", "--shards", "4"}).status, 0);
  ASSERT_EQ(
      run({"gen", "lines", "--out", "data", "--docs", "90", "--shards", "4", "--jsonl"}).status, 0);
  LinesSource text("lines", {.paths = {path("data/docs-*.txt")}, .field = "tokens"});
  LinesSource json("lines", {.paths = {path("data/docs-*.jsonl")},
                             .format = LinesFormat::kJsonl,
                             .json_fields = {"id", "tokens"}});
  ASSERT_EQ(text.size(0), 90u);
  ASSERT_EQ(json.size(0), 90u);
  const auto a = read_all(text);
  const auto b = read_all(json);
  std::vector<std::string> want;
  for (int s = 0; s < 4; ++s)
    for (const auto& l : read_lines(path("data/docs-0000" + std::to_string(s) + ".txt")))
      want.push_back(l);
  for (std::size_t i = 0; i < 90; ++i) {
    EXPECT_EQ(text_of(a[i].at("tokens")), want[i]) << i;
    EXPECT_EQ(b[i].at("id").values<std::int64_t>()[0], static_cast<std::int64_t>(i));
    std::string doc;
    for (auto t : b[i].at("tokens").values<std::int64_t>()) doc.push_back(static_cast<char>(t));
    EXPECT_EQ(doc, want[i]) << i;
  }
}

// ---- tar ----

TEST_F(Gen, TarWritesUstarShardsTheTarSourceReads) {
  CliResult r = run({"gen", "tar", "--out", "data", "--samples", "50", "--shards", "2"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("flowstate: wrote 50 samples ("), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" in 2 files to data/shard-*.tar in "), std::string::npos) << r.err;
  EXPECT_EQ(files("data"), (std::vector<std::string>{"shard-00000.tar", "shard-00001.tar"}));
  for (const char* f : {"data/shard-00000.tar", "data/shard-00001.tar"}) {
    const std::string bytes = read_file(path(f));
    ASSERT_EQ(bytes.size() % 512, 0u) << f;
    ASSERT_GE(bytes.size(), 1024u);
    EXPECT_EQ(bytes.substr(bytes.size() - 1024), std::string(1024, '\0')) << f;
    // The first header: a ustar regular file named by the first sample's key.
    EXPECT_EQ(bytes.substr(257, 8), std::string("ustar\0"
                                                "00",
                                                8))
        << f;
    EXPECT_EQ(bytes[156], '0');
  }
  EXPECT_EQ(read_file(path("data/shard-00001.tar")).substr(0, 17),
            std::string("000000025.tokens\0", 17));

  TarSource src("tar", {.paths = {path("data/shard-*.tar")}});
  ASSERT_EQ(src.size(0), 50u);
  const auto samples = read_all(src);
  std::size_t empty = 0;
  std::set<std::string> labels;
  for (std::uint64_t i = 0; i < 50; ++i) {
    char key[16];
    std::snprintf(key, sizeof(key), "%09llu", static_cast<unsigned long long>(i));
    EXPECT_EQ(src.key(src.at(0, i)), key);
    EXPECT_EQ(samples[i].size(), 2u);
    const std::string doc = text_of(samples[i].at("tokens"));
    empty += doc.empty();
    EXPECT_LE(doc.size(), 200u);
    for (char c : doc) EXPECT_TRUE((c >= 'a' && c <= 'z') || c == ' ') << doc;
    const std::string cls = text_of(samples[i].at("cls"));
    ASSERT_EQ(cls.size(), 1u);
    EXPECT_TRUE(cls[0] >= '0' && cls[0] <= '9') << cls;
    labels.insert(cls);
  }
  EXPECT_GT(empty, 0u);
  EXPECT_GT(labels.size(), 3u);
  // Other documents than `gen lines` makes from the same seed.
  ASSERT_EQ(run({"gen", "lines", "--out", "data", "--docs", "50"}).status, 0);
  const auto lines = read_lines(path("data/docs-00000.txt"));
  std::size_t same = 0;
  for (std::uint64_t i = 0; i < 50; ++i)
    same += !lines[i].empty() && lines[i] == text_of(samples[i].at("tokens"));
  EXPECT_EQ(same, 0u);
}

TEST_F(Gen, GnuTarListsAndExtractsTheMembers) {
  if (!gnu_tar_installed()) GTEST_SKIP() << "GNU tar is not installed";
  ASSERT_EQ(
      run({"gen", "tar", "--out", "data", "--samples", "7", "--shards", "2", "--seed", "3"}).status,
      0);
  int status = -1;
  const std::string list = shell("tar tf '" + path("data/shard-00001.tar") + "' 2>&1", &status);
  EXPECT_EQ(status, 0) << list;
  EXPECT_EQ(list,
            "000000003.tokens\n000000003.cls\n000000004.tokens\n000000004.cls\n"
            "000000005.tokens\n000000005.cls\n000000006.tokens\n000000006.cls\n");
  // Verbose: regular files, mode 0644, owner 0, mtime 0.
  const std::string verbose = shell("tar tvf '" + path("data/shard-00000.tar") + "' 2>&1", &status);
  EXPECT_EQ(status, 0) << verbose;
  EXPECT_EQ(verbose.rfind("-rw-r--r-- 0/0", 0), 0u) << verbose;
  EXPECT_NE(verbose.find("1970-01-01 00:00 000000000.cls\n"), std::string::npos) << verbose;
  TarSource src("tar", {.paths = {path("data/shard-*.tar")}});
  ASSERT_EQ(src.size(0), 7u);
  const auto samples = read_all(src);
  for (std::uint64_t i = 0; i < 7; ++i) {
    const std::string shard = path(i < 3 ? "data/shard-00000.tar" : "data/shard-00001.tar");
    for (const char* ext : {"tokens", "cls"}) {
      const std::string member = std::string(src.key(src.at(0, i))) + "." + ext;
      const std::string bytes = shell("tar xOf '" + shard + "' " + member, &status);
      EXPECT_EQ(status, 0) << member;
      EXPECT_EQ(bytes, text_of(samples[i].at(ext))) << member;
    }
  }
}

TEST_F(Gen, MoreShardsThanItemsLeavesEmptyShardsTheSourcesRead) {
  ASSERT_EQ(run({"gen", "lines", "--out", "data", "--docs", "2", "--shards", "4"}).status, 0);
  ASSERT_EQ(run({"gen", "tar", "--out", "data", "--samples", "1", "--shards", "3"}).status, 0);
  EXPECT_EQ(read_file(path("data/docs-00000.txt")), "");
  EXPECT_EQ(read_file(path("data/shard-00000.tar")), std::string(1024, '\0'));
  LinesSource lines("lines", {.paths = {path("data/docs-*.txt")}});
  EXPECT_EQ(lines.size(0), 2u);
  TarSource tar("tar", {.paths = {path("data/shard-*.tar")}});
  EXPECT_EQ(tar.size(0), 1u);
  EXPECT_EQ(tar.key(tar.at(0, 0)), "000000000");
}

TEST_F(Gen, ReplacesItsOwnFilesWithTheirCachedIndexes) {
  ASSERT_EQ(run({"gen", "lines", "--out", "data", "--docs", "40", "--shards", "2"}).status, 0);
  const std::string file = path("data/docs-00000.txt");
  { LinesSource once("lines", {.paths = {file}}); }
  ASSERT_TRUE(fs::exists(index_cache_path(file)));
  ASSERT_EQ(
      run({"gen", "lines", "--out", "data", "--docs", "40", "--shards", "2", "--seed", "1"}).status,
      0);
  EXPECT_FALSE(fs::exists(index_cache_path(file)));
  LinesSource again("lines", {.paths = {file}, .field = "tokens"});
  const auto lines = read_lines(file);
  ASSERT_EQ(again.size(0), lines.size());
  const auto samples = read_all(again);
  for (std::size_t i = 0; i < lines.size(); ++i)
    EXPECT_EQ(text_of(samples[i].at("tokens")), lines[i]);
  // A cache file matches no glob of a data set: regenerating beside it is fine.
  { LinesSource once("lines", {.paths = {file}}); }
  EXPECT_EQ(run({"gen", "lines", "--out", "data", "--docs", "40", "--shards", "2"}).status, 0);
  // No temporary file is left behind.
  for (const auto& name : files("data")) EXPECT_EQ(name.find(".tmp"), std::string::npos) << name;
}

// ---- errors ----

TEST_F(Gen, RefusesADirectoryWithOtherFilesOfTheDataSetsGlob) {
  ASSERT_EQ(run({"gen", "lines", "--out", "data", "--docs", "30", "--shards", "3"}).status, 0);
  CliResult r = run({"gen", "lines", "--out", "data", "--docs", "30", "--shards", "2"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err,
            "flowstate: error: --out: 'data' already holds 'docs-00002.txt', which is not part of "
            "this data set; use an empty directory (files named docs-*.txt would be read with "
            "it)\n");
  write_file(path("data/docs-extra.jsonl"), "{}\n");
  r = run({"gen", "lines", "--out", "data", "--docs", "30", "--jsonl"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err,
            "flowstate: error: --out: 'data' already holds 'docs-extra.jsonl', which is not part "
            "of this data set; use an empty directory (files named docs-*.jsonl would be read "
            "with it)\n");
  write_file(path("data/shard-old.tar"), "");
  r = run({"gen", "tar", "--out", "data", "--samples", "10"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err,
            "flowstate: error: --out: 'data' already holds 'shard-old.tar', which is not part of "
            "this data set; use an empty directory (files named shard-*.tar would be read with "
            "it)\n");
  // Nothing was written.
  EXPECT_EQ(files("data"),
            (std::vector<std::string>{"docs-00000.txt", "docs-00001.txt", "docs-00002.txt",
                                      "docs-extra.jsonl", "shard-old.tar"}));
  // Other names are no business of these data sets.
  write_file(path("tars/notes.txt"), "x");
  EXPECT_EQ(run({"gen", "tar", "--out", "tars", "--samples", "10"}).status, 0);
  write_file(path("file"), "x");
  r = run({"gen", "tar", "--out", "file", "--samples", "10"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err.rfind("flowstate: error: --out: cannot create 'file': ", 0), 0u) << r.err;
}

TEST_F(Gen, UsageErrorsNameTheOption) {
  struct Case {
    std::vector<std::string> args;
    std::string err;
  };
  const std::string see = " (see 'flowstate gen --help')\n";
  const std::vector<Case> cases = {
      {{"gen", "lines", "--out", "d"}, "--docs is required"},
      {{"gen", "tar", "--out", "d"}, "--samples is required"},
      {{"gen", "lines", "--docs", "5"}, "--out is required"},
      {{"gen", "tar", "--samples", "5"}, "--out is required"},
      {{"gen", "lines", "--out", "d", "--docs", "ten"},
       "--docs expects a non-negative integer, got 'ten'"},
      {{"gen", "lines", "--out", "d", "--docs", "-3"},
       "--docs expects a non-negative integer, got '-3'"},
      {{"gen", "lines", "--out", "d", "--docs", "1000000001"},
       "--docs 1000000001 is out of range (must be between 0 and 1000000000)"},
      {{"gen", "tar", "--out", "d", "--samples", "2x"},
       "--samples expects a non-negative integer, got '2x'"},
      {{"gen", "tar", "--out", "d", "--samples", "1000000001"},
       "--samples 1000000001 is out of range (must be between 0 and 1000000000)"},
      {{"gen", "lines", "--out", "d", "--docs", "5", "--shards", "0"},
       "--shards 0 is out of range (must be between 1 and 1000000)"},
      {{"gen", "tar", "--out", "d", "--samples", "5", "--shards", "1000001"},
       "--shards 1000001 is out of range (must be between 1 and 1000000)"},
      {{"gen", "tar", "--out", "d", "--samples", "5", "--seed", "x"},
       "--seed expects a non-negative integer, got 'x'"},
      {{"gen", "lines", "--out", "d", "--docs"}, "--docs needs a value"},
      {{"gen", "lines", "--out", "d", "--docs", "5", "--jsonl=yes"}, "--jsonl takes no value"},
      {{"gen", "lines", "--out", "d", "--docs", "5", "--records", "5"},
       "unknown option '--records'"},
      {{"gen", "tar", "--out", "d", "--samples", "5", "--jsonl"}, "unknown option '--jsonl'"},
      {{"gen", "records", "--out", "d", "--docs", "5"}, "unknown option '--docs'"},
      {{"gen", "--out", "d"},
       "expected 'flowstate gen KIND --out DIR ...' with KIND records, lines, tar, indexed, "
       "text or images"},
      {{"gen", "lines", "tar", "--out", "d"},
       "expected 'flowstate gen KIND --out DIR ...' with KIND records, lines, tar, indexed, "
       "text or images"},
      {{"gen", "parquet", "--out", "d"},
       "unknown data set kind 'parquet' (records, lines, tar, indexed, text or images)"},
  };
  for (const auto& c : cases) {
    CliResult r = run(c.args);
    EXPECT_EQ(r.status, 2) << c.err;
    EXPECT_EQ(r.err, "flowstate: error: " + c.err + see);
  }
  EXPECT_FALSE(fs::exists(path("d")));
}

TEST_F(Gen, HelpDescribesEveryKind) {
  for (const char* kind : {"records", "lines", "tar"}) {
    CliResult r = run({"gen", kind, "--help"});
    EXPECT_EQ(r.status, 0);
    EXPECT_EQ(r.out.rfind("usage: flowstate gen records --out DIR", 0), 0u) << r.out;
    EXPECT_NE(r.out.find("\n       flowstate gen lines --out DIR --docs N [--shards S] [--seed X] "
                         "[--jsonl]\n"),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("\n       flowstate gen tar --out DIR --samples N [--shards S] "
                         "[--seed X]\n"),
              std::string::npos)
        << r.out;
  }
  CliResult r = run({"--help"});
  EXPECT_NE(r.out.find("\n  gen        write a synthetic data set: records, text lines or tar "
                       "shards\n"),
            std::string::npos)
      << r.out;
}

}  // namespace
}  // namespace flowstate

namespace flowstate {
namespace {

TEST_F(Gen, IndexedWritesAMegatronDataSetTheIndexedSourceReads) {
  CliResult r = run({"gen", "indexed", "--out", "data/corpus", "--docs", "2000"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex("^flowstate: wrote 2000 documents of [0-9]+ uint16 tokens \\(")))
      << r.err;
  EXPECT_EQ(files("data"), (std::vector<std::string>{"corpus.bin", "corpus.idx"}));
  IndexedSource src("indexed", {.paths = {path("data/corpus.idx")}});
  ASSERT_EQ(src.size(0), 2000u);
  std::vector<std::int64_t> lengths;
  std::uint64_t tokens = 0;
  for (std::uint64_t i = 0; i < 2000; ++i) {
    Sample s;
    src.read(src.at(0, i), s);
    const Tensor& t = s.at("tokens");
    ASSERT_EQ(t.dtype(), DType::kUInt16);
    lengths.push_back(t.numel());
    tokens += static_cast<std::uint64_t>(t.numel());
    for (std::int64_t j = 0; j < t.numel(); ++j) {
      const auto v = static_cast<const std::uint16_t*>(t.data())[j];
      ASSERT_TRUE(v >= 1 && v <= 50256) << v;
    }
  }
  EXPECT_EQ(fs::file_size(path("data/corpus.bin")), tokens * 2);
  // Lognormal, median 400, sigma 1: the sample median within 10%.
  std::nth_element(lengths.begin(), lengths.begin() + 1000, lengths.end());
  EXPECT_NEAR(static_cast<double>(lengths[1000]), 400.0, 40.0);

  // int32, and the same documents again for the same seed.
  r = run({"gen", "indexed", "--out", "wide/corpus", "--docs", "2000", "--dtype", "int32"});
  ASSERT_EQ(r.status, 0) << r.err;
  IndexedSource wide("indexed", {.paths = {path("wide/corpus.idx")}});
  for (std::uint64_t i : {0u, 777u, 1999u}) {
    Sample a, b;
    src.read(src.at(0, i), a);
    wide.read(wide.at(0, i), b);
    ASSERT_EQ(b.at("tokens").dtype(), DType::kInt32);
    ASSERT_EQ(a.at("tokens").numel(), b.at("tokens").numel());
    for (std::int64_t j = 0; j < a.at("tokens").numel(); ++j)
      EXPECT_EQ(static_cast<const std::uint16_t*>(a.at("tokens").data())[j],
                static_cast<const std::int32_t*>(b.at("tokens").data())[j]);
  }
  r = run({"gen", "indexed", "--out", "x", "--docs", "5", "--dtype", "float32"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--dtype: expected uint16 or int32, got 'float32'"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace flowstate
