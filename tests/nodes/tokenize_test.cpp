// The tokenize node, on a SentencePiece model trained here with spm_train: the ids (BOS/EOS,
// dtypes, truncation) against the model's own Encode, exact resume through shuffle → pack →
// batch with 1 and 2 workers, the model in the fingerprint by its bytes, YAML, and every error
// text. (Python's sentencepiece gives the same ids: tests/python/test_tokenize.py.)
#include "flowstate/nodes/tokenize.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "flowstate/config/yaml.h"
#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"
#include "tests/support/testing.h"
#include "tests/support/text.h"

namespace flowstate {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::TempDir;

constexpr std::uint64_t kDocs0 = 120, kDocs1 = 80;

class Tokenize : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    model_ = testing::train_sentencepiece(dir_->str(), "m", 500);
    testing::write_text_jsonl(*dir_ / "text-00000.jsonl", kDocs0, 60);
    testing::write_text_jsonl(*dir_ / "text-00001.jsonl", kDocs1, 150, 9);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
    no_bos_.clear();
  }
  void SetUp() override { ASSERT_FALSE(model_.empty()); }
  /// A second model, without a BOS piece, trained when a test first asks for it (each test runs
  /// in a process of its own under ctest).
  static const std::string& no_bos() {
    if (no_bos_.empty())
      no_bos_ = testing::train_sentencepiece(dir_->str(), "nobos", 400, 300, 100, "--bos_id=-1");
    return no_bos_;
  }

  static Pipeline::Builder texts(const std::string& glob = "text-*.jsonl") {
    return std::move(Pipeline::Builder().seed(5).lines(
        {.paths = {*dir_ / glob}, .format = LinesFormat::kJsonl, .json_fields = {"text"}}));
  }
  /// The text of document i of the corpus (file 0's, then file 1's).
  static std::string text(std::uint64_t i) {
    return i < kDocs0 ? synthetic_text(7, i, 60) : synthetic_text(9, i - kDocs0, 150);
  }
  static std::vector<int> encode(const std::string& s) {
    static const auto m = SentencePieceModel::load(model_);
    std::vector<int> ids;
    m->encode(s, ids);
    return ids;
  }
  /// Every record's `field` in order, through `options` (batches of one).
  static std::vector<std::vector<std::int64_t>> ids_of(TokenizeOptions options,
                                                       DType* dtype = nullptr,
                                                       std::vector<std::string>* fields = nullptr) {
    Loader loader(texts().add(tokenize_node(), std::move(options)).batch({.size = 1}).build());
    std::vector<std::vector<std::int64_t>> out;
    for (const Batch& b : loader) {
      const Tensor& t = b["tokens"];
      if (dtype != nullptr) *dtype = t.dtype();
      if (fields != nullptr && fields->empty())
        for (const auto& [id, f] : b.fields) fields->emplace_back(field_name(id));
      std::vector<std::int64_t> v;
      for (std::int64_t k = 0; k < t.numel(); ++k) {
        switch (t.dtype()) {
          case DType::kUInt16:
            v.push_back(t.values<std::uint16_t>()[k]);
            break;
          case DType::kUInt32:
            v.push_back(t.values<std::uint32_t>()[k]);
            break;
          default:
            v.push_back(t.values<std::int32_t>()[k]);
        }
      }
      out.push_back(std::move(v));
    }
    return out;
  }

  static inline TempDir* dir_ = nullptr;
  static inline std::string model_, no_bos_;
};

std::vector<std::int64_t> widen(const std::vector<int>& ids) { return {ids.begin(), ids.end()}; }

TEST_F(Tokenize, IdsAreTheModelsEncodeInEveryDtype) {
  const auto m = SentencePieceModel::load(model_);
  ASSERT_EQ(m->vocab_size(), 500);
  for (TokenDType dt : {TokenDType::kInt32, TokenDType::kUInt32, TokenDType::kUInt16}) {
    DType got = DType::kUInt8;
    const auto ids = ids_of({.model = model_, .dtype = dt}, &got);
    ASSERT_EQ(ids.size(), kDocs0 + kDocs1);
    EXPECT_EQ(got, dt == TokenDType::kInt32    ? DType::kInt32
                   : dt == TokenDType::kUInt32 ? DType::kUInt32
                                               : DType::kUInt16);
    for (std::uint64_t i = 0; i < ids.size(); ++i) {
      ASSERT_EQ(ids[i], widen(encode(text(i)))) << "record " << i;
      ASSERT_GT(ids[i].size(), 5u);
    }
  }
}

