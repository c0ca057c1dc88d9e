// The index of a data file — the byte offset of each line, the members of each tar sample —
// built once by a source and cached beside the file as `<file>.fsidx`, so that reopening a
// large dataset costs a read of its index, not a scan of its bytes.
//
// An index is a vector of fixed-size, trivially copyable entries plus an optional string
// table the entries point into (names). The cache file holds, in host byte order:
//
//   magic "FSINDEX\0", format version, hash of the index kind, entry size,
//   the data file's size and mtime (ns), entry count, string table size,
//   the entries, the string table, and an XXH3-64 checksum of everything before it.
//
// A cache is used only when it was written for the same kind and entry size, its recorded
// size and mtime match the data file, and its checksum verifies. Otherwise the index is built
// and the cache rewritten atomically (a `<file>.fsidx.tmp.<pid>.<n>` file renamed over it),
// so a reader sees the old cache or the new one, never a torn one — and should a torn file
// survive a crash anyway, its checksum fails and it is rebuilt. When the cache cannot be
// written (read-only directory, full disk, a directory in its place), the index is kept in
// memory only: a cache is an optimisation, never an error.
//
//   FileIndex<std::uint64_t> index = load_index<std::uint64_t>(
//       file, "lines/2", [&] { return scan_lines(file); });
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "flowstate/nodes/sources/mapped_file.h"

namespace flowstate {

/// Where load_index found an index.
enum class IndexOrigin : std::uint8_t {
  kCache,     ///< read from a valid `<file>.fsidx`
  kBuilt,     ///< built, and the cache written (it was missing, stale or corrupt)
  kInMemory,  ///< built; no cache could be written, or the file changed since it was mapped
};

/// The index of one data file: fixed-size entries plus a string table they may refer to
/// (by offset and length).
template <class Entry>
struct FileIndex {
  static_assert(std::is_trivially_copyable_v<Entry>, "index entries are stored as raw bytes");
  std::vector<Entry> entries;
  std::string strings;
};

/// The cache file of `data_path`: `<data_path>.fsidx`.
std::string index_cache_path(const std::string& data_path);

namespace detail {

/// Type-erased access to a FileIndex's storage, so the cache I/O is not a template.
struct IndexStorage {
  std::size_t entry_size = 0;
  std::function<std::byte*(std::size_t count)> resize;  ///< resizes the entries; their bytes
  std::function<std::span<const std::byte>()> bytes;    ///< the entries' bytes
  std::string* strings = nullptr;
};

/// Fills `storage` from the cache of `file` (when `valid`, if set, accepts what it read) or
/// by calling `build`; see load_index.
IndexOrigin load_index(const MappedFile& file, std::string_view kind, const IndexStorage& storage,
                       const std::function<void()>& build, const std::function<bool()>& valid = {});

}  // namespace detail

/// The index of `file`: read from `<file>.fsidx` when that cache is valid for `kind`, else
/// `build()` (returning a FileIndex<Entry>) is called and the cache rewritten. `kind` names
/// the entry format and everything the builder depends on ("lines/2 skip_empty"); change it
/// when either changes, and old caches are rebuilt. Exceptions from `build` propagate, and no
/// cache is written. Failing to read or write the cache is not an error. Thread-safe for
/// different files; concurrent loads of one file (threads or processes) are safe, each
/// writing its own temporary file. `origin`, when given, receives where the index came from.
/// `valid`, when given, checks an index read from the cache against `file`: one it rejects
/// is treated as a corrupt cache (built again, the cache rewritten). The checksum catches a
/// torn or damaged cache, not one written to pass it; a source that reads the mapping at
/// the offsets an index gives checks with `valid` that they lie inside the file.
template <class Entry, class Build>
FileIndex<Entry> load_index(const MappedFile& file, std::string_view kind, Build&& build,
                            IndexOrigin* origin = nullptr,
                            const std::function<bool(const FileIndex<Entry>&)>& valid = {}) {
  FileIndex<Entry> index;
  detail::IndexStorage storage{
      .entry_size = sizeof(Entry),
      .resize =
          [&index](std::size_t count) {
            index.entries.resize(count);
            return reinterpret_cast<std::byte*>(index.entries.data());
          },
      .bytes = [&index] { return std::as_bytes(std::span(index.entries)); },
      .strings = &index.strings};
  std::function<bool()> check;
  if (valid) check = [&] { return valid(index); };
  IndexOrigin got = detail::load_index(
      file, kind, storage, [&] { index = build(); }, check);
  if (origin != nullptr) *origin = got;
  return index;
}

}  // namespace flowstate
