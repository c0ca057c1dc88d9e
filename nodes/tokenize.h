// `tokenize`: turns a text field (uint8 [bytes] of UTF-8: a `lines` source's line, or a JSON
// string of `lines` with json_fields) into a 1-D field of token ids with a SentencePiece model
// (Debian's libsentencepiece), optionally between the model's BOS and EOS ids and cut to
// `max_length`. A per-sample map: it runs on the parallel workers (where pack reads ahead, on
// pack's read-ahead), keeps no state, and so resumes exactly as any map does.
//
// The model is loaded once, when the node is added to a pipeline (Builder::add), from the
// bytes of the file; the node's description holds the XXH3-64 of those bytes, not the path,
// so a checkpoint refuses a resume whose model differs by one byte, and accepts the same
// model moved elsewhere. The path is a free parameter (`model_file`), shown, not compared.
//
//   builder.lines({.paths = {"corpus/*.jsonl"}, .format = LinesFormat::kJsonl,
//                  .json_fields = {"text"}})
//       .shuffle({})
//       .add(tokenize_node(), TokenizeOptions{.model = "spm.model", .eos = true})
//       .pack({.length = 2048})
//       .batch({.size = 8});
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "flowstate/nodes/definition.h"
#include "flowstate/nodes/options.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace flowstate {

/// The element type of the ids `tokenize` writes.
enum class TokenDType : std::uint8_t { kInt32, kUInt32, kUInt16 };
template <>
struct EnumNames<TokenDType> {
  static constexpr std::array<std::pair<TokenDType, const char*>, 3> values{
      {{TokenDType::kInt32, "int32"},
       {TokenDType::kUInt32, "uint32"},
       {TokenDType::kUInt16, "uint16"}}};
};

/// Which ids `tokenize` keeps of a text longer than `max_length`.
enum class Truncation : std::uint8_t {
  kEnd,    ///< the first ones (the end of the text is cut)
  kStart,  ///< the last ones (the start of the text is cut)
};
template <>
struct EnumNames<Truncation> {
  static constexpr std::array<std::pair<Truncation, const char*>, 2> values{
      {{Truncation::kEnd, "end"}, {Truncation::kStart, "start"}}};
};

/// A SentencePiece model loaded from a file: what the node's description and checks need, and
/// the processor, whose Encode is const and thread-safe (shared by every worker).
class SentencePieceModel {
 public:
  /// Reads and loads the model at `path`; throws ConfigError (key `model`) naming the path
  /// when it cannot be read or is not a SentencePiece model.
  static std::shared_ptr<const SentencePieceModel> load(const std::filesystem::path& path);
  ~SentencePieceModel();

  const std::string& path() const { return path_; }
  std::uint64_t digest() const { return digest_; }  ///< XXH3-64 of the file's bytes
  std::uint64_t bytes() const { return bytes_; }
  int vocab_size() const { return vocab_size_; }
  int bos_id() const { return bos_id_; }  ///< -1: the model has none
  int eos_id() const { return eos_id_; }  ///< -1: the model has none
  /// The ids of `text` (UTF-8), as SentencePieceProcessor::Encode gives them; throws
  /// std::runtime_error with SentencePiece's status when it fails.
  void encode(std::string_view text, std::vector<int>& ids) const;

 private:
  SentencePieceModel() = default;
  std::string path_;
  std::uint64_t digest_ = 0, bytes_ = 0;
  int vocab_size_ = 0, bos_id_ = -1, eos_id_ = -1;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

/// Options of the `tokenize` node.
struct TokenizeOptions {
  /// The SentencePiece model file (`spm_train`'s PREFIX.model); relative to the YAML file.
  std::string model;
  std::string field = "text";     ///< the text field: uint8 [bytes] of UTF-8
  std::string output = "tokens";  ///< the field the ids go to (pack's default field)
  bool bos = false;               ///< put the model's BOS id first
  bool eos = false;               ///< put the model's EOS id last
  TokenDType dtype = TokenDType::kInt32;
  std::uint64_t max_length = 0;  ///< at most this many ids, BOS and EOS included; 0: no limit
  Truncation truncation = Truncation::kEnd;
  bool keep_text = false;          ///< keep `field` beside the ids (else it is removed)
  std::filesystem::path base_dir;  ///< `model` resolves against it; not described
  /// The model, loaded where the node is added (resolved()); not a parameter.
  std::shared_ptr<const SentencePieceModel> loaded;

  static constexpr auto table() {
    using O = TokenizeOptions;
    return std::tuple{
        param("model", &O::model,
              {.required = true,
               .doc = "the SentencePiece model file (spm_train's .model); in the fingerprint by "
                      "the hash of its bytes",
               .check = check_model,
               .text = model_text}),
        param("field", &O::field, {.doc = "the text field (uint8 bytes of UTF-8)"}),
        param("output", &O::output, {.doc = "the field the ids go to"}),
        param("bos", &O::bos, {.doc = "put the model's BOS id first"}),
        param("eos", &O::eos, {.doc = "put the model's EOS id last"}),
        param("dtype", &O::dtype,
              {.doc = "the ids' element type; uint16 when the vocabulary has at most 65536 "
                      "pieces"}),
        param("max_length", &O::max_length,
              {.doc = "at most this many ids per text, BOS and EOS included; 0: no limit"}),
        param("truncation", &O::truncation,
              {.doc = "a text longer than max_length keeps its first ids (end: its end is cut) "
                      "or its last (start)",
               .describe_if = [](const O& o) { return o.max_length > 0; }}),
        param("keep_text", &O::keep_text,
              {.doc = "keep the text field beside the ids (false: remove it)"}),
    };
  }
  /// The model named and loaded, its ids fitting `dtype`, BOS/EOS present in it, max_length
  /// leaving room for a token, distinct field names.
  void validate() const;
  /// Loads the model (relative to base_dir) where the node is added.
  TokenizeOptions resolved(const Position& where) const;
  /// The table's description, plus the model's path as the free parameter `model_file`.
  NodeDescription describe() const;

 private:
  static std::string check_model(const ParamValue& v);
  /// The model's canonical text: "xxh3:HEX" of its bytes once loaded.
  static std::string model_text(const TokenizeOptions& o);
};

/// The `tokenize` node's definition.
const NodeDef& tokenize_node();

}  // namespace flowstate
