// Issue 24 (text): LLM pre-training rows from raw text, tokenized in the pipeline —
// `lines {jsonl, text}` → `shuffle: {mode: global}` → `tokenize: {model, dtype: uint16}` →
// `pack: {length: 2048, separator: EOS}` → `batch: {size: 8}` — and the same corpus
// pre-tokenized (W2-like: `indexed` → shuffle → pack → batch), one measurement per invocation,
// printed as one JSON line so bench/text_compare.sh can interleave it with the PyTorch
// DataLoader (bench/text_torch.py):
//
//   text_flowstate --data DIR throughput --workers 2       tokens/s over one epoch, raw text
//   text_flowstate --data DIR pretokenized --workers 2     the same rows from DIR/ids.{bin,idx}
//   text_flowstate --data DIR pretokenize                  writes DIR/ids.{bin,idx} once
//   text_flowstate --data DIR ceiling                      SentencePiece alone, one thread
//
// DIR holds `flowstate gen text`'s text-*.jsonl and m.model (spm_train's). The two pipelines
// make the same rows (the shuffle is keyed by seed and position, and pack's separator is the
// model's EOS id), so each prints `digest`, a hash of every token delivered, to compare.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "flowstate/core/hash.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"
#include "flowstate/nodes/sources/indexed.h"

using nlohmann::json;
using namespace flowstate;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
/// CPU seconds (user + system) of this process so far: with the wall time, the cores a run got
/// on a shared machine.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

struct Args {
  std::string mode, data, label;
  int workers = 2;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "text_flowstate: %s\nusage: text_flowstate --data DIR "
               "{throughput|pretokenized|pretokenize|ceiling} [--workers W] [--label S]\n",
               why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value for " + k);
      return argv[++i];
    };
    if (k == "--data")
      a.data = value();
    else if (k == "--workers")
      a.workers = std::stoi(value());
    else if (k == "--label")
      a.label = value();
    else if (!k.empty() && k[0] != '-' && a.mode.empty())
      a.mode = k;
    else
      usage("unknown argument " + k);
  }
  if (a.mode.empty()) usage("no mode given");
  if (a.data.empty()) usage("--data DIR is required");
  return a;
}

constexpr std::uint64_t kLength = 2048;
constexpr std::uint64_t kBatch = 8;

TokenizeOptions tokenize_options(const Args& a) {
  return {.model = a.data + "/m.model", .dtype = TokenDType::kUInt16};
}
LinesOptions text_source(const Args& a) {
  return {
      .paths = {a.data + "/text-*.jsonl"}, .format = LinesFormat::kJsonl, .json_fields = {"text"}};
}

Pipeline raw(const Args& a) {
  const auto eos = SentencePieceModel::load(a.data + "/m.model")->eos_id();
  return Pipeline::Builder()
      .seed(1234)
      .workers(a.workers)
      .lines(text_source(a))
      .shuffle({.mode = ShuffleMode::kGlobal})
      .add(tokenize_node(), tokenize_options(a))
      .pack({.length = kLength, .separator = eos})
      .batch({.size = kBatch})
      .build();
}

Pipeline pretokenized(const Args& a) {
  const auto eos = SentencePieceModel::load(a.data + "/m.model")->eos_id();
  return Pipeline::Builder()
      .seed(1234)
      .workers(a.workers)
      .add(indexed_node(), IndexedOptions{.paths = {a.data + "/ids.idx"}})
      .shuffle({.mode = ShuffleMode::kGlobal})
      .pack({.length = kLength, .separator = eos})
      .batch({.size = kBatch})
      .build();
}

void emit(json j, const Args& a) {
  j["impl"] = "flowstate";
  j["workers"] = a.workers;
  if (!a.label.empty()) j["label"] = a.label;
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

// Tokens/s over one epoch, from the Loader's construction to the last batch, and a hash of
// every token delivered.
void throughput(const Args& a, const Pipeline& p, const char* what) {
  const auto t0 = Clock::now();
  const double cpu0 = cpu_seconds();
  Loader l(p, {.epochs = 1});
  std::uint64_t rows = 0, batches = 0;
  Hasher digest;
  while (auto b = l.next()) {
    rows += b->info.num_samples;
    const Tensor& t = b->fields.at("tokens");
    digest.update(t.data(), t.nbytes());
    ++batches;
  }
  const double s = since(t0);
  emit({{"what", what},
        {"tokens_per_s", static_cast<double>(rows * kLength) / s},
        {"batches", batches},
        {"seconds", s},
        {"cores", (cpu_seconds() - cpu0) / s},
        {"digest", hex64(digest.digest())}},
       a);
}

// DIR/ids.{bin,idx}: every document's ids (uint16, no EOS: pack adds it as its separator), in
// file order, a sequence per document.
void pretokenize(const Args& a) {
  const auto t0 = Clock::now();
  Loader l(Pipeline::Builder()
               .workers(a.workers)
               .lines(text_source(a))
               .add(tokenize_node(), tokenize_options(a))
               .batch({.size = 256, .collate = CollateMode::kRagged})
               .build(),
           {.epochs = 1});
  std::ofstream bin(a.data + "/ids.bin", std::ios::binary);
  std::vector<std::int32_t> lengths;
  std::uint64_t tokens = 0;
  while (auto b = l.next()) {
    const Tensor& values = b->fields.at("tokens");
    const auto offsets = b->fields.at("tokens_offsets").values<std::int64_t>();
    bin.write(static_cast<const char*>(values.data()),
              static_cast<std::streamsize>(values.nbytes()));
    for (std::size_t i = 0; i + 1 < offsets.size(); ++i)
      lengths.push_back(static_cast<std::int32_t>(offsets[i + 1] - offsets[i]));
    tokens += static_cast<std::uint64_t>(values.numel());
  }
  std::ofstream(a.data + "/ids.idx", std::ios::binary) << megatron_index(DType::kUInt16, lengths);
  emit({{"what", "pretokenize"},
        {"documents", lengths.size()},
        {"tokens", tokens},
        {"seconds", since(t0)}},
       a);
}

// The most one core tokenizes: every document's text read into memory first, then one loop of
// SentencePieceProcessor::Encode over them (tokens/s with the EOS the pipelines add), no
// loader, no JSON, no copies.
void ceiling(const Args& a) {
  LinesSource src("lines", text_source(a));
  std::vector<std::string> texts;
  for (std::uint64_t i = 0; i < src.size(0); ++i) {
    Sample s;
    src.read(src.at(0, i), s);
    const Tensor& t = s.at("text");
    texts.emplace_back(static_cast<const char*>(t.data()), t.nbytes());
  }
  const auto model = SentencePieceModel::load(a.data + "/m.model");
  std::vector<int> ids;
  std::uint64_t tokens = 0;
  const auto t0 = Clock::now();
  const double cpu0 = cpu_seconds();
  for (const auto& text : texts) {
    model->encode(text, ids);
    tokens += ids.size() + 1;
  }
  const double s = since(t0);
  emit({{"what", "ceiling"},
        {"tokens_per_s", static_cast<double>(tokens) / s},
        {"seconds", s},
        {"cores", (cpu_seconds() - cpu0) / s}},
       a);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  try {
    if (a.mode == "throughput")
      throughput(a, raw(a), "text");
    else if (a.mode == "pretokenized")
      throughput(a, pretokenized(a), "pretokenized");
    else if (a.mode == "pretokenize")
      pretokenize(a);
    else if (a.mode == "ceiling")
      ceiling(a);
    else
      usage("unknown mode " + a.mode);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "text_flowstate: %s\n", e.what());
    return 1;
  }
  return 0;
}