TEST_F(Tokenize, BosAndEosAreTheModelsIds) {
  const auto m = SentencePieceModel::load(model_);
  const auto ids = ids_of({.model = model_, .bos = true, .eos = true});
  for (std::uint64_t i = 0; i < ids.size(); ++i) {
    std::vector<std::int64_t> want{m->bos_id()};
    for (int id : encode(text(i))) want.push_back(id);
    want.push_back(m->eos_id());
    ASSERT_EQ(ids[i], want) << "record " << i;
  }
  EXPECT_EQ(ids_of({.model = model_, .eos = true})[3].back(), m->eos_id());
}

TEST_F(Tokenize, MaxLengthKeepsTheFirstOrTheLastIdsBetweenBosAndEos) {
  const auto m = SentencePieceModel::load(model_);
  for (Truncation tr : {Truncation::kEnd, Truncation::kStart}) {
    const auto ids =
        ids_of({.model = model_, .bos = true, .eos = true, .max_length = 40, .truncation = tr});
    std::size_t cut = 0;
    for (std::uint64_t i = 0; i < ids.size(); ++i) {
      const std::vector<int> all = encode(text(i));
      std::vector<std::int64_t> want{m->bos_id()};
      if (all.size() <= 38) {
        want.insert(want.end(), all.begin(), all.end());
      } else {
        ++cut;
        if (tr == Truncation::kEnd)
          want.insert(want.end(), all.begin(), all.begin() + 38);
        else
          want.insert(want.end(), all.end() - 38, all.end());
      }
      want.push_back(m->eos_id());
      ASSERT_EQ(ids[i], want) << "record " << i;
      ASSERT_LE(ids[i].size(), 40u);
    }
    EXPECT_GT(cut, 100u);  // the documents are longer than 38 ids
  }
}

TEST_F(Tokenize, TheTextFieldGoesUnlessKept) {
  std::vector<std::string> fields;
  ids_of({.model = model_}, nullptr, &fields);
  EXPECT_EQ(fields, std::vector<std::string>{"tokens"});
  fields.clear();
  ids_of({.model = model_, .keep_text = true}, nullptr, &fields);
  EXPECT_EQ(fields, (std::vector<std::string>{"text", "tokens"}));
}

// The pipeline of the issue: lines → shuffle → tokenize → pack → batch (shuffle, a spine
// node, stands before every map; tokenize runs where pack reads ahead, on the workers).
Pipeline packed(const std::string& model, ShuffleMode mode = ShuffleMode::kGlobal) {
  return Pipeline::Builder()
      .seed(11)
      .lines({.paths = {(fs::path(model).parent_path() / "text-*.jsonl").string()},
              .format = LinesFormat::kJsonl,
              .json_fields = {"text"}})
      .shuffle({.mode = mode,
                .size = mode == ShuffleMode::kBuffer ? std::uint64_t{32}
                                                     : ShuffleOptions::kDefaultBufferSize})
      .add(tokenize_node(),
           TokenizeOptions{.model = model, .eos = true, .dtype = TokenDType::kUInt16})
      .pack({.length = 256, .doc_ids = true})
      .batch({.size = 4})
      .build();
}

TEST_F(Tokenize, ResumesExactlyThroughShufflePackAndBatchWithOneOrTwoWorkers) {
  const auto make = [] { return packed(model_); };
  testing::expect_save_restore(make, {.epochs = 2, .workers = 1}, {.epochs = 2, .workers = 2});
  testing::expect_save_restore(make, {.epochs = 2, .workers = 2}, {.epochs = 2, .workers = 1});
  const auto buffered = [] { return packed(model_, ShuffleMode::kBuffer); };
  testing::expect_save_restore(buffered, {.epochs = 1, .workers = 2}, {.epochs = 1, .workers = 1});
}

TEST_F(Tokenize, PackedRowsHoldEveryDocumentsIdsOnce) {
  // With 1 or 2 workers (pack reading ahead through tokenize), the same rows; their tokens are
  // the documents' ids each followed by EOS, in the shuffled order.
  std::vector<std::uint64_t> digests[2];
  std::uint64_t tokens = 0;
  for (int w : {1, 2}) {
    Loader loader(packed(model_), {.workers = w});
    for (const Batch& b : loader) {
      digests[w - 1].push_back(b.digest());
      if (w == 1) tokens += static_cast<std::uint64_t>(b["tokens"].numel());
    }
  }
  EXPECT_EQ(digests[0], digests[1]);
  std::uint64_t all = 0;
  for (std::uint64_t i = 0; i < kDocs0 + kDocs1; ++i) all += encode(text(i)).size() + 1;
  EXPECT_EQ(tokens, all / 256 * 256);  // every whole row; the remainder dropped
}

