#include "flowstate/nodes/sources/index_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "flowstate/core/fd.h"
#include "flowstate/core/hash.h"

namespace flowstate {
namespace {

constexpr char kMagic[8] = {'F', 'S', 'I', 'N', 'D', 'E', 'X', '\0'};
constexpr std::uint32_t kFormatVersion = 1;

/// The fixed-size head of a cache file. Every field is checked before the cache is used.
struct CacheHeader {
  char magic[8];
  std::uint32_t format_version;
  std::uint32_t reserved;  ///< zero; keeps the 64-bit fields aligned
  std::uint64_t kind_hash;
  std::uint64_t entry_size;
  std::uint64_t data_size;
  std::int64_t data_mtime_ns;
  std::uint64_t entry_count;
  std::uint64_t strings_size;
};
static_assert(sizeof(CacheHeader) == 64 && std::is_trivially_copyable_v<CacheHeader>);

bool read_all(int fd, void* data, std::size_t size) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

bool write_all(int fd, const void* data, std::size_t size) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

bool same_identity(const CacheHeader& a, const CacheHeader& b) {
  return std::memcmp(a.magic, b.magic, sizeof(a.magic)) == 0 &&
         a.format_version == b.format_version && a.reserved == b.reserved &&
         a.kind_hash == b.kind_hash && a.entry_size == b.entry_size && a.data_size == b.data_size &&
         a.data_mtime_ns == b.data_mtime_ns;
}

/// Reads the cache at `path` into `storage` when it matches `expected` (everything but the
/// counts) and its checksum verifies; on false, `storage` is left empty.
bool read_cache(const std::string& path, const CacheHeader& expected,
                const detail::IndexStorage& storage) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return false;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  CacheHeader h{};
  if (!read_all(fd.get(), &h, sizeof(h)) || !same_identity(h, expected)) return false;
  // The counts must add up to the file's size before anything is allocated, so a corrupt
  // count cannot ask for a huge allocation.
  const auto file_size = static_cast<std::uint64_t>(st.st_size);
  const std::uint64_t fixed = sizeof(CacheHeader) + sizeof(std::uint64_t);
  if (file_size < fixed || h.entry_count > (file_size - fixed) / h.entry_size) return false;
  const std::uint64_t entry_bytes = h.entry_count * h.entry_size;
  if (h.strings_size != file_size - fixed - entry_bytes) return false;

  Hasher hasher;
  hasher.update(&h, sizeof(h));
  std::byte* entries = storage.resize(static_cast<std::size_t>(h.entry_count));
  storage.strings->resize(static_cast<std::size_t>(h.strings_size));
  std::uint64_t checksum = 0;
  bool ok = read_all(fd.get(), entries, entry_bytes) &&
            read_all(fd.get(), storage.strings->data(), storage.strings->size()) &&
            read_all(fd.get(), &checksum, sizeof(checksum));
  if (ok) {
    hasher.update(entries, entry_bytes).update(*storage.strings);
    ok = hasher.digest() == checksum;
  }
  if (!ok) {
    storage.resize(0);
    storage.strings->clear();
  }
  return ok;
}

/// Writes `storage` to `path` through a temporary file and a rename; false on any failure
/// (the temporary file is removed).
bool write_cache(const std::string& path, const CacheHeader& h,
                 const detail::IndexStorage& storage) {
  // Unique per process and per call: two threads indexing the same file must not share a
  // temporary file; O_EXCL keeps a stale one from a crashed process with a reused pid intact.
  static std::atomic<std::uint64_t> sequence{0};
  const std::string tmp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(sequence++);
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) return false;
  const std::span<const std::byte> entries = storage.bytes();
  const std::string& strings = *storage.strings;
  Hasher hasher;
  hasher.update(&h, sizeof(h)).update(entries.data(), entries.size()).update(strings);
  const std::uint64_t checksum = hasher.digest();
  bool ok = write_all(fd.get(), &h, sizeof(h)) &&
            write_all(fd.get(), entries.data(), entries.size()) &&
            write_all(fd.get(), strings.data(), strings.size()) &&
            write_all(fd.get(), &checksum, sizeof(checksum));
  ok = fd.close() == 0 && ok;
  if (ok) ok = ::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) ::unlink(tmp.c_str());
  return ok;
}

}  // namespace

std::string index_cache_path(const std::string& data_path) { return data_path + ".fsidx"; }

IndexOrigin detail::load_index(const MappedFile& file, std::string_view kind,
                               const IndexStorage& storage, const std::function<void()>& build,
                               const std::function<bool()>& valid) {
  struct stat st {};
  // A cache is keyed by the file's size and mtime. A file whose size is no longer the mapped
  // one changed after it was mapped: no cache, old or new, can be trusted to describe the
  // mapping, so the index is built from the mapping and kept in memory.
  if (::stat(file.path().c_str(), &st) != 0 ||
      static_cast<std::uint64_t>(st.st_size) != file.size()) {
    build();
    return IndexOrigin::kInMemory;
  }
  CacheHeader h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.format_version = kFormatVersion;
  h.kind_hash = hash64(kind);
  h.entry_size = storage.entry_size;
  h.data_size = file.size();
  h.data_mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 +
                    static_cast<std::int64_t>(st.st_mtim.tv_nsec);
  const std::string cache = index_cache_path(file.path());
  if (read_cache(cache, h, storage)) {
    if (!valid || valid()) return IndexOrigin::kCache;
    storage.resize(0);
    storage.strings->clear();
  }
  build();
  h.entry_count = storage.bytes().size() / storage.entry_size;
  h.strings_size = storage.strings->size();
  return write_cache(cache, h, storage) ? IndexOrigin::kBuilt : IndexOrigin::kInMemory;
}

}  // namespace flowstate
