#include "fuzz/fuzz_targets.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string_view>

#include "flowstate/config/yaml.h"
#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"
#include "flowstate/nodes/sources/index_cache.h"
#include "flowstate/nodes/sources/indexed.h"
#include "flowstate/nodes/sources/lines.h"
#include "flowstate/nodes/sources/tar.h"

namespace flowstate::fuzz {
namespace {

namespace fs = std::filesystem;

std::filesystem::path make_temp_dir() {
  std::string tmpl = (fs::temp_directory_path() / "flowstate-fuzz-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  return tmpl;
}

void remove_cache(const std::string& data_path) {
  std::error_code ec;
  fs::remove(index_cache_path(data_path), ec);
}

/// Every record of `source` (a fresh file source): for each, its raw bytes, then (when `read`)
/// what read() gave — its fields by name and bytes, or the DataError's message. One string,
/// so that two sources can be compared.
std::string read_all(FileSource& source, const RecordStore& store, bool read) {
  source.start_epoch(0);
  std::vector<Ref> refs(static_cast<std::size_t>(source.size(0)) + 1);
  refs.resize(source.pull(refs));
  std::string out;
  for (const Ref& r : refs) {
    const auto raw = store.record(r);
    out.append(reinterpret_cast<const char*>(raw.data()), raw.size()).append("\n--\n");
    if (!read) continue;
    Sample s;
    try {
      store.read(r, s);
    } catch (const DataError& e) {
      out.append("error: ").append(e.what()).append("\n");
      continue;
    }
    for (const auto& [id, t] : s) {
      const auto b = t.bytes();
      out.append(field_name(id)).append("=");
      out.append(reinterpret_cast<const char*>(b.data()), b.size()).append("\n");
    }
  }
  return out;
}

/// Throws std::logic_error — a finding — when a source that read its index from the cache saw
/// other records than the one that built it.
void expect_same(const std::string& built, const std::string& cached, const char* what) {
  if (built != cached)
    throw std::logic_error(std::string(what) +
                           ": a source reading the cached index read other "
                           "records than the one that built it");
}

}  // namespace

ScratchDir::ScratchDir() : path_(make_temp_dir()) {}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string ScratchDir::write(const std::string& name, std::string_view bytes) const {
  const std::string path = (path_ / name).string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw std::runtime_error("cannot write " + path);
  return path;
}

void yaml_one_input(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  YamlOptions options;
  // Relative paths resolve under a directory that does not exist: nothing is opened anyway.
  options.base_dir = "/nonexistent-flowstate-fuzz";
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    if (line.starts_with("#set ")) options.overrides.emplace_back(line.substr(5));
    pos = end + 1;
  }
  try {
    PipelineConfig config = load_yaml_string(text, "fuzz.yaml", options);
    (void)config.pipeline.fingerprint();
    (void)config.pipeline.describe();
  } catch (const Error&) {
    // Bad input, reported as it should be.
  }
}

struct StateTarget::Impl {
  std::filesystem::path dir;
  std::unique_ptr<Loader> loader;

  Impl() {
    dir = make_temp_dir();
    // 2 files × 32 records × 16 bytes.
    for (int f = 0; f < 2; ++f) {
      std::ofstream out(dir / ("part-" + std::to_string(f) + ".bin"), std::ios::binary);
      for (std::uint64_t i = 0; i < 32; ++i) {
        std::uint64_t words[2] = {f * 32 + i, ~(f * 32 + i)};
        out.write(reinterpret_cast<const char*>(words), sizeof(words));
      }
    }
    loader = std::make_unique<Loader>(pipeline(), LoaderOptions{.epochs = 3, .workers = 1});
  }

