// The `lines` source in one file (just over 600 lines): local files, the read-ahead of
// documents and the remote files read through the look-ahead window share its private index
// of line offsets and the per-file state; a split would expose them in a header.
#include "flowstate/nodes/sources/lines.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <stdexcept>

#include <simdjson.h>
#include <nlohmann/json.hpp>

#include "flowstate/core/error.h"
#include "flowstate/core/rng.h"
#include "flowstate/nodes/sources/index_cache.h"
#include "flowstate/nodes/sources/remote_listing.h"

namespace flowstate {
namespace {

/// An index entry's top bit: the line ends with "\r\n" (its record ends before the '\r').
/// With it, a line's length comes from the index alone — the next line's start — and the
/// spine, which asks filter's and pack's lengths of every line, never reads the text.
constexpr std::uint64_t kCrBit = std::uint64_t{1} << 63;
std::uint64_t start_of(std::uint64_t entry) { return entry & ~kCrBit; }

/// The byte offset of every record of `file`: each line's start (with kCrBit when it ends
/// with "\r\n"), empty lines left out when `skip_empty`.
FileIndex<std::uint64_t> scan_lines(const MappedFile& file, bool skip_empty) {
  FileIndex<std::uint64_t> index;
  const auto* data = reinterpret_cast<const char*>(file.data());
  const std::size_t size = file.size();
  std::size_t pos = 0;
  while (pos < size) {
    const void* nl = std::memchr(data + pos, '\n', size - pos);
    const std::size_t end = nl != nullptr ? static_cast<const char*>(nl) - data : size;
    const bool cr = end > pos && end < size && data[end - 1] == '\r';
    const bool empty = end == pos || (end == pos + 1 && data[pos] == '\r');
    if (!skip_empty || !empty) index.entries.push_back(pos | (cr ? kCrBit : 0));
    pos = end + 1;
  }
  return index;
}

/// Whether a cached line index can describe a file of `size` bytes: its offsets increase and
/// lie inside the file, as line() needs (checking that each follows a newline would read the
/// file, the cost the cache saves).
bool lines_fit(const FileIndex<std::uint64_t>& index, std::uint64_t size) {
  for (std::size_t i = 0; i < index.entries.size(); ++i) {
    if (start_of(index.entries[i]) >= size ||
        (i > 0 && start_of(index.entries[i]) <= start_of(index.entries[i - 1])))
      return false;
    // A line that ends with "\r\n" has room for both before the next line's start.
    if ((index.entries[i] & kCrBit) != 0 && i + 1 < index.entries.size() &&
        start_of(index.entries[i + 1]) - start_of(index.entries[i]) < 2)
      return false;
  }
  return true;
}

template <class T>
Tensor scalar_tensor(T value) {
  Tensor t(dtype_of<T>(), Shape{});
  t.values<T>()[0] = value;
  return t;
}

/// nlohmann's name of a JSON value's type, which messages use ("object", "null", ...).
const char* type_name(simdjson::dom::element_type t) {
  using T = simdjson::dom::element_type;
  switch (t) {
    case T::ARRAY:
      return "array";
    case T::OBJECT:
      return "object";
    case T::INT64:
    case T::UINT64:
    case T::DOUBLE:
      return "number";
    case T::STRING:
      return "string";
    case T::BOOL:
      return "boolean";
    case T::NULL_VALUE:
      return "null";
  }
  return "unknown";
}

/// The tensor of a selected JSON value (see lines.h), or an undefined tensor with the reason
/// in `error`.
Tensor json_tensor(simdjson::dom::element v, const std::string& key, std::string& error) {
  using T = simdjson::dom::element_type;
  const std::string what = "key '" + key + "' ";
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  switch (v.type()) {
    case T::BOOL:
      return scalar_tensor<std::uint8_t>(v.get_bool().value_unsafe() ? 1 : 0);
    case T::INT64:
      return scalar_tensor<std::int64_t>(v.get_int64().value_unsafe());
    case T::UINT64: {
      const std::uint64_t u = v.get_uint64().value_unsafe();
      if (u <= kMax) return scalar_tensor<std::int64_t>(static_cast<std::int64_t>(u));
      error = what + "holds " + std::to_string(u) + ", outside the int64 range";
      return {};
    }
    case T::DOUBLE:
      return scalar_tensor<double>(v.get_double().value_unsafe());
    case T::STRING: {
      const std::string_view s = v.get_string().value_unsafe();
      return bytes_tensor(s.data(), s.size());
    }
    case T::ARRAY: {
      const simdjson::dom::array a = v.get_array().value_unsafe();
      const auto n = static_cast<std::int64_t>(a.size());
      // One pass for the usual case, an array of integers: one call per element (get_int64
      // checks the type itself); the first element that is not an int64 decides the rest.
      bool integers = true;
      std::optional<std::uint64_t> too_big;  // an integer beyond int64 (an error unless floats)
      Tensor ints(DType::kInt64, Shape{n});
      std::int64_t* at = ints.values<std::int64_t>().data();
      for (simdjson::dom::element e : a) {
        auto r = e.get_int64();
        if (r.error() == simdjson::SUCCESS) {
          *at++ = r.value_unsafe();
          continue;
        }
        const T t = e.type();
        if (t == T::DOUBLE) {
          integers = false;  // the float64 path below reads the whole array again
        } else if (t == T::UINT64) {
          if (!too_big) too_big = e.get_uint64().value_unsafe();
          ++at;
        } else {
          error = what + "is an array with an element of type " + type_name(t) +
                  "; arrays must hold numbers only";
          return {};
        }
      }
      if (integers && too_big) {
        error = what + "holds " + std::to_string(*too_big) + ", outside the int64 range";
        return {};
      }
      if (integers) return ints;
      Tensor t(DType::kFloat64, Shape{n});
      double* out = t.values<double>().data();
      for (simdjson::dom::element e : a) {
        const T k = e.type();
        *out++ = k == T::DOUBLE  ? e.get_double().value_unsafe()
                 : k == T::INT64 ? static_cast<double>(e.get_int64().value_unsafe())
                                 : static_cast<double>(e.get_uint64().value_unsafe());
      }
      return t;
    }
    default:
      error = what + "has unsupported type " + type_name(v.type()) +
              " (supported: integer, float, boolean, string, array of numbers)";
      return {};
  }
}

/// The first integer literal of `line` (outside strings) that does not fit in 64 bits, as
/// (its text, its byte in the line); nullopt when there is none.
std::optional<std::pair<std::string, std::size_t>> big_integer(std::string_view line) {
  bool in_string = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
      continue;
    }
    if (c != '-' && (c < '0' || c > '9')) continue;
    std::size_t j = i + (c == '-');
    while (j < line.size() && line[j] >= '0' && line[j] <= '9') ++j;
    const bool integer = j == line.size() || (line[j] != '.' && line[j] != 'e' && line[j] != 'E');
    const std::string_view text = line.substr(i, j - i);
    if (integer && j > i + (c == '-')) {
      bool fits = true;
      if (c == '-') {
        std::int64_t v;
        fits = std::from_chars(text.data(), text.data() + text.size(), v).ec == std::errc{};
      } else {
        std::uint64_t v;
        fits = std::from_chars(text.data(), text.data() + text.size(), v).ec == std::errc{};
      }
      if (!fits) return std::pair{std::string(text), i};
    }
    while (j < line.size() &&
           (line[j] == '.' || line[j] == 'e' || line[j] == 'E' || line[j] == '+' ||
            line[j] == '-' || (line[j] >= '0' && line[j] <= '9')))
      ++j;
    i = j - 1;
  }
  return std::nullopt;
}

