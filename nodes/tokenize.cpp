#include "flowstate/nodes/tokenize.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <sentencepiece_processor.h>
#include <simdjson.h>

#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"
#include "flowstate/nodes/sources/file_source.h"

namespace flowstate {

// ---- the model ----

std::shared_ptr<const SentencePieceModel> SentencePieceModel::load(
    const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw ConfigError("model", "cannot read the SentencePiece model '" + path.string() +
                                   "': " + std::strerror(errno));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad())
    throw ConfigError("model",
                      "cannot read the SentencePiece model '" + path.string() + "': read error");
  const std::string data = std::move(bytes).str();
  std::shared_ptr<SentencePieceModel> m(new SentencePieceModel());
  m->processor_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  // A file that is no model (text, a truncated download, an empty file) fails here.
  const auto status = m->processor_->LoadFromSerializedProto(data);
  if (!status.ok())
    throw ConfigError("model", "'" + path.string() + "' is not a SentencePiece model (" +
                                   std::to_string(data.size()) + " bytes: " + status.ToString() +
                                   ")");
  m->path_ = path.string();
  m->digest_ = hash64(data);
  m->bytes_ = data.size();
  m->vocab_size_ = m->processor_->GetPieceSize();
  m->bos_id_ = m->processor_->bos_id();
  m->eos_id_ = m->processor_->eos_id();
  return m;
}

SentencePieceModel::~SentencePieceModel() = default;

void SentencePieceModel::encode(std::string_view text, std::vector<int>& ids) const {
  const auto status = processor_->Encode(text, &ids);
  if (!status.ok()) throw std::runtime_error("SentencePiece: " + status.ToString());
}

// ---- options ----

std::string TokenizeOptions::check_model(const ParamValue& v) {
  return std::get<std::string>(v).empty() ? "must name a SentencePiece model file" : "";
}

std::string TokenizeOptions::model_text(const TokenizeOptions& o) {
  return o.loaded ? "xxh3:" + hex64(o.loaded->digest()) : o.model;
}

TokenizeOptions TokenizeOptions::resolved(const Position&) const {
  TokenizeOptions o = *this;
  if (!o.model.empty() && !o.loaded) {
    std::filesystem::path p(o.model);
    if (p.is_relative() && !o.base_dir.empty()) p = o.base_dir / p;
    o.loaded = SentencePieceModel::load(p);
  }
  return o;
}

void TokenizeOptions::validate() const {
  if (model.empty()) throw ConfigError("model", "tokenize needs a SentencePiece model file");
  if (!loaded)
    throw ConfigError("model", "the model '" + model +
                                   "' was not loaded (add the node through a pipeline builder)");
  const SentencePieceModel& m = *loaded;
  if (dtype == TokenDType::kUInt16 && m.vocab_size() > 65536)
    throw ConfigError("dtype", "uint16 cannot hold the ids of the model '" + m.path() + "': its " +
                                   std::to_string(m.vocab_size()) + " pieces take ids up to " +
                                   std::to_string(m.vocab_size() - 1) +
                                   " (uint16: at most 65535); use int32 or uint32");
  if (bos && m.bos_id() < 0)
    throw ConfigError("bos",
                      "the model '" + m.path() + "' has no BOS piece (trained with --bos_id=-1)");
  if (eos && m.eos_id() < 0)
    throw ConfigError("eos",
                      "the model '" + m.path() + "' has no EOS piece (trained with --eos_id=-1)");
  const std::uint64_t marks = (bos ? 1 : 0) + (eos ? 1 : 0);
  if (max_length > 0 && max_length <= marks)
    throw ConfigError("max_length", "max_length " + std::to_string(max_length) +
                                        " leaves no room for a token beside BOS/EOS");
  if (field.empty()) throw ConfigError("field", "must name a field");
  if (output.empty()) throw ConfigError("output", "must name a field");
}

NodeDescription TokenizeOptions::describe() const {
  NodeDescription d{"tokenize", describe_fields(*this)};
  d.params.push_back({"model_file", loaded ? loaded->path() : model, true});
  return d;
}

namespace {

/// The first byte of `s` that is not part of well-formed UTF-8 (an overlong form, a
/// surrogate, a code point past U+10FFFF, a cut sequence), or s.size() when it is all UTF-8.
std::size_t invalid_utf8_at(std::string_view s) {
  std::size_t i = 0;
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  while (i < s.size()) {
    const unsigned char c = b(0);
    if (c < 0x80) {
      ++i;
      continue;
    }
    const std::size_t n = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return i;
    for (std::size_t k = 1; k < n; ++k)
      if ((b(k) & 0xC0) != 0x80) return i;
    if ((n == 2 && c < 0xC2) || (n == 3 && c == 0xE0 && b(1) < 0xA0) ||
        (n == 3 && c == 0xED && b(1) >= 0xA0) || (n == 4 && c == 0xF0 && b(1) < 0x90) ||
        (n == 4 && (c > 0xF4 || (c == 0xF4 && b(1) >= 0x90))))
      return i;
    i += n;
  }
  return i;
}

/// The per-sample function: reads `field`, writes `output`.
class Tokenizer {
 public:
  Tokenizer(const TokenizeOptions& o, const RecordStore* store)
      : model_(o.loaded),
        in_(field_id(o.field)),
        out_(field_id(o.output)),
        field_name_(o.field),
        bos_(o.bos ? model_->bos_id() : -1),
        eos_(o.eos ? model_->eos_id() : -1),
        dtype_(o.dtype == TokenDType::kInt32    ? DType::kInt32
               : o.dtype == TokenDType::kUInt32 ? DType::kUInt32
                                                : DType::kUInt16),
        max_length_(o.max_length),
        truncation_(o.truncation),
        keep_text_(o.keep_text || o.field == o.output),
        files_(dynamic_cast<const FileSource*>(store)) {}

