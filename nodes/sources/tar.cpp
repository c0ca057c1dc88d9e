#include "flowstate/nodes/sources/tar.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <stdexcept>

#include "flowstate/core/error.h"
#include "flowstate/nodes/sources/remote_listing.h"

namespace flowstate {
namespace {

// Entries are cached as raw bytes: no padding, so no uninitialised bytes reach the disk.
static_assert(sizeof(detail::TarMember) == 40);

constexpr std::uint64_t kBlock = kTarBlockBytes;
// Offsets and widths of the header fields (POSIX ustar; GNU shares them).
constexpr std::size_t kNameAt = 0, kNameWidth = 100;
constexpr std::size_t kModeAt = 100, kUidAt = 108, kGidAt = 116, kIdWidth = 8;
constexpr std::size_t kSizeAt = 124, kSizeWidth = 12;
constexpr std::size_t kMtimeAt = 136, kMtimeWidth = 12;
constexpr std::size_t kChecksumAt = 148, kChecksumWidth = 8;
constexpr std::size_t kTypeAt = 156;
constexpr std::size_t kMagicAt = 257, kVersionAt = 263;
constexpr std::size_t kDevMajorAt = 329, kDevMinorAt = 337, kDevWidth = 8;
constexpr std::size_t kPrefixAt = 345, kPrefixWidth = 155;

std::uint64_t round_up(std::uint64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

/// A header string field: up to `width` bytes, ended early by a NUL.
std::string_view header_string(const unsigned char* h, std::size_t at, std::size_t width) {
  const auto* p = reinterpret_cast<const char*>(h + at);
  return {p, ::strnlen(p, width)};
}

/// Parses a numeric header field: spaces, octal digits, then only spaces or NULs (an empty
/// field is 0) — or, when its first byte has the high bit set, GNU base-256: a big-endian
/// two's-complement number in the remaining bits. False when malformed, negative or above
/// 64 bits.
bool parse_number(const unsigned char* f, std::size_t width, std::uint64_t& out) {
  out = 0;
  if ((f[0] & 0x80) != 0) {
    if ((f[0] & 0x40) != 0) return false;
    out = f[0] & 0x3f;
    for (std::size_t i = 1; i < width; ++i) {
      if (out >> 56 != 0) return false;
      out = out << 8 | f[i];
    }
    return true;
  }
  std::size_t i = 0;
  while (i < width && f[i] == ' ') ++i;
  for (; i < width && f[i] >= '0' && f[i] <= '7'; ++i) {
    if (out >> 61 != 0) return false;
    out = out * 8 + (f[i] - '0');
  }
  for (; i < width; ++i)
    if (f[i] != ' ' && f[i] != '\0') return false;
  return true;
}

/// Whether the header's checksum field holds the sum of its bytes, the field itself counted
/// as spaces: summed unsigned as POSIX says, or signed as some old tars did.
bool checksum_ok(const unsigned char* h) {
  std::uint64_t unsigned_sum = 0;
  std::int64_t signed_sum = 0;
  for (std::size_t i = 0; i < kBlock; ++i) {
    const bool in_field = i >= kChecksumAt && i < kChecksumAt + kChecksumWidth;
    const unsigned char c = in_field ? ' ' : h[i];
    unsigned_sum += c;
    signed_sum += static_cast<signed char>(c);
  }
  std::uint64_t stored = 0;
  return parse_number(h + kChecksumAt, kChecksumWidth, stored) &&
         (stored == unsigned_sum || static_cast<std::int64_t>(stored) == signed_sum);
}

/// Writes `value` into a numeric header field as `width - 1` octal digits and a NUL; false
/// when it needs more digits.
bool put_octal(char* field, std::size_t width, std::uint64_t value) {
  for (std::size_t k = width - 1; k-- > 0; value >>= 3)
    field[k] = static_cast<char>('0' + (value & 7));
  field[width - 1] = '\0';
  return value == 0;
}

/// Whether a cached member index can describe a tar file of `size` bytes, as grouping and
/// reading need: members in file order, each header block before its data, the data inside
/// the file, and each path inside the string table with a key, a dot and an extension.
bool members_fit(const FileIndex<detail::TarMember>& index, std::uint64_t size) {
  const std::string& names = index.strings;
  std::uint64_t end = 0;  // where the previous member's data ends
  for (const auto& m : index.entries) {
    if (m.start < end || m.data < m.start || m.data - m.start < kBlock || m.data > size ||
        m.size > size - m.data)
      return false;
    if (m.name > names.size() || m.name_size > names.size() - m.name || m.name_size < 2 ||
        m.key_size > m.name_size - 2u || names[m.name + m.key_size] != '.')
      return false;
    end = m.data + m.size;
  }
  return true;
}

/// Builds the member index of one tar file (see tar.h for the rules).
class TarScanner {
 public:
  explicit TarScanner(const MappedFile& file)
      : file_(file), data_(reinterpret_cast<const unsigned char*>(file.data())) {}

  FileIndex<detail::TarMember> scan() {
    const std::uint64_t end = file_.size();
    std::uint64_t pos = 0;
    while (pos < end) {
      if (end - pos < kBlock)
        fail(pos, "truncated tar header (the file ends " + std::to_string(end - pos) +
                      " bytes into it)");
      const unsigned char* h = data_ + pos;
      if (std::all_of(h, h + kBlock, [](unsigned char c) { return c == 0; })) break;
      if (!checksum_ok(h)) fail(pos, "bad tar header checksum");
      std::uint64_t size = 0;
      if (!parse_number(h + kSizeAt, kSizeWidth, size))
        fail(pos, "tar header size field is not octal");
      const char type = static_cast<char>(h[kTypeAt]);
      const bool extended = type == 'L' || type == 'K' || type == 'x';
      if (!extended && pending_size_) size = *pending_size_;
      const std::string name = pending_name_ ? *pending_name_ : header_name(h);
      const std::uint64_t data = pos + kBlock;
      if (size > end - data || round_up(size) > end - data)
        fail(pos, "member '" + name + "' (" + std::to_string(size) +
                      " bytes) runs past the end of the file (" + std::to_string(end) + " bytes)");
      if (extended) {
        if (!pending_start_) pending_start_ = pos;
        const auto* bytes = reinterpret_cast<const char*>(data_ + data);
        if (type == 'L')
          pending_name_ = std::string(bytes, ::strnlen(bytes, static_cast<std::size_t>(size)));
        else if (type == 'x')
          parse_pax(pos, bytes, size);
      } else {
        if (type == '0' || type == '\0' || type == '7')
          add_member(name, pending_start_.value_or(pos), data, size);
        pending_start_.reset();
        pending_name_.reset();
        pending_size_.reset();
      }
      pos = data + round_up(size);
    }
    if (pending_start_) fail(*pending_start_, "the archive ends after an extended header");
    return std::move(index_);
  }

 private:
  [[noreturn]] void fail(std::uint64_t offset, const std::string& what) const {
    throw DataError(file_.path(), offset,
                    "'" + file_.path() + "' byte " + std::to_string(offset) + ": " + what);
  }

  /// The member's path from its header: ustar's prefix joined to its name.
  static std::string header_name(const unsigned char* h) {
    std::string name(header_string(h, kNameAt, kNameWidth));
    // Only POSIX ustar ("ustar\0") has a prefix; GNU ("ustar  ") keeps times there.
    if (std::memcmp(h + kMagicAt, "ustar\0", 6) == 0) {
      std::string_view prefix = header_string(h, kPrefixAt, kPrefixWidth);
      if (!prefix.empty()) name = std::string(prefix) + "/" + name;
    }
    return name;
  }

  /// Reads the records "LENGTH KEY=VALUE\n" of a pax header, keeping `path` and `size`.
  void parse_pax(std::uint64_t header, const char* p, std::uint64_t n) {
    std::uint64_t i = 0;
    while (i < n) {
      std::uint64_t length = 0, j = i;
      while (j < n && p[j] >= '0' && p[j] <= '9' && length <= n)
        length = length * 10 + (p[j++] - '0');
      if (j == i || j >= n || p[j] != ' ' || length > n - i || length < j - i + 2 ||
          p[i + length - 1] != '\n')
        fail(header, "malformed pax header");
      const std::string_view record(p + j + 1, i + length - 1 - (j + 1));
      const auto eq = record.find('=');
      if (eq == std::string_view::npos) fail(header, "malformed pax header");
      const std::string_view key = record.substr(0, eq), value = record.substr(eq + 1);
      if (key == "path") {
        pending_name_ = std::string(value);
      } else if (key == "size") {
        std::uint64_t size = 0;
        if (value.empty() || value.size() > 19 ||
            !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; }))
          fail(header, "pax header size '" + std::string(value) + "' is not a decimal number");
        for (char c : value) size = size * 10 + (c - '0');
        pending_size_ = size;
      }
      i += length;
    }
  }