/// This thread's parser and padded copy of the line (simdjson reads up to
/// SIMDJSON_PADDING bytes past a document; a mapped line has no such slack).
struct JsonScratch {
  simdjson::dom::parser parser;
  std::vector<char> buffer;
};

JsonScratch& json_scratch() {
  thread_local JsonScratch scratch;
  return scratch;
}

}  // namespace

std::string_view lines_format_name(LinesFormat format) { return enum_name(format); }

LinesFormat parse_lines_format(std::string_view name) {
  return parse_enum<LinesFormat>(name, "lines.format", "lines format");
}

void LinesOptions::validate() const {
  if (field.empty()) throw ConfigError("field", "field must not be empty");
  if (!json_fields.empty() && format != LinesFormat::kJsonl)
    throw ConfigError("json_fields", "json_fields needs format jsonl");
  std::set<std::string> seen;
  for (const auto& key : json_fields) {
    if (key.empty()) throw ConfigError("json_fields", "json_fields has an empty name");
    if (!seen.insert(key).second)
      throw ConfigError("json_fields", "json_fields lists '" + key + "' twice");
  }
}

const NodeDef& lines_node() {
  static const NodeDef def = define_file_source<LinesSource, LinesOptions>(
      {.type = "lines",
       .doc = "text or JSON Lines shards; a byte-offset index is cached beside each file"});
  return def;
}