  void operator()(Sample& s, MapContext&) const {
    const Tensor* t = s.find(in_);
    if (t == nullptr) fail(s, "has no field '" + field_name_ + "'" + fields_of(s));
    if (t->dtype() != DType::kUInt8 || t->shape().rank() != 1)
      fail(s, "field '" + field_name_ + "' is " + std::string(dtype_name(t->dtype())) + " " +
                  t->shape().to_string() +
                  ", not text (uint8 bytes: a text line, or a JSON string read by json_fields)");
    const std::string_view text(static_cast<const char*>(t->data()), t->nbytes());
    if (!simdjson::validate_utf8(text.data(), text.size()))
      fail(s, "field '" + field_name_ + "' is not valid UTF-8 (byte " +
                  std::to_string(invalid_utf8_at(text)) + " of " + std::to_string(text.size()) +
                  ")");
    thread_local std::vector<int> ids;
    model_->encode(text, ids);
    std::size_t begin = 0, count = ids.size();
    if (max_length_ > 0) {
      const std::uint64_t room = max_length_ - (bos_ >= 0 ? 1 : 0) - (eos_ >= 0 ? 1 : 0);
      if (count > room) {
        if (truncation_ == Truncation::kStart) begin = count - room;
        count = room;
      }
    }
    const std::size_t n = count + (bos_ >= 0 ? 1 : 0) + (eos_ >= 0 ? 1 : 0);
    Tensor out(dtype_, Shape{static_cast<std::int64_t>(n)});
    switch (dtype_) {
      case DType::kUInt16:
        write<std::uint16_t>(out, ids, begin, count);
        break;
      case DType::kUInt32:
        write<std::uint32_t>(out, ids, begin, count);
        break;
      default:
        write<std::int32_t>(out, ids, begin, count);
    }
    if (!keep_text_) s.erase(field_name_);
    s.set(out_, std::move(out));
  }

 private:
  template <class T>
  void write(Tensor& out, const std::vector<int>& ids, std::size_t begin, std::size_t count) const {
    T* p = out.values<T>().data();
    if (bos_ >= 0) *p++ = static_cast<T>(bos_);
    // Ids lie in [0, vocab): validate() checked that uint16 holds them.
    std::transform(ids.begin() + static_cast<std::ptrdiff_t>(begin),
                   ids.begin() + static_cast<std::ptrdiff_t>(begin + count), p,
                   [](int id) { return static_cast<T>(id); });
    p += count;
    if (eos_ >= 0) *p = static_cast<T>(eos_);
  }

  static std::string fields_of(const Sample& s) {
    std::string names;
    for (const auto& [id, t] : s)
      names += (names.empty() ? "" : ", ") + std::string(field_name(id));
    return names.empty() ? " (it has none)" : " (it has: " + names + ")";
  }

  /// A DataError about the sample's record: where it lies when the store is a file source
  /// ("'corpus.jsonl' line 18 (byte 2210): ..."), else by its Ref.
  [[noreturn]] void fail(const Sample& s, const std::string& what) const {
    if (files_ != nullptr && s.ref.source == files_->source_id())
      files_->fail_record(s.ref.record(), what);
    throw DataError("", DataError::kNoOffset, "record " + s.ref.to_string() + ": " + what);
  }

  std::shared_ptr<const SentencePieceModel> model_;
  FieldId in_, out_;
  std::string field_name_;
  int bos_, eos_;
  DType dtype_;
  std::uint64_t max_length_;
  Truncation truncation_;
  bool keep_text_;
  const FileSource* files_;
};

}  // namespace

const NodeDef& tokenize_node() {
  static const NodeDef def = define_node<TokenizeOptions>(
      {.type = "tokenize",
       .phase = Phase::kPerSample,
       .doc = "turns a text field into token ids with a SentencePiece model"},
      [](BuildContext& ctx, const TokenizeOptions& o) {
        ctx.add_sample_map([t = std::make_shared<const Tokenizer>(o, ctx.store())](
                               Sample& s, MapContext& c) { (*t)(s, c); });
      });
  return def;
}

}  // namespace flowstate