// ---- the model in the fingerprint ----

TEST_F(Tokenize, TheModelIsInTheFingerprintByItsBytesNotItsPath) {
  const std::string copy = *dir_ / "elsewhere.model";
  fs::copy_file(model_, copy, fs::copy_options::overwrite_existing);
  EXPECT_EQ(packed(model_).fingerprint(), packed(copy).fingerprint());
  // One piece more (a protobuf field appended: the same model otherwise) is another model.
  std::string bytes;
  {
    std::ifstream in(model_, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  constexpr char kPiece[] = "\x0a\x04\xe2\x96\x81z\x15\x00\x00\xc8\xc2\x18\x01";
  const std::string piece(kPiece, sizeof(kPiece) - 1);  // "▁z", score -100, normal
  const std::string changed = *dir_ / "changed.model";
  std::ofstream(changed, std::ios::binary)
      << bytes << "\x0a" << static_cast<char>(piece.size()) << piece;
  ASSERT_EQ(SentencePieceModel::load(changed)->vocab_size(), 501);
  EXPECT_NE(packed(model_).fingerprint(), packed(changed).fingerprint());
  EXPECT_NE(packed(model_).fingerprint(), packed(no_bos()).fingerprint());
  // A resume with another model is refused like any other change, naming it.
  Loader first(packed(model_));
  first.next();
  const std::string state = first.state();
  Loader other(packed(changed));
  try {
    other.load_state(state);
    ADD_FAILURE() << "a state of another model was accepted";
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), HasSubstr("tokenize.model"));
  }
  Loader moved(packed(copy));
  EXPECT_NO_THROW(moved.load_state(state));
  // The description shows the hash and, free, the path.
  const std::string described = packed(model_).describe();
  EXPECT_THAT(described, HasSubstr("model: xxh3:"));
  EXPECT_THAT(described, HasSubstr("model_file: " + model_ + " (free)"));
}

// ---- YAML ----