LinesSource::LinesSource(std::string name, LinesOptions options, std::uint32_t source_id)
    : FileSource(std::move(name), "lines", "lines", source_id),
      options_(std::move(options)),
      field_(field_id(options_.field)) {
  validate_fields(options_, "lines");
  set_verify(options_.verify);
  for (const auto& key : options_.json_fields) json_ids_.push_back(field_id(key));

  // Which lines are records depends on skip_empty, so it is part of the index's kind.
  // lines/2: entries carry kCrBit.
  const std::string kind = options_.skip_empty ? "lines/2 skip_empty" : "lines/2";
  const SourceRemote settings = source_remote("lines", options_);
  const std::vector<SourceFile> files =
      list_source_files(options_.paths, options_.base_dir, &settings);
  const std::vector<ObjectFacts> facts = open_remote_files(
      files, settings, options_.lookahead,
      [this](std::size_t k, const MappedFile& copy) { return prepare_remote(k, copy); }, kind,
      [](const void* prepared) {
        return static_cast<const std::vector<std::uint64_t>*>(prepared)->size();  // line starts
      },
      window_, expected_);
  LocalMappings local(local_file_count(files));
  std::size_t r = 0;
  for (const auto& file : files) {
    if (file.remote) {
      const RemoteObject& o = *file.remote;
      add_remote_file(o.url, o.size, o.etag, facts[r].items, facts[r].blocks, facts[r].full);
      starts_.emplace_back();
      maps_.push_back(nullptr);
      in_set_.push_back(false);
      slot_.push_back(r++);
      continue;
    }
    const ExpandedPath& named = file.local;
    const std::string& f = named.path;
    auto m = std::make_shared<const MappedFile>(f);
    auto index = load_index<std::uint64_t>(
        *m, kind, [&] { return scan_lines(*m, options_.skip_empty); }, nullptr,
        [&](const FileIndex<std::uint64_t>& i) { return lines_fit(i, m->size()); });
    add_file(named, *m, index.entries.size());
    starts_.push_back(std::move(index.entries));
    // More local files than a source keeps mapped: a large one is mapped as reads reach it.
    std::size_t slot = 0;
    maps_.push_back(local.keep(std::move(m), slot));
    in_set_.push_back(maps_.back() == nullptr);
    slot_.push_back(slot);
  }
  set_ = std::move(local).set();
}

std::shared_ptr<const std::vector<std::uint64_t>> LinesSource::prepare_remote(
    std::size_t k, const MappedFile& copy) const {
  // In memory only: no .fsidx beside a copy, so the cache directory holds copies alone.
  auto starts =
      std::make_shared<std::vector<std::uint64_t>>(scan_lines(copy, options_.skip_empty).entries);
  const std::uint64_t want = expected_[k].load();
  if (want != kItemsUnknown && starts->size() != want) {
    const RemoteObject& o = window_->objects()[k];
    throw DataError(o.url, DataError::kNoOffset,
                    "'" + o.url + "' holds " + std::to_string(starts->size()) + " lines, not the " +
                        std::to_string(want) + " the job counted when it first read it (ETag " +
                        o.etag + ")");
  }
  return starts;
}

void LinesSource::epoch_started(std::uint64_t /*epoch*/) {
  if (window_) window_->new_pass();
}