  /// Appends a regular member, continuing the current sample when the key is the previous
  /// member's. Members without an extension belong to no sample.
  void add_member(const std::string& name, std::uint64_t start, std::uint64_t data,
                  std::uint64_t size) {
    const auto slash = name.rfind('/');
    const std::size_t base = slash == std::string::npos ? 0 : slash + 1;
    const auto dot = name.find('.', base);
    if (dot == std::string::npos || dot == base || dot + 1 == name.size()) return;
    const std::string_view key(name.data(), dot), ext(name.data() + dot + 1, name.size() - dot - 1);
    auto& members = index_.entries;
    if (sample_begin_ < members.size() && key == key_of(members.back())) {
      for (std::size_t i = sample_begin_; i < members.size(); ++i)
        if (ext_of(members[i]) == ext)
          fail(start,
               "sample '" + std::string(key) + "' has two '" + std::string(ext) + "' members");
    } else {
      sample_begin_ = members.size();
    }
    members.push_back({.start = start,
                       .data = data,
                       .size = size,
                       .name = index_.strings.size(),
                       .name_size = static_cast<std::uint32_t>(name.size()),
                       .key_size = static_cast<std::uint32_t>(dot)});
    index_.strings += name;
  }

  std::string_view key_of(const detail::TarMember& m) const {
    return std::string_view(index_.strings).substr(m.name, m.key_size);
  }
  std::string_view ext_of(const detail::TarMember& m) const {
    return std::string_view(index_.strings)
        .substr(m.name + m.key_size + 1, m.name_size - m.key_size - 1);
  }