  ~Impl() {
    loader.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  Pipeline pipeline() const {
    return Pipeline::Builder()
        .seed(42)
        // Relative to base_dir, which the fingerprint leaves out: a state this target writes
        // restores in every process, so crashes found on state inputs can be kept.
        .records({.paths = {"part-*.bin"}, .record_bytes = 16, .base_dir = dir})
        .shard({.rank = 0, .world = 1})
        .shuffle({.mode = ShuffleMode::kGlobal})
        .shuffle({.mode = ShuffleMode::kBuffer, .size = 8})
        .batch({.size = 5})
        .build();
  }
};

StateTarget::StateTarget() : impl_(std::make_unique<Impl>()) {}
StateTarget::~StateTarget() = default;

bool StateTarget::one_input(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    // The checkpoint file reader's own checks first, then the whole restore.
    (void)PipelineState::decode(bytes, "fuzz-state.bin");
    impl_->loader->load_state(bytes);
  } catch (const Error&) {
    return false;  // bad input, reported as it should be
  }
  try {
    for (int i = 0; i < 3; ++i)
      if (!impl_->loader->next()) break;
  } catch (const Error&) {
    // A state that restores may still describe a position the data cannot continue from.
  }
  return true;
}

std::vector<std::string> StateTarget::seeds() {
  std::vector<std::string> out;
  for (std::size_t k : {0, 1, 5, 12, 13, 20, 26, 38}) {
    Loader l(impl_->pipeline(), {.epochs = 3, .workers = 1});
    if (k == 20) l.skip(22, 24);
    for (std::size_t i = 0; i < k; ++i)
      if (!l.next()) break;
    out.push_back(l.state());
  }
  return out;
}

void tar_one_input(const ScratchDir& dir, const std::uint8_t* data, std::size_t size) {
  const std::string path = dir.write("in.tar", as_text(data, size));
  remove_cache(path);
  // Every sample's records and fields, then every key.
  auto summary = [](TarSource& source) {
    std::string out = read_all(source, source, true);
    for (std::uint64_t i = 0; i < source.size(0); ++i) out.append(source.key(source.at(0, i)));
    return out;
  };
  std::string built;
  try {
    TarSource every("tar", {.paths = {path}});  // builds the index and writes the cache
    built = summary(every);
  } catch (const Error&) {
    return;  // a malformed archive: no cache was written, and the other opens would fail alike
  }
  for (MissingField m : {MissingField::kError, MissingField::kSkip}) {
    try {
      TarSource some("tar", {.paths = {path}, .fields = {"tokens", "cls"}, .on_missing = m});
      (void)read_all(some, some, true);
    } catch (const Error&) {
      // A sample lacking one of the fields, with on_missing error.
    }
  }
  TarSource every("tar", {.paths = {path}});
  expect_same(built, summary(every), "tar");
}

void lines_one_input(const ScratchDir& dir, const std::uint8_t* data, std::size_t size) {
  const std::string path = dir.write("in.jsonl", as_text(data, size));
  remove_cache(path);
  // Both index kinds share the cache file: all the opens of one kind run together, the first
  // building the index and the others reading it from the cache.
  std::optional<std::string> raw[2];
  for (bool skip_empty : {false, true}) {
    const std::vector<LinesOptions> all = {
        {.paths = {path}, .format = LinesFormat::kText, .skip_empty = skip_empty},
        {.paths = {path}, .format = LinesFormat::kJsonl, .skip_empty = skip_empty},
        {.paths = {path},
         .format = LinesFormat::kJsonl,
         .skip_empty = skip_empty,
         .json_fields = {"id", "tokens"}},
    };
    for (const LinesOptions& o : all) {
      try {
        LinesSource source("lines", o);
        const std::string lines = read_all(source, source, false);
        if (!raw[skip_empty])
          raw[skip_empty] = lines;
        else
          expect_same(*raw[skip_empty], lines, "lines");
        (void)read_all(source, source, true);
      } catch (const Error&) {
        // Bad input, reported as it should be.
      }
    }
  }
}

void write_seeds_if_asked(const std::vector<std::string>& seeds) {
  const char* dir = std::getenv("FLOWSTATE_FUZZ_WRITE_SEEDS");
  if (dir == nullptr) return;
  int i = 0;
  for (const auto& s : seeds) {
    std::ofstream out(std::string(dir) + "/seed-" + std::to_string(i++), std::ios::binary);
    out.write(s.data(), static_cast<std::streamsize>(s.size()));
  }
}

void megatron_one_input(const ScratchDir& dir, const std::uint8_t* data, std::size_t size) {
  const std::string_view in = as_text(data, size);
  std::size_t idx_bytes = 0;
  if (in.size() >= 2)
    idx_bytes =
        std::min<std::size_t>(static_cast<unsigned char>(in[0]) |
                                  static_cast<std::size_t>(static_cast<unsigned char>(in[1])) << 8,
                              in.size() - 2);
  const std::string_view rest = in.size() >= 2 ? in.substr(2) : std::string_view{};
  const std::string idx = dir.write("in.idx", rest.substr(0, idx_bytes));
  (void)dir.write("in.bin", rest.substr(idx_bytes));
  for (IndexedUnit unit : {IndexedUnit::kDocument, IndexedUnit::kSequence}) {
    try {
      IndexedSource source("indexed", {.paths = {idx}, .unit = unit});
      (void)read_all(source, source, true);
    } catch (const Error&) {
      // A malformed index, refused as it should be.
    }
  }
}

struct IndexTarget::Impl {
  ScratchDir dir;
  std::string text, tar;