TEST_F(Tokenize, YamlResolvesTheModelAgainstTheFileAndPlacesItsErrors) {
  ASSERT_FALSE(no_bos().empty());  // nobos.model, beside m.model
  const std::string yaml =
      "seed: 11\n"
      "source: {type: lines, paths: 'text-*.jsonl', format: jsonl, json_fields: [text]}\n"
      "nodes:\n"
      "  - shuffle: {mode: global}\n"
      "  - tokenize: {model: m.model, eos: true, dtype: uint16}\n"
      "  - pack: {length: 256, doc_ids: true}\n"
      "  - batch: {size: 4}\n";
  const Pipeline p = load_yaml_string(yaml, "p.yaml", {.base_dir = dir_->path()}).pipeline;
  Loader a(p), b(packed(model_));
  EXPECT_EQ(testing::drain(a), testing::drain(b));

  const auto error = [&](const std::string& node) {
    try {
      load_yaml_string(
          "source: {type: lines, paths: 'text-*.jsonl', format: jsonl, "
          "json_fields: [text]}\nnodes:\n  - " +
              node + "\n  - batch: {size: 4}\n",
          "p.yaml", {.base_dir = dir_->path()});
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(
      error("tokenize: {model: missing.model}"),
      HasSubstr("p.yaml:3:23: nodes[0].tokenize.model: cannot read the SentencePiece "
                "model '" +
                (dir_->path() / "missing.model").string() + "': No such file or directory"));
  EXPECT_THAT(error("tokenize: {eos: true}"), HasSubstr("nodes[0].tokenize"));
  EXPECT_THAT(error("tokenize: {model: m.model, dtype: int64}"),
              HasSubstr("int32, uint32, uint16"));
  EXPECT_THAT(
      error("tokenize: {model: nobos.model, bos: true}"),
      HasSubstr("nodes[0].tokenize.bos: the model '" + (dir_->path() / "nobos.model").string() +
                "' has no BOS piece (trained with --bos_id=-1)"));
}

// ---- errors ----

/// The ConfigError adding tokenize with `o` throws ("" when none).
std::string config_error(TokenizeOptions o) {
  try {
    Pipeline::Builder().records({.paths = {"x"}, .record_bytes = 4}).add(tokenize_node(), o);
  } catch (const ConfigError& e) {
    return e.key() + " | " + e.what();
  }
  return "";
}

TEST_F(Tokenize, ModelErrorsNameTheFile) {
  EXPECT_EQ(config_error({.model = *dir_ / "none.model"}),
            "model | cannot read the SentencePiece model '" + (*dir_ / "none.model") +
                "': No such file or directory");
  const std::string text = *dir_ / "text.model";
  std::ofstream(text) << "this is not a model\n";
  EXPECT_THAT(config_error({.model = text}),
              HasSubstr("model | '" + text + "' is not a SentencePiece model (20 bytes: "));
  const std::string empty = *dir_ / "empty.model";
  std::ofstream{empty};
  EXPECT_THAT(config_error({.model = empty}),
              HasSubstr("model | '" + empty + "' is not a SentencePiece model (0 bytes: "));
  EXPECT_EQ(config_error({}),
            "tokenize.model | tokenize.model must name a SentencePiece model file");
}

TEST_F(Tokenize, OptionErrorsNameTheModelAndItsVocabulary) {
  // A model of 70 500 pieces: the trained one with 70 000 more appended (protobuf merges
  // repeated fields), as a model of a large vocabulary.
  std::string bytes;
  {
    std::ifstream in(model_, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  for (int i = 0; i < 70000; ++i) {
    const std::string word = "\xe2\x96\x81w" + std::to_string(i);
    std::string body = "\x0a" + std::string(1, static_cast<char>(word.size())) + word;
    body += std::string("\x15\x00\x00\xc8\xc2", 5) + "\x18\x01";
    bytes += "\x0a" + std::string(1, static_cast<char>(body.size())) + body;
  }
  const std::string big = *dir_ / "big.model";
  std::ofstream(big, std::ios::binary) << bytes;
  EXPECT_EQ(config_error({.model = big, .dtype = TokenDType::kUInt16}),
            "tokenize.dtype | uint16 cannot hold the ids of the model '" + big +
                "': its 70500 pieces take ids up to 70499 (uint16: at most 65535); use int32 or "
                "uint32");
  EXPECT_EQ(config_error({.model = big, .dtype = TokenDType::kUInt32}), "");
  EXPECT_EQ(
      config_error({.model = no_bos(), .bos = true}),
      "tokenize.bos | the model '" + no_bos() + "' has no BOS piece (trained with --bos_id=-1)");
  EXPECT_EQ(config_error({.model = no_bos(), .eos = true}), "");
  EXPECT_EQ(config_error({.model = model_, .bos = true, .eos = true, .max_length = 2}),
            "tokenize.max_length | max_length 2 leaves no room for a token beside BOS/EOS");
}

/// The error the first batches of `p` throw ("" when none).
std::string data_error(const Pipeline& p) {
  try {
    Loader loader(p);
    testing::drain(loader);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

TEST_F(Tokenize, DataErrorsNameTheFileTheLineAndTheField) {
  TempDir d;
  std::ofstream(d / "bad.jsonl") << "{\"text\": \"fine\"}\n{\"text\": 5}\n";
  std::ofstream(d / "bad.txt", std::ios::binary) << "fine\nab\xff\xfe"
                                                 << "cd\n";
  const auto jsonl = [&](const std::string& file) {
    return std::move(Pipeline::Builder().lines(
        {.paths = {d / file}, .format = LinesFormat::kJsonl, .json_fields = {"text"}}));
  };
  // A field that is not there, one that is no string, bytes that are not UTF-8.
  EXPECT_THAT(
      data_error(jsonl("bad.jsonl")
                     .add(tokenize_node(), TokenizeOptions{.model = model_, .field = "body"})
                     .batch({.size = 1})
                     .build()),
      HasSubstr("node 'tokenize': '" + (d / "bad.jsonl") +
                "' line 1 (byte 0): has no field 'body' (it has: text)"));
  EXPECT_THAT(data_error(jsonl("bad.jsonl")
                             .add(tokenize_node(), TokenizeOptions{.model = model_})
                             .batch({.size = 1})
                             .build()),
              HasSubstr("'" + (d / "bad.jsonl") +
                        "' line 2 (byte 17): field 'text' is int64 [], not text (uint8 bytes: a "
                        "text line, or a JSON string read by json_fields)"));
  const Pipeline text = Pipeline::Builder()
                            .lines({.paths = {d / "bad.txt"}})
                            .shuffle({})
                            .add(tokenize_node(), TokenizeOptions{.model = model_})
                            .pack({.length = 4})
                            .batch({.size = 1})
                            .build();
  EXPECT_THAT(data_error(text), HasSubstr("'" + (d / "bad.txt") +
                                          "' line 2 (byte 5): field 'text' is not valid UTF-8 "
                                          "(byte 2 of 6)"));
}

}  // namespace
}  // namespace flowstate