LinesSource::Text LinesSource::text(std::size_t k) const {
  if (const MappedFile* m = maps_[k].get()) [[likely]]
    return {m->data(), m->size(), &starts_[k]};
  if (in_set_[k]) {
    // Valid on this thread until its next read of another file, as a remote file's.
    const std::span<const std::byte> all = set_->read(slot_[k], 0, set_->file_size(slot_[k]));
    return {all.data(), all.size(), &starts_[k]};
  }
  const RemoteWindow::Held held = window_->read(slot_[k]);
  return {held.data, window_->objects()[slot_[k]].size,
          static_cast<const std::vector<std::uint64_t>*>(held.prepared)};
}

std::span<const std::byte> LinesSource::line(std::size_t k, std::uint64_t begin) const {
  const Text t = text(k);
  const void* nl = std::memchr(t.data + begin, '\n', t.size - begin);
  std::size_t end = nl != nullptr ? static_cast<const std::byte*>(nl) - t.data : t.size;
  if (end > begin && t.data[end - 1] == std::byte{'\r'}) --end;
  return {t.data + begin, end - begin};
}

std::span<const std::byte> LinesSource::record(const Ref& ref) const {
  const std::uint64_t i = local(ref);
  const Text t = text(ref.shard);
  const std::vector<std::uint64_t>& starts = *t.starts;
  const std::uint64_t begin = start_of(starts[i]);
  if (!options_.skip_empty && i + 1 < starts.size()) {
    // Every line is a record: this one ends at the newline before the next one's start, and
    // before a '\r' the index marked — no byte of the text is read.
    const std::uint64_t end = start_of(starts[i + 1]) - 1 - ((starts[i] & kCrBit) != 0 ? 1 : 0);
    return {t.data + begin, end - begin};
  }
  return line(ref.shard, begin);
}

std::optional<RecordView> LinesSource::view(const Ref& ref, FieldId field) const {
  if (options_.format == LinesFormat::kJsonl || field != field_) return std::nullopt;
  // A remote file's or a file of the set's bytes are not valid while the source lives.
  if (ref.shard < maps_.size() && !maps_[ref.shard]) return std::nullopt;
  return RecordView{DType::kUInt8, record(ref)};
}

void LinesSource::read(const Ref& ref, Sample& sample) const {
  const std::size_t k = ref.shard;
  const std::span<const std::byte> bytes = record(ref);
  const std::uint64_t offset = start_of((*text(k).starts)[local(ref)]);
  sample.ref = ref;
  if (options_.format == LinesFormat::kJsonl)
    read_json(k, offset, bytes, sample);
  else
    sample.set(field_, bytes_tensor(bytes.data(), bytes.size()));
}

