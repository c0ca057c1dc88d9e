#include "flowstate/nodes/sources/lines.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "flowstate/core/error.h"
#include "flowstate/nodes/sources/index_cache.h"

namespace flowstate {
namespace {

using Json = nlohmann::json;

/// The byte offset of every record of `file`: each line's start, empty lines left out when
/// `skip_empty`.
FileIndex<std::uint64_t> scan_lines(const MappedFile& file, bool skip_empty) {
  FileIndex<std::uint64_t> index;
  const auto* data = reinterpret_cast<const char*>(file.data());
  const std::size_t size = file.size();
  std::size_t pos = 0;
  while (pos < size) {
    const void* nl = std::memchr(data + pos, '\n', size - pos);
    const std::size_t end = nl != nullptr ? static_cast<const char*>(nl) - data : size;
    const bool empty = end == pos || (end == pos + 1 && data[pos] == '\r');
    if (!skip_empty || !empty) index.entries.push_back(pos);
    pos = end + 1;
  }
  return index;
}

/// Whether a cached line index can describe a file of `size` bytes: its offsets increase and
/// lie inside the file, as line() needs (checking that each follows a newline would read the
/// file, the cost the cache saves).
bool lines_fit(const FileIndex<std::uint64_t>& index, std::uint64_t size) {
  for (std::size_t i = 0; i < index.entries.size(); ++i)
    if (index.entries[i] >= size || (i > 0 && index.entries[i] <= index.entries[i - 1]))
      return false;
  return true;
}

template <class T>
Tensor scalar_tensor(T value) {
  Tensor t(dtype_of<T>(), Shape{});
  t.values<T>()[0] = value;
  return t;
}

/// `v` as an int64, or false when it is an unsigned integer above INT64_MAX.
bool to_int64(const Json& v, std::int64_t& out) {
  if (v.is_number_unsigned() &&
      v.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    return false;
  out = v.get<std::int64_t>();
  return true;
}

/// The tensor of a selected JSON value (see lines.h), or an undefined tensor with the reason
/// in `error`.
Tensor json_tensor(const Json& v, const std::string& key, std::string& error) {
  const std::string what = "key '" + key + "' ";
  std::int64_t i = 0;
  switch (v.type()) {
    case Json::value_t::boolean:
      return scalar_tensor<std::uint8_t>(v.get<bool>() ? 1 : 0);
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      if (!to_int64(v, i)) break;
      return scalar_tensor<std::int64_t>(i);
    case Json::value_t::number_float:
      return scalar_tensor<double>(v.get<double>());
    case Json::value_t::string: {
      const auto& s = v.get_ref<const std::string&>();
      return bytes_tensor(s.data(), s.size());
    }
    case Json::value_t::array: {
      bool integers = true;
      for (const auto& e : v) {
        if (!e.is_number()) {
          error = what + "is an array with an element of type " + e.type_name() +
                  "; arrays must hold numbers only";
          return {};
        }
        if (e.is_number_float()) integers = false;
      }
      const auto n = static_cast<std::int64_t>(v.size());
      if (integers) {
        Tensor t(DType::kInt64, Shape{n});
        auto out = t.values<std::int64_t>();
        for (std::size_t j = 0; j < v.size(); ++j) {
          if (!to_int64(v[j], out[j])) {
            error = what + "holds " + v[j].dump() + ", outside the int64 range";
            return {};
          }
        }
        return t;
      }
      Tensor t(DType::kFloat64, Shape{n});
      auto out = t.values<double>();
      for (std::size_t j = 0; j < v.size(); ++j) out[j] = v[j].get<double>();
      return t;
    }
    default:
      error = what + "has unsupported type " + v.type_name() +
              " (supported: integer, float, boolean, string, array of numbers)";
      return {};
  }
  error = what + "holds " + v.dump() + ", outside the int64 range";
  return {};
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
  static const NodeDef def = define_node<LinesOptions>(
      {.type = "lines",
       .phase = Phase::kSource,
       .doc = "text or JSON Lines shards; a byte-offset index is cached beside each file"},
      [](BuildContext& ctx, const LinesOptions& o) { add_file_source<LinesSource>(ctx, o); },
      inspect_file_source);
  return def;
}

LinesSource::LinesSource(std::string name, LinesOptions options, std::uint32_t source_id)
    : FileSource(std::move(name), "lines", "lines", source_id),
      options_(std::move(options)),
      field_(field_id(options_.field)) {
  validate_fields(options_, "lines");
  for (const auto& key : options_.json_fields) json_ids_.push_back(field_id(key));

  // Which lines are records depends on skip_empty, so it is part of the index's kind.
  const std::string kind = options_.skip_empty ? "lines/1 skip_empty" : "lines/1";
  for (const auto& named : expand_named_paths(options_.paths, options_.base_dir)) {
    const std::string& f = named.path;
    auto m = std::make_shared<const MappedFile>(f);
    auto index = load_index<std::uint64_t>(
        *m, kind, [&] { return scan_lines(*m, options_.skip_empty); }, nullptr,
        [&](const FileIndex<std::uint64_t>& i) { return lines_fit(i, m->size()); });
    add_file(named, *m, index.entries.size());
    starts_.push_back(std::move(index.entries));
    maps_.push_back(std::move(m));
  }
}

std::span<const std::byte> LinesSource::line(std::size_t k, std::uint64_t begin) const {
  const MappedFile& m = *maps_[k];
  const void* nl = std::memchr(m.data() + begin, '\n', m.size() - begin);
  std::size_t end = nl != nullptr ? static_cast<const std::byte*>(nl) - m.data() : m.size();
  if (end > begin && m.data()[end - 1] == std::byte{'\r'}) --end;
  return {m.data() + begin, end - begin};
}

std::span<const std::byte> LinesSource::record(const Ref& ref) const {
  return line(ref.shard, starts_[ref.shard][local(ref)]);
}

void LinesSource::read(const Ref& ref, Sample& sample) const {
  const std::uint64_t offset = starts_[ref.shard][local(ref)];
  const std::size_t k = ref.shard;
  const std::span<const std::byte> bytes = line(k, offset);
  sample.ref = ref;
  if (options_.format == LinesFormat::kJsonl)
    read_json(k, offset, bytes, sample);
  else
    sample.set(field_, bytes_tensor(bytes.data(), bytes.size()));
}

void LinesSource::read_json(std::size_t k, std::uint64_t offset, std::span<const std::byte> bytes,
                            Sample& sample) const {
  const auto* begin = reinterpret_cast<const char*>(bytes.data());
  const char* end = begin + bytes.size();
  auto parse = [&] {
    try {
      return Json::parse(begin, end);
    } catch (const Json::exception& e) {
      fail(k, offset, std::string("invalid JSON: ") + e.what());
    }
  };
  if (json_ids_.empty()) {
    // Checking syntax builds no document; only a line that fails is parsed again, for the
    // parser's message.
    if (!Json::accept(begin, end)) parse();
    sample.set(field_, bytes_tensor(bytes.data(), bytes.size()));
    return;
  }
  const Json doc = parse();
  if (!doc.is_object())
    fail(k, offset, std::string("the line is a JSON ") + doc.type_name() + ", not an object");
  for (std::size_t f = 0; f < json_ids_.size(); ++f) {
    const std::string& key = options_.json_fields[f];
    auto it = doc.find(key);
    if (it == doc.end()) fail(k, offset, "key '" + key + "' is missing");
    std::string error;
    Tensor t = json_tensor(*it, key, error);
    if (!t.defined()) fail(k, offset, error);
    sample.set(json_ids_[f], std::move(t));
  }
}

std::uint64_t LinesSource::line_number(std::size_t k, std::uint64_t offset) const {
  // Only errors need it, so it is counted rather than indexed.
  const std::byte* data = maps_[k]->data();
  return 1 + static_cast<std::uint64_t>(std::count(data, data + offset, std::byte{'\n'}));
}

void LinesSource::fail(std::size_t k, std::uint64_t offset, const std::string& what) const {
  throw DataError(files_[k], offset,
                  "'" + files_[k] + "' line " + std::to_string(line_number(k, offset)) + " (byte " +
                      std::to_string(offset) + "): " + what);
}

}  // namespace flowstate