  const MappedFile& file_;
  const unsigned char* data_;
  FileIndex<detail::TarMember> index_;
  std::size_t sample_begin_ = 0;  ///< first member of the sample being grouped
  // What the extended headers before the next member said about it.
  std::optional<std::uint64_t> pending_start_;
  std::optional<std::string> pending_name_;
  std::optional<std::uint64_t> pending_size_;
};

}  // namespace

std::string_view missing_field_name(MissingField m) { return enum_name(m); }

MissingField parse_missing_field(std::string_view name) {
  return parse_enum<MissingField>(name, "tar.on_missing", "on_missing");
}

void TarOptions::validate() const {
  std::set<std::string> seen;
  for (const auto& ext : fields) {
    if (ext.empty()) throw ConfigError("fields", "fields has an empty extension");
    if (!seen.insert(ext).second) throw ConfigError("fields", "fields lists '" + ext + "' twice");
  }
}

const NodeDef& tar_node() {
  static const NodeDef def = define_file_source<TarSource, TarOptions>(
      {.type = "tar",
       .doc = "WebDataset-style tar shards: members grouped by key into samples, fields by "
              "extension"});
  return def;
}

TarSource::TarSource(std::string name, TarOptions options, std::uint32_t source_id)
    : FileSource(std::move(name), "tar", "samples", source_id),
      options_(std::move(options)),
      record_field_(field_id(options_.fields.empty() ? "data" : options_.fields.front())) {
  validate_fields(options_, "tar");
  set_verify(options_.verify);
  for (const auto& ext : options_.fields) field_ids_.push_back(field_id(ext));

  const SourceRemote settings = source_remote("tar", options_);
  const std::vector<SourceFile> files =
      list_source_files(options_.paths, options_.base_dir, &settings);
  // What a shard's samples are depends on `fields` and `on_missing`: the kind says both.
  std::string kind =
      "tar/1 on_missing=" + std::string(missing_field_name(options_.on_missing)) + " fields=";
  for (const auto& f : options_.fields) kind += std::to_string(f.size()) + ":" + f;
  const std::vector<ObjectFacts> facts = open_remote_files(
      files, settings, options_.lookahead,
      [this](std::size_t k, const MappedFile& copy) { return prepare_remote(k, copy); }, kind,
      [](const void* prepared) { return static_cast<const Shard*>(prepared)->samples.size(); },
      window_, expected_);
  LocalMappings local(local_file_count(files));
  std::size_t r = 0;
  for (const auto& file : files) {
    if (file.remote) {
      const RemoteObject& o = *file.remote;
      add_remote_file(o.url, o.size, o.etag, facts[r].items, facts[r].blocks, facts[r].full);
      shards_.emplace_back();
      in_set_.push_back(false);
      slot_.push_back(r++);
      continue;
    }
    const ExpandedPath& named = file.local;
    const std::string& f = named.path;
    Shard shard;
    shard.map = std::make_shared<const MappedFile>(f);
    // The index holds every member, whatever `fields` says: options apply when grouping, so
    // one cache serves every pipeline reading the file.
    shard.index = load_index<detail::TarMember>(
        *shard.map, "tar/1", [&] { return TarScanner(*shard.map).scan(); }, nullptr,
        [&](const FileIndex<detail::TarMember>& i) { return members_fit(i, shard.map->size()); });
    group(shard, f);
    add_file(named, *shard.map, shard.samples.size());
    // More local files than a source keeps mapped: a large one is mapped as reads reach it.
    std::size_t slot = 0;
    shard.map = local.keep(std::move(shard.map), slot);
    in_set_.push_back(shard.map == nullptr);
    slot_.push_back(slot);
    shards_.push_back(std::move(shard));
  }
  set_ = std::move(local).set();
}