void LinesSource::read_json(std::size_t k, std::uint64_t offset, std::span<const std::byte> bytes,
                            Sample& sample) const {
  // simdjson validates the whole line (and reads what json_fields select from its DOM); a line
  // it refuses is parsed again by nlohmann, only for its message, which says where and why. A
  // line that only nlohmann accepts holds an integer beyond 64 bits, which nlohmann would
  // have read as an inexact double: refused, naming it.
  const std::string_view line(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  JsonScratch& scratch = json_scratch();
  if (scratch.buffer.size() < line.size() + simdjson::SIMDJSON_PADDING)
    scratch.buffer.resize(line.size() + simdjson::SIMDJSON_PADDING);
  if (!line.empty()) std::memcpy(scratch.buffer.data(), line.data(), line.size());
  simdjson::dom::element doc;
  if (const auto err = scratch.parser.parse(scratch.buffer.data(), line.size(), false).get(doc)) {
    try {
      [[maybe_unused]] const auto parsed = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail(k, offset, std::string("invalid JSON: ") + e.what());
    }
    if (auto big = big_integer(line))
      fail(k, offset,
           "the integer " + big->first + " at byte " + std::to_string(big->second) +
               " of the line does not fit in 64 bits (integers are read exactly or not at all)");
    fail(k, offset, std::string("invalid JSON: ") + simdjson::error_message(err));
  }
  if (json_ids_.empty()) {
    sample.set(field_, bytes_tensor(bytes.data(), bytes.size()));
    return;
  }
  simdjson::dom::object object;
  if (doc.get_object().get(object))
    fail(k, offset, std::string("the line is a JSON ") + type_name(doc.type()) + ", not an object");
  for (std::size_t f = 0; f < json_ids_.size(); ++f) {
    const std::string& key = options_.json_fields[f];
    simdjson::dom::element value;
    if (object.at_key(key).get(value)) fail(k, offset, "key '" + key + "' is missing");
    std::string error;
    Tensor t = json_tensor(value, key, error);
    if (!t.defined()) fail(k, offset, error);
    sample.set(json_ids_[f], std::move(t));
  }
}

std::uint64_t LinesSource::line_number(std::size_t k, std::uint64_t offset) const {
  // Only errors need it, so it is counted rather than indexed.
  const std::byte* data = text(k).data;
  return 1 + static_cast<std::uint64_t>(std::count(data, data + offset, std::byte{'\n'}));
}

void LinesSource::fail(std::size_t k, std::uint64_t offset, const std::string& what) const {
  throw DataError(files_[k], offset,
                  "'" + files_[k] + "' line " + std::to_string(line_number(k, offset)) + " (byte " +
                      std::to_string(offset) + "): " + what);
}

void LinesSource::fail_record(const Ref& ref, const std::string& what) const {
  const std::uint64_t i = local(ref);
  fail(ref.shard, start_of((*text(ref.shard).starts)[i]), what);
}

// ---- writing ----

void append_line(std::string& out, std::string_view line, LineEnd end) {
  if (const auto at = line.find('\n'); at != std::string_view::npos)
    throw std::invalid_argument("a line cannot hold a newline (byte " + std::to_string(at) +
                                " of " + std::to_string(line.size()) + ")");
  if (line.ends_with('\r'))
    throw std::invalid_argument("a line cannot end with '\\r': the lines source drops it");
  out.append(line);
  out.append(end == LineEnd::kLf ? "\n" : end == LineEnd::kCrLf ? "\r\n" : "");
}

void append_jsonl_tokens(std::string& out, std::uint64_t id, std::span<const std::int64_t> tokens) {
  out.append("{\"id\": ").append(std::to_string(id)).append(", \"tokens\": [");
  for (std::size_t j = 0; j < tokens.size(); ++j) {
    if (j > 0) out.append(", ");
    out.append(std::to_string(tokens[j]));
  }
  out.append("]}\n");
}

}  // namespace flowstate

namespace flowstate {

void append_jsonl_text(std::string& out, std::string_view text) {
  out.append("{\"text\": \"");
  for (const char c : text) {
    switch (c) {
      case '"':
        out.append("\\\"");
        break;
      case '\\':
        out.append("\\\\");
        break;
      case '\n':
        out.append("\\n");
        break;
      case '\t':
        out.append("\\t");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
          out.append(buf);
        } else {
          out.push_back(c);
        }
    }
  }
  out.append("\"}\n");
}