  Impl() {
    text = dir.write("data.txt", "one\n\ntwo\r\n{\"id\": 1}\n\nlast");
    std::string archive;
    append_tar_member(archive, "a.tokens", "12");
    append_tar_member(archive, "a.cls", "3");
    append_tar_member(archive, "b.tokens", "4");
    append_tar_member(archive, "noext", "");
    append_tar_member(archive, "d/c.x.cls", "56");
    append_tar_end(archive);
    tar = dir.write("data.tar", archive);
    // Pinned mtimes: a cache written once (a seed) stays valid for these files.
    const timespec times[2] = {{1'700'000'000, 123}, {1'700'000'000, 123}};
    for (const std::string* f : {&text, &tar})
      if (::utimensat(AT_FDCWD, f->c_str(), times, 0) != 0)
        throw std::runtime_error("utimensat failed on " + *f);
  }

  /// Opens the source of index kind `kind` (0: lines, 1: lines skip_empty, 2: tar) and reads
  /// every record.
  void open(int kind) const {
    if (kind == 2) {
      TarSource s("tar", {.paths = {tar}});
      (void)read_all(s, s, true);
      for (std::uint64_t i = 0; i < s.size(0); ++i) (void)s.key(s.at(0, i));
    } else {
      LinesSource s("lines", {.paths = {text}, .skip_empty = kind == 1});
      (void)read_all(s, s, true);
    }
  }

  /// Has load_index write `index` as the valid cache of `file` for `kind`.
  template <class Entry>
  static void write_cache(const std::string& file, std::string_view kind,
                          const FileIndex<Entry>& index) {
    remove_cache(file);
    const MappedFile map(file);
    (void)load_index<Entry>(map, kind, [&] { return index; });
  }
};

IndexTarget::IndexTarget() : impl_(std::make_unique<Impl>()) {}
IndexTarget::~IndexTarget() = default;

bool IndexTarget::one_input(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return false;
  const int kind = (data[0] & 3) % 3;
  const std::string& file = kind == 2 ? impl_->tar : impl_->text;
  const std::string_view rest = as_text(data + 1, size - 1);
  if ((data[0] & 4) == 0) {
    impl_->dir.write(fs::path(index_cache_path(file)).filename().string(), rest);
  } else if (kind == 2) {
    // A count byte, that many entries (as many as there are bytes for), the string table.
    FileIndex<detail::TarMember> index;
    const std::size_t n =
        rest.empty() ? 0 : std::min<std::size_t>(std::uint8_t(rest[0]), (rest.size() - 1) / 40);
    index.entries.resize(n);
    if (n != 0) std::memcpy(index.entries.data(), rest.data() + 1, n * 40);
    index.strings = rest.substr(std::min(rest.size(), 1 + n * 40));
    Impl::write_cache(file, "tar/1", index);
  } else {
    FileIndex<std::uint64_t> index;
    index.entries.resize(rest.size() / 8);
    if (!index.entries.empty())
      std::memcpy(index.entries.data(), rest.data(), index.entries.size() * 8);
    Impl::write_cache(file, kind == 1 ? "lines/2 skip_empty" : "lines/2", index);
  }
  try {
    impl_->open(kind);
  } catch (const Error&) {
    return false;  // bad input, reported as it should be
  }
  return true;
}

std::vector<std::string> IndexTarget::seeds() {
  std::vector<std::string> out;
  for (char kind = 0; kind < 3; ++kind) {
    const std::string& file = kind == 2 ? impl_->tar : impl_->text;
    remove_cache(file);
    impl_->open(kind);  // writes the cache
    std::ifstream in(index_cache_path(file), std::ios::binary);
    const std::string cache{std::istreambuf_iterator<char>(in), {}};
    if (cache.size() < 72) throw std::runtime_error("no index cache was written for " + file);
    out.push_back(std::string(1, kind) + cache);
    // The same index as a payload: what lies between the 64-byte head (whose entry count is
    // at byte 48) and the 8-byte checksum, after a count byte for tar.
    std::string payload(1, static_cast<char>(kind | 4));
    std::uint64_t count = 0;
    std::memcpy(&count, cache.data() + 48, sizeof(count));
    if (kind == 2) payload += static_cast<char>(count);
    out.push_back(payload + cache.substr(64, cache.size() - 72));
  }
  return out;
}

}  // namespace flowstate::fuzz