std::shared_ptr<const TarSource::Shard> TarSource::prepare_remote(std::size_t k,
                                                                  const MappedFile& copy) const {
  const RemoteObject& o = window_->objects()[k];
  auto shard = std::make_shared<Shard>();
  try {
    shard->index = TarScanner(copy).scan();
    group(*shard, copy.path());
  } catch (const DataError& e) {
    // The scanner names the copy's path: the object is what the user knows.
    std::string what = e.what();
    for (auto at = what.find(copy.path()); at != std::string::npos; at = what.find(copy.path()))
      what.replace(at, copy.path().size(), o.url);
    throw DataError(o.url, e.offset(), what);
  }
  const std::uint64_t want = expected_[k].load();
  if (want != kItemsUnknown && shard->samples.size() != want)
    throw DataError(o.url, DataError::kNoOffset,
                    "'" + o.url + "' holds " + std::to_string(shard->samples.size()) +
                        " samples, not the " + std::to_string(want) +
                        " the job counted when it first read it (ETag " + o.etag + ")");
  return shard;
}

void TarSource::epoch_started(std::uint64_t /*epoch*/) {
  if (window_) window_->new_pass();
}

void TarSource::group(Shard& shard, const std::string& file) const {
  const auto& members = shard.index.entries;
  const std::string_view names = shard.index.strings;
  auto key_of = [&](std::uint64_t i) { return names.substr(members[i].name, members[i].key_size); };
  shard.member_fields.reserve(members.size());
  for (const auto& m : members) {
    const std::string_view ext =
        names.substr(m.name + m.key_size + 1, m.name_size - m.key_size - 1);
    if (options_.fields.empty()) {
      shard.member_fields.push_back(field_id(ext));
      continue;
    }
    auto it = std::find(options_.fields.begin(), options_.fields.end(), ext);
    shard.member_fields.push_back(
        it == options_.fields.end() ? kNoField : field_ids_[it - options_.fields.begin()]);
  }
  // Members [begin, i) with one key are a sample: the same rule the scanner grouped by.
  std::uint64_t begin = 0;
  for (std::uint64_t i = 1; i <= members.size(); ++i) {
    if (i < members.size() && key_of(i) == key_of(begin)) continue;
    bool complete = true;
    for (std::size_t f = 0; f < field_ids_.size() && complete; ++f) {
      complete = std::find(shard.member_fields.begin() + begin, shard.member_fields.begin() + i,
                           field_ids_[f]) != shard.member_fields.begin() + i;
      if (!complete && options_.on_missing == MissingField::kError)
        throw DataError(file, members[begin].start,
                        "'" + file + "' byte " + std::to_string(members[begin].start) +
                            ": sample '" + std::string(key_of(begin)) + "' has no '" +
                            options_.fields[f] + "' member");
    }
    if (complete) shard.samples.emplace_back(begin, i);
    begin = i;
  }
}

TarSource::Located TarSource::members_of(const Ref& ref) const {
  const std::uint64_t i = local(ref);
  const Shard* s = &shards_[ref.shard];
  if (s->map) [[likely]]
    return {s->map->data(), s, s->samples[i]};
  if (in_set_[ref.shard]) {
    // Valid on this thread until its next read of another file, as a remote shard's.
    const std::size_t k = slot_[ref.shard];
    return {set_->read(k, 0, set_->file_size(k)).data(), s, s->samples[i]};
  }
  // A remote shard: the copy and its index stay valid on this thread until its next read of
  // another remote file.
  const RemoteWindow::Held held = window_->read(slot_[ref.shard]);
  s = static_cast<const Shard*>(held.prepared);
  return {held.data, s, s->samples[i]};
}