namespace {

/// The most common English words, most frequent first: the head of the synthetic vocabulary.
constexpr std::array<std::string_view, 160> kCommonWords{
    "the",    "of",      "and",     "to",      "a",        "in",       "is",     "that",
    "for",    "it",      "as",      "was",     "with",     "be",       "by",     "on",
    "not",    "he",      "this",    "are",     "or",       "his",      "from",   "at",
    "which",  "but",     "have",    "an",      "had",      "they",     "you",    "were",
    "their",  "one",     "all",     "we",      "can",      "her",      "has",    "there",
    "been",   "if",      "more",    "when",    "will",     "would",    "who",    "so",
    "no",     "she",     "other",   "its",     "may",      "these",    "what",   "them",
    "than",   "some",    "him",     "time",    "into",     "only",     "do",     "could",
    "new",    "about",   "two",     "first",   "then",     "also",     "any",    "most",
    "people", "such",    "like",    "over",    "made",     "many",     "must",   "world",
    "after",  "years",   "where",   "through", "between",  "under",    "city",   "river",
    "water",  "school",  "history", "system",  "work",     "music",    "small",  "large",
    "during", "against", "village", "century", "family",   "language", "known",  "called",
    "number", "because", "however", "several", "while",    "early",    "later",  "without",
    "among",  "public",  "each",    "north",   "south",    "house",    "church", "began",
    "around", "since",   "light",   "market",  "found",    "second",   "great",  "form",
    "group",  "power",   "old",     "long",    "part",     "place",    "road",   "named",
    "war",    "state",   "area",    "game",    "book",     "built",    "team",   "local",
    "café",   "naïve",   "résumé",  "Zürich",  "São",      "über",     "1984",   "2.5",
    "garden", "bridge",  "station", "island",  "mountain", "forest",   "winter", "summer",
};

/// Syllables of the made-up words: the long tail of the vocabulary.
constexpr std::array<std::string_view, 32> kSyllables{
    "ka", "lo", "mer", "tan", "vi", "sol", "re",  "dun", "pa",  "gor", "el",
    "ri", "na", "tho", "ben", "cu", "ast", "or",  "ik",  "wel", "mo",  "zan",
    "te", "lu", "bar", "fin", "os", "que", "dra", "ly",  "sen", "ho"};

/// Words in the vocabulary: the common ones, then made-up ones of 2 or 3 syllables.
constexpr std::uint64_t kVocabulary = 8192;

/// Word `rank` of the vocabulary, appended to `out`.
void append_word(std::string& out, std::uint64_t rank) {
  if (rank < kCommonWords.size()) {
    out.append(kCommonWords[rank]);
    return;
  }
  std::uint64_t r = philox64(rank, 0x7465787477, 0);  // a fixed spelling per rank
  const int syllables = 2 + static_cast<int>(r % 2);
  for (int k = 0; k < syllables; ++k) {
    r >>= 5;
    out.append(kSyllables[r % kSyllables.size()]);
  }
}

/// The cumulative Zipf weights (exponent 1.05) of the vocabulary's ranks, for drawing a rank.
const std::vector<double>& zipf_cdf() {
  static const std::vector<double> cdf = [] {
    std::vector<double> c(kVocabulary);
    double sum = 0;
    for (std::uint64_t r = 0; r < kVocabulary; ++r)
      c[r] = sum += 1.0 / std::pow(static_cast<double>(r + 1), 1.05);
    for (double& v : c) v /= sum;
    return c;
  }();
  return cdf;
}

/// A uniform double in [0, 1) from 53 random bits.
double unit(ElementRng& rng) { return static_cast<double>(rng() >> 11) / 9007199254740992.0; }

}  // namespace

std::string synthetic_text(std::uint64_t seed, std::uint64_t index, std::uint64_t median_words) {
  ElementRng rng(seed, index, std::uint64_t{4} << 32);
  // Lognormal length (Box-Muller over two draws).
  constexpr double kTwoPi = 6.283185307179586;
  const double u1 = (static_cast<double>(rng() >> 11) + 1.0) / 9007199254740993.0;  // (0, 1]
  const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * unit(rng));
  const double median = static_cast<double>(std::max<std::uint64_t>(median_words, 1));
  const auto words = static_cast<std::uint64_t>(
      std::clamp(std::round(median * std::exp(0.5 * z)), 1.0, 20.0 * median));
  const std::vector<double>& cdf = zipf_cdf();
  std::string out;
  out.reserve(words * 7);
  std::uint64_t sentence_left = 0, sentences_in_paragraph = 0;
  for (std::uint64_t w = 0; w < words; ++w) {
    const bool starts = sentence_left == 0;
    if (starts) {
      sentence_left = 3 + rng.below(22);
      if (w > 0) {
        // A paragraph of 3 to 8 sentences.
        if (++sentences_in_paragraph >= 3 && rng.below(6) == 0) {
          out.append("\n\n");
          sentences_in_paragraph = 0;
        } else {
          out.push_back(' ');
        }
      }
    } else {
      out.push_back(' ');
    }
    const auto rank = static_cast<std::uint64_t>(
        std::upper_bound(cdf.begin(), cdf.end(), unit(rng)) - cdf.begin());
    const std::size_t at = out.size();
    append_word(out, std::min(rank, kVocabulary - 1));
    if (starts && out[at] >= 'a' && out[at] <= 'z') out[at] = static_cast<char>(out[at] - 32);
    --sentence_left;
    if (sentence_left == 0 || w + 1 == words) {
      const std::uint64_t end = rng.below(10);
      out.push_back(end == 0 ? '?' : end == 1 ? '!' : '.');
      sentence_left = 0;
    } else if (rng.below(12) == 0) {
      out.push_back(',');
    } else if (rng.below(200) == 0) {
      out.append(" \"quoted\"");
    }
  }
  return out;
}

}  // namespace flowstate
