// Every YAML pipeline in examples/pipelines/ runs as its comment says: copied next to data
// made by `flowstate gen`, then validated, run and verified with the command.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>
#include <thread>

#include "tests/cli/cli_support.h"

namespace flowstate {
namespace {

using testing::by_step;
using testing::CliProcess;
using testing::CliResult;
using testing::read_lines;
using testing::run_cli;
using testing::TempDir;

namespace fs = std::filesystem;

struct Example {
  std::string file;
  std::string record_bytes;  ///< what the pipeline reads
  std::string records;       ///< a small data set
};

void PrintTo(const Example& e, std::ostream* os) { *os << e.file; }

class Examples : public ::testing::TestWithParam<Example> {};

TEST_P(Examples, RunsOnGeneratedData) {
  const Example& e = GetParam();
  TempDir dir;
  fs::copy_file(fs::path(testing::source_dir()) / "examples/pipelines" / e.file, dir / e.file);
  CliResult r = run_cli({"gen", "records", "--out", "data", "--records", e.records,
                         "--record-bytes", e.record_bytes, "--shards", "3"},
                        dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  r = run_cli({"validate", e.file}, dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("data: ok\n"), std::string::npos);
  r = run_cli({"run", e.file, "--steps", "20", "--digests", "d.txt"}, dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(
      std::regex_search(r.err, std::regex("run finished \\(reached --steps 20\\): 20 batches")))
      << r.err;
  EXPECT_EQ(testing::read_lines(dir / "d.txt").size(), 20u);
  r = run_cli({"verify", e.file, "--steps", "24", "--trials", "3"}, dir.str());
  EXPECT_EQ(r.status, 0) << r.out << r.err;
}

INSTANTIATE_TEST_SUITE_P(Pipelines, Examples,
                         ::testing::Values(Example{"llm_tokens.yaml", "1024", "2048"},
                                           Example{"records_parallel_map.yaml", "256", "512"},
                                           Example{"device_copy.yaml", "64", "3000"}),
                         [](const auto& info) {
                           std::string n = info.param.file.substr(0, info.param.file.find('.'));
                           return n;
                         });

TEST(Examples, MegatronPretrainPacksUint16RowsAndResumesExactly) {
  // As its comment says, on a smaller data set: gen indexed, run with checkpoints, resume.
  TempDir dir;
  fs::copy_file(fs::path(testing::source_dir()) / "examples/pipelines/megatron_pretrain.yaml",
                dir / "megatron_pretrain.yaml");
  CliResult r = run_cli({"gen", "indexed", "--out", "data/corpus", "--docs", "400"}, dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  r = run_cli({"validate", "megatron_pretrain.yaml"}, dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("data: ok\n"), std::string::npos) << r.out;
  r = run_cli({"run", "megatron_pretrain.yaml", "--checkpoint-dir", "full", "--digests", "all.txt"},
              dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  const auto all = testing::read_lines(dir / "all.txt");
  ASSERT_GT(all.size(), 6u);  // ~160 k tokens: about 9 batches of 8 rows of 2048
  r = run_cli({"run", "megatron_pretrain.yaml", "--steps", "3", "--checkpoint-every", "3",
               "--digests", "a.txt"},
              dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  r = run_cli({"run", "megatron_pretrain.yaml", "--resume", "--digests", "b.txt"}, dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  auto resumed = testing::read_lines(dir / "a.txt");
  const auto rest = testing::read_lines(dir / "b.txt");
  resumed.insert(resumed.end(), rest.begin(), rest.end());
  EXPECT_EQ(resumed, all);
  r = run_cli({"inspect", "ckpt", "--json"}, dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("\"name\": \"data/corpus.bin\""), std::string::npos) << r.out;
}

TEST(Examples, ImageClassificationResumesExactlyWithAnotherWorkerCount) {
  // As its comment says, on a smaller data set (96 images, batches of 64: a short last one).
  TempDir dir;
  fs::copy_file(fs::path(testing::source_dir()) / "examples/pipelines/image_classification.yaml",
                dir / "image_classification.yaml");
  CliResult r = run_cli({"gen", "images", "--out", "data", "--samples", "96", "--shards", "2",
                         "--min-side", "200", "--max-side", "400"},
                        dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  r = run_cli({"run", "image_classification.yaml", "--epochs", "2", "--checkpoint-dir", "full",
               "--digests", "all.txt"},
              dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  const auto all = testing::read_lines(dir / "all.txt");
  ASSERT_EQ(all.size(), 4u);
  r = run_cli({"run", "image_classification.yaml", "--epochs", "2", "--steps", "1",
               "--checkpoint-every", "1", "--checkpoint-dir", "part", "--digests", "a.txt"},
              dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  r = run_cli({"run", "image_classification.yaml", "--epochs", "2", "--resume", "--checkpoint-dir",
               "part", "--workers", "1", "--digests", "b.txt"},
              dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  auto resumed = testing::read_lines(dir / "a.txt");
  const auto rest = testing::read_lines(dir / "b.txt");
  resumed.insert(resumed.end(), rest.begin(), rest.end());
  EXPECT_EQ(resumed, all);
}

TEST(Examples, ImageClassificationResumesAfterSigkillWithAnotherWorkerCount) {
  // The example as its comment says, killed mid-run (SIGKILL: no final checkpoint) with 2
  // workers and resumed with 1: every step equals the uninterrupted run's, none lost.
  TempDir dir;
  fs::copy_file(fs::path(testing::source_dir()) / "examples/pipelines/image_classification.yaml",
                dir / "image_classification.yaml");
  CliResult r = run_cli({"gen", "images", "--out", "data", "--samples", "80", "--shards", "2",
                         "--min-side", "200", "--max-side", "400"},
                        dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  // Epochs 0: the run cannot end by itself; batches of 8 and a checkpoint every 2 steps.
  const std::vector<std::string> common{"run",
                                        "image_classification.yaml",
                                        "--epochs",
                                        "0",
                                        "--set",
                                        "nodes[5].batch.size=8",
                                        "--checkpoint-dir",
                                        "ck",
                                        "--checkpoint-every",
                                        "2",
                                        "--digests",
                                        "int.txt"};
  std::vector<std::string> first = common;
  first.insert(first.end(), {"--workers", "2"});
  CliProcess p(first, dir.str());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (read_lines(dir / "int.txt").size() < 7) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no progress in int.txt";
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  p.signal(SIGKILL);
  ASSERT_EQ(p.wait().status, 128 + SIGKILL);
  const std::uint64_t killed_at = read_lines(dir / "int.txt").size();
  const std::string steps = std::to_string(killed_at + 12);  // on into the next epoch
  std::vector<std::string> resume = common;
  resume.insert(resume.end(), {"--workers", "1", "--resume", "--steps", steps});
  r = run_cli(resume, dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("flowstate: resumed from ck/step-"), std::string::npos) << r.err;
  r = run_cli(
      {"run", "image_classification.yaml", "--epochs", "0", "--set", "nodes[5].batch.size=8",
       "--steps", steps, "--checkpoint-dir", "ref", "--digests", "ref.txt"},
      dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  const auto ref = read_lines(dir / "ref.txt");
  ASSERT_EQ(ref.size(), killed_at + 12);
  EXPECT_EQ(by_step(read_lines(dir / "int.txt")), ref);
}

TEST(Examples, LlmTokensDeliversUint16Tokens) {
  TempDir dir;
  fs::copy_file(fs::path(testing::source_dir()) / "examples/pipelines/llm_tokens.yaml",
                dir / "llm_tokens.yaml");
  ASSERT_EQ(
      run_cli({"gen", "records", "--out", "data", "--records", "640", "--record-bytes", "1024"},
              dir.str())
          .status,
      0);
  // Its checkpoint section applies: the run ends with a checkpoint under the YAML's directory.
  CliResult r = run_cli({"run", "llm_tokens.yaml", "--steps", "4"}, dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("flowstate: checkpoint ckpt/step-000000000004\n"), std::string::npos)
      << r.err;
  r = run_cli({"inspect", "ckpt", "--json"}, dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("\"value\": \"uint16\""), std::string::npos);
  EXPECT_NE(r.out.find("\"value\": \"[512]\""), std::string::npos);
}

// ---- mixed_text.yaml: a lines source and a tar source, mixed, filtered, packed ----

/// Copies mixed_text.yaml and its two input files into `dir` and makes their data with
/// `flowstate gen`, as the file's comment says (a smaller data set: about 230 batches).
void prepare_mixed_text(const TempDir& dir) {
  for (const char* f : {"mixed_text.yaml", "mixed_text_lines.yaml", "mixed_text_tar.yaml"})
    fs::copy_file(fs::path(testing::source_dir()) / "examples/pipelines" / f, dir / f);
  CliResult r =
      run_cli({"gen", "lines", "--out", "data", "--docs", "2000", "--shards", "3"}, dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  r = run_cli({"gen", "tar", "--out", "data", "--samples", "800", "--shards", "2"}, dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
}

TEST(Examples, MixedTextRunsOnGeneratedTextAndTarShards) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(prepare_mixed_text(dir));
  CliResult r = run_cli({"validate", "mixed_text.yaml"}, dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("[0] mix: mix\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lines.paths=data/docs-*.txt; lines.format=text; lines.field=tokens;"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("tar.paths=data/shard-*.tar; tar.fields=tokens;"), std::string::npos);
  EXPECT_NE(r.out.find("data: ok\n"), std::string::npos);
  // To the end of the data, with the checkpoint section's periodic checkpoints.
  r = run_cli({"run", "mixed_text.yaml", "--digests", "d.txt"}, dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      r.err, m,
      std::regex("run finished \\(end of data\\): ([0-9]+) batches, steps 0\\.\\.[0-9]+, "
                 "epoch 0, ([0-9]+) samples, ")))
      << r.err;
  const std::size_t batches = std::stoul(m[1]);
  EXPECT_GT(batches, 150u);
  // Batches of 16 rows, the last one short.
  EXPECT_GT(std::stoul(m[2]), (batches - 1) * 16);
  EXPECT_LE(std::stoul(m[2]), batches * 16);
  EXPECT_EQ(read_lines(dir / "d.txt").size(), batches);
  EXPECT_NE(r.err.find("flowstate: checkpoint ckpt/step-000000000100\n"), std::string::npos);
  r = run_cli({"inspect", "ckpt"}, dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("step: " + std::to_string(batches) + " "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  mix.stop = all_exhausted\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  pack.length = 64\n"), std::string::npos) << r.out;
  // Every node state decodes, the mix's inputs included.
  EXPECT_NE(r.out.find("  mix (mix): epoch "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"nodes\":[{\"name\":\"lines\",\"type\":\"lines\",\"state\":"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("  batch (batch): epoch "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("not decoded"), std::string::npos) << r.out;
  r = run_cli({"verify", "mixed_text.yaml", "--steps", "60", "--trials", "3"}, dir.str());
  EXPECT_EQ(r.status, 0) << r.out << r.err;
}

TEST(Examples, MixedTextResumedRunEqualsAnUninterruptedOne) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(prepare_mixed_text(dir));
  CliResult r = run_cli({"run", "mixed_text.yaml", "--checkpoint-dir", "ref_ck", "--digests",
                         "full.txt", "--provenance", "full_prov.txt"},
                        dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  const auto full = read_lines(dir / "full.txt");
  ASSERT_GT(full.size(), 150u);
  // Stopped at step 137 with the pipeline's checkpoint directory, then resumed from the last
  // periodic checkpoint, as after a crash: steps 120..136 run again.
  r = run_cli({"run", "mixed_text.yaml", "--steps", "137", "--checkpoint-every", "20", "--digests",
               "part.txt", "--provenance", "part_prov.txt"},
              dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("flowstate: checkpoint ckpt/step-000000000120\n"), std::string::npos);
  EXPECT_NE(r.err.find("flowstate: checkpoint ckpt/step-000000000137\n"), std::string::npos);
  fs::remove_all(dir / "ckpt/step-000000000137");
  r = run_cli({"run", "mixed_text.yaml", "--resume", "--digests", "part.txt", "--provenance",
               "part_prov.txt"},
              dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(
      r.err.find("flowstate: resumed from ckpt/step-000000000120: continuing with step 120\n"),
      std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("run finished (end of data): " + std::to_string(full.size() - 120) +
                       " batches, steps 120.."),
            std::string::npos)
      << r.err;
  EXPECT_EQ(read_lines(dir / "part.txt").size(), 137u + full.size() - 120);
  EXPECT_EQ(by_step(read_lines(dir / "part.txt")), full);
  EXPECT_EQ(by_step(read_lines(dir / "part_prov.txt")), read_lines(dir / "full_prov.txt"));
}

TEST(Examples, MixedTextSigtermThenResumeEqualsAnUninterruptedRun) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(prepare_mixed_text(dir));
  // Epochs 0: the run cannot end by itself; a checkpoint every 7 steps (each fsynced) keeps
  // it slow enough to be stopped mid-run.
  const std::vector<std::string> common{
      "run", "mixed_text.yaml", "--epochs", "0", "--checkpoint-every", "7", "--digests", "int.txt"};
  CliProcess p(common, dir.str());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (read_lines(dir / "int.txt").size() < 40) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no progress in int.txt";
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  p.signal(SIGTERM);
  CliResult r = p.wait();
  ASSERT_EQ(r.status, 128 + SIGTERM) << r.err;  // 143: preempted, not finished
  ASSERT_NE(r.err.find("run finished (interrupted by SIGTERM)"), std::string::npos) << r.err;
  const std::uint64_t last = std::stoull(read_lines(dir / "int.txt").back());
  char ck[64];
  std::snprintf(ck, sizeof(ck), "flowstate: checkpoint ckpt/step-%012llu\n",
                static_cast<unsigned long long>(last + 1));
  EXPECT_NE(r.err.find(ck), std::string::npos) << r.err;

  std::vector<std::string> resume = common;
  resume.insert(resume.end(), {"--resume", "--steps", std::to_string(last + 300)});
  r = run_cli(resume, dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  r = run_cli({"run", "mixed_text.yaml", "--epochs", "0", "--steps", std::to_string(last + 300),
               "--checkpoint-dir", "ref_ck", "--digests", "ref.txt"},
              dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  // Not one batch repeated or lost, into the next epoch.
  const auto ref = read_lines(dir / "ref.txt");
  EXPECT_EQ(read_lines(dir / "int.txt"), ref);
  ASSERT_EQ(ref.back().rfind(std::to_string(last + 299) + " ", 0), 0u) << ref.back();
  EXPECT_GE(std::stoull(ref.back().substr(ref.back().find(' ') + 1)), 1u) << ref.back();
}

#ifdef FLOWSTATE_MAIN_JOB
TEST(Examples, MainJobHelpPrintsUsageAndWritesNothing) {
  TempDir dir;
  for (const char* help : {"--help", "-h"}) {
    CliResult r = testing::run_program(FLOWSTATE_MAIN_JOB, {help}, dir.str());
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out.rfind("usage: main_job [--dir DIR] [--records N] [--workers W]\n", 0), 0u)
        << r.out;
    EXPECT_NE(r.out.find("default: build/demo"), std::string::npos) << r.out;
  }
  CliResult r = testing::run_program(FLOWSTATE_MAIN_JOB, {"--records"}, dir.str());
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err.rfind("main_job: --records needs a value\nusage: main_job", 0), 0u) << r.err;
  r = testing::run_program(FLOWSTATE_MAIN_JOB, {"--recrods", "10"}, dir.str());
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "main_job wrote into the directory";
}

TEST(Examples, MainJobWritesUnderBuildByDefault) {
  TempDir dir;
  CliResult r = testing::run_program(FLOWSTATE_MAIN_JOB, {"--records", "8192"}, dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("under build/demo/data"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("OK: all "), std::string::npos) << r.out;
  EXPECT_TRUE(std::filesystem::exists(dir / "build/demo/data/train-00000.bin"));
  EXPECT_TRUE(std::filesystem::is_directory(dir / "build/demo/checkpoints"));
  // Nothing beside build/.
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++entries;
  EXPECT_EQ(entries, 1u);
}
#endif

// ---- text_pretrain.yaml: raw text, tokenized on the fly, packed ----

/// Runs text_pretrain.sh as its comment says, in `dir`, on a small corpus and model (the
/// script makes both), with `run` going to `flowstate run`.
CliResult text_pretrain(const TempDir& dir, const std::vector<std::string>& run) {
  std::vector<std::string> args{
      (fs::path(testing::source_dir()) / "examples/pipelines/text_pretrain.sh").string(),
      "--dir",
      dir.str(),
      "--docs",
      "400",
      "--train-docs",
      "150",
      "--vocab",
      "1000",
      "--"};
  args.insert(args.end(), run.begin(), run.end());
  ::setenv("FLOWSTATE_CLI", testing::cli_path().c_str(), 1);
  return testing::run_program("/bin/bash", args, dir.str());
}

TEST(Examples, TextPretrainRunsFromOneCommandAndResumesAfterSigkillWithOtherWorkers) {
  TempDir dir;
  CliResult r = text_pretrain(dir, {"--checkpoint-dir", "full", "--digests", "all.txt"});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("trained spm/m.model (1000 pieces) on 150 documents"), std::string::npos)
      << r.err;
  const auto all = read_lines(dir / "all.txt");
  ASSERT_GT(all.size(), 8u) << r.err;  // ~280 k ids: about 17 batches of 8 rows of 2048
  r = run_cli({"validate", "text_pretrain.yaml"}, dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("model: xxh3:"), std::string::npos) << r.out;

  // Epochs 0: the run cannot end by itself; a checkpoint every 2 steps (each fsynced) keeps it
  // slow enough to be killed mid-run. SIGKILL: no final checkpoint, whatever it was doing.
  const std::vector<std::string> common{
      "run", "text_pretrain.yaml", "--epochs", "0",         "--checkpoint-dir",
      "ck",  "--checkpoint-every", "2",        "--digests", "int.txt"};
  std::vector<std::string> first = common;
  first.insert(first.end(), {"--workers", "2"});
  CliProcess p(first, dir.str());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (read_lines(dir / "int.txt").size() < 25) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no progress in int.txt";
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  p.signal(SIGKILL);
  ASSERT_EQ(p.wait().status, 128 + SIGKILL);
  const std::uint64_t killed_at = read_lines(dir / "int.txt").size();
  std::vector<std::string> resume = common;
  resume.insert(resume.end(),
                {"--workers", "1", "--resume", "--steps", std::to_string(killed_at + 20)});
  r = run_cli(resume, dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("flowstate: resumed from ck/step-"), std::string::npos) << r.err;
  r = run_cli({"run", "text_pretrain.yaml", "--epochs", "0", "--steps",
               std::to_string(killed_at + 20), "--checkpoint-dir", "ref", "--digests", "ref.txt"},
              dir.str());
  ASSERT_EQ(r.status, 0) << r.err;
  // Steps repeated after the resume are identical (by_step checks), none lost, into epoch 1.
  const auto ref = read_lines(dir / "ref.txt");
  EXPECT_EQ(by_step(read_lines(dir / "int.txt")), ref);
  EXPECT_EQ(std::vector<std::string>(ref.begin(), ref.begin() + all.size()), all);

  // A retrained model (another vocabulary) is another pipeline: the resume is refused.
  ASSERT_EQ(run_cli({"gen", "text", "--out", "spm2", "--docs", "150", "--txt"}, dir.str()).status,
            0);
  ASSERT_EQ(std::system(("cd '" + dir.str() +
                         "' && spm_train --input=spm2/text-00000.txt --model_prefix=spm/m "
                         "--vocab_size=900 --max_sentence_length=65536 --minloglevel=2 "
                         ">/dev/null 2>&1")
                            .c_str()),
            0);
  r = run_cli({"run", "text_pretrain.yaml", "--checkpoint-dir", "ck", "--resume"}, dir.str());
  EXPECT_EQ(r.status, 4) << r.err;
  EXPECT_NE(r.err.find("tokenize.model"), std::string::npos) << r.err;
}

TEST(Examples, TokenizeErrorsExitWithTheirStatus) {
  TempDir dir;
  testing::write_file(dir / "p.yaml",
                      "source: {type: lines, paths: 'data/*.jsonl', format: jsonl, "
                      "json_fields: [text]}\n"
                      "nodes:\n  - tokenize: {model: none.model}\n  - batch: {size: 2}\n");
  fs::create_directories(dir / "data");
  testing::write_file(dir / "data/a.jsonl", "{\"text\": \"one\"}\n{\"text\": 7}\n");
  CliResult r = run_cli({"run", "p.yaml"}, dir.str());
  EXPECT_EQ(r.status, 2) << r.err;  // configuration: the model cannot be read
  EXPECT_NE(r.err.find("p.yaml:3:23: nodes[0].tokenize.model: cannot read the SentencePiece "
                       "model '"),
            std::string::npos)
      << r.err;
  testing::write_file(dir / "none.model", "not a model");
  r = run_cli({"validate", "p.yaml", "--no-data"}, dir.str());
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("none.model' is not a SentencePiece model (11 bytes: "), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace flowstate