std::span<const std::byte> TarSource::record(const Ref& ref) const {
  const auto [data, s, members] = members_of(ref);
  const detail::TarMember& first = s->index.entries[members.first];
  const detail::TarMember& last = s->index.entries[members.second - 1];
  return {data + first.start, last.data + last.size - first.start};
}

void TarSource::read(const Ref& ref, Sample& sample) const {
  const auto [data, s, members] = members_of(ref);
  sample.ref = ref;
  for (std::uint64_t i = members.first; i < members.second; ++i) {
    if (s->member_fields[i] == kNoField) continue;
    const detail::TarMember& m = s->index.entries[i];
    sample.set(s->member_fields[i], bytes_tensor(data + m.data, m.size));
  }
}

std::optional<RecordView> TarSource::view(const Ref& ref, FieldId field) const {
  // A remote shard's or a set file's bytes are not valid while the source lives.
  if (ref.shard < shards_.size() && !shards_[ref.shard].map) return std::nullopt;
  const auto [data, s, members] = members_of(ref);
  // read() sets the fields in member order: the last member of a field is the one it keeps.
  std::optional<RecordView> v;
  for (std::uint64_t i = members.first; i < members.second; ++i) {
    if (s->member_fields[i] != field) continue;
    const detail::TarMember& m = s->index.entries[i];
    v = RecordView{DType::kUInt8, {data + m.data, static_cast<std::size_t>(m.size)}};
  }
  return v;
}

std::string_view TarSource::key(const Ref& ref) const {
  const auto [data, s, members] = members_of(ref);
  const detail::TarMember& m = s->index.entries[members.first];
  return std::string_view(s->index.strings).substr(m.name, m.key_size);
}

// ---- writing ----

void append_tar_header(std::string& out, const TarHeader& header) {
  auto refuse = [&](const std::string& why) {
    throw std::invalid_argument("cannot write the tar header of '" + std::string(header.prefix) +
                                (header.prefix.empty() ? "" : "/") + std::string(header.name) +
                                "': " + why);
  };
  if (header.name.size() > kNameWidth)
    refuse("its name has " + std::to_string(header.name.size()) + " bytes, more than 100");
  if (header.prefix.size() > kPrefixWidth)
    refuse("its prefix has " + std::to_string(header.prefix.size()) + " bytes, more than 155");
  if (header.gnu && !header.prefix.empty()) refuse("a GNU header has no prefix");
  std::array<char, kTarBlockBytes> h{};
  std::copy(header.name.begin(), header.name.end(), h.data() + kNameAt);
  put_octal(h.data() + kModeAt, kIdWidth, header.type == '5' ? 0755 : 0644);
  put_octal(h.data() + kUidAt, kIdWidth, 0);
  put_octal(h.data() + kGidAt, kIdWidth, 0);
  if (!put_octal(h.data() + kSizeAt, kSizeWidth, header.size))
    refuse("its size " + std::to_string(header.size) + " needs more than 11 octal digits");
  put_octal(h.data() + kMtimeAt, kMtimeWidth, 0);
  h[kTypeAt] = header.type;
  if (header.gnu) {
    std::memcpy(h.data() + kMagicAt, "ustar  ", 8);  // GNU magic and version, NUL-terminated
  } else {
    std::memcpy(h.data() + kMagicAt, "ustar", 6);  // POSIX magic "ustar\0", version "00"
    std::memcpy(h.data() + kVersionAt, "00", 2);
    std::copy(header.prefix.begin(), header.prefix.end(), h.data() + kPrefixAt);
  }
  put_octal(h.data() + kDevMajorAt, kDevWidth, 0);
  put_octal(h.data() + kDevMinorAt, kDevWidth, 0);
  seal_tar_header(h);
  out.append(h.data(), h.size());
}

void append_tar_data(std::string& out, std::string_view data) {
  out.append(data);
  out.append((kBlock - data.size() % kBlock) % kBlock, '\0');
}

void append_tar_member(std::string& out, std::string_view name, std::string_view data) {
  append_tar_header(out, {.name = name, .size = data.size()});
  append_tar_data(out, data);
}

void append_tar_end(std::string& out) { out.append(2 * kBlock, '\0'); }

void seal_tar_header(std::span<char, kTarBlockBytes> header) {
  // The sum of the header's bytes (unsigned), its own field read as spaces.
  std::memset(header.data() + kChecksumAt, ' ', kChecksumWidth);
  std::uint64_t sum = 0;
  for (const char c : header) sum += static_cast<unsigned char>(c);
  put_octal(header.data() + kChecksumAt, kChecksumWidth - 1, sum);  // the last space stays
}

}  // namespace flowstate
