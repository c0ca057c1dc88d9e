#include "flowstate/nodes/sources/object_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"
#include "flowstate/nodes/sources/remote_listing.h"
#include "flowstate/nodes/sources/remote_options.h"

namespace flowstate {

CacheLock::CacheLock(const std::filesystem::path& path) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw DataError(path.string(), DataError::kNoOffset,
                    "cannot open the cache lock '" + path.string() + "': " + std::strerror(errno));
  while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
  }
}

CacheLock::~CacheLock() { ::close(fd_); }  // closing releases the lock

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

bool ends_with(const std::string& s, std::string_view tail) { return s.ends_with(tail); }

/// A partial file's writer, from its name "<key>.<pid>.<n>.part"; 0 when the name is not one.
pid_t partial_owner(const std::string& name) {
  if (!ends_with(name, ".part")) return 0;
  const auto a = name.find('.');
  if (a == std::string::npos) return 0;
  const auto b = name.find('.', a + 1);
  if (b == std::string::npos) return 0;
  return static_cast<pid_t>(std::strtol(name.substr(a + 1, b - a - 1).c_str(), nullptr, 10));
}

bool is_copy_name(const std::string& name) {
  // 32 hex digits, then ".obj" or ".obj.fsidx" (the index a source writes beside a copy).
  const std::string base = name.substr(0, 32);
  if (name.size() < 36 || base.find_first_not_of("0123456789abcdef") != std::string::npos)
    return false;
  const std::string rest = name.substr(32);
  return rest == ".obj" || rest == ".obj.fsidx" || rest.starts_with(".obj.fsidx.tmp.");
}

struct Entry {
  std::string name;
  std::uint64_t bytes = 0;
  std::int64_t mtime_ns = 0;
};

std::vector<Entry> list_dir(const std::filesystem::path& dir) {
  std::vector<Entry> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st {};
    if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
      continue;
    out.push_back(
        {std::move(name), static_cast<std::uint64_t>(st.st_size),
         static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec});
  }
  ::closedir(d);
  return out;
}

void fsync_dir(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

std::atomic<std::uint64_t> g_partial_counter{0};

}  // namespace

std::string bytes_text(std::uint64_t b) {
  char buf[64];
  if (b >= (std::uint64_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%llu bytes (%.2f GiB)", static_cast<unsigned long long>(b),
                  static_cast<double>(b) / (1 << 30));
  else if (b >= (std::uint64_t{1} << 20))
    std::snprintf(buf, sizeof buf, "%llu bytes (%.2f MiB)", static_cast<unsigned long long>(b),
                  static_cast<double>(b) / (1 << 20));
  else
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(b));
  return buf;
}

std::uint64_t parse_byte_size(const std::string& text, const std::string& key) {
  std::size_t i = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
  std::string unit = text.substr(i);
  if (!unit.empty() && unit[0] == ' ') unit.erase(0, 1);
  static const std::pair<const char*, std::uint64_t> units[] = {{"", 1},
                                                                {"B", 1},
                                                                {"KB", 1000},
                                                                {"MB", 1000'000},
                                                                {"GB", 1000'000'000},
                                                                {"TB", 1000'000'000'000},
                                                                {"KiB", 1ULL << 10},
                                                                {"MiB", 1ULL << 20},
                                                                {"GiB", 1ULL << 30},
                                                                {"TiB", 1ULL << 40}};
  if (i == 0 || i > 15)
    throw ConfigError(key, "'" + text + "' is not a byte size (like 20GiB, 500MB or 1048576)");
  const std::uint64_t n = std::stoull(text.substr(0, i));
  for (const auto& [name, scale] : units)
    if (unit == name) {
      if (n > ~std::uint64_t{0} / scale) break;
      return n * scale;
    }
  throw ConfigError(key, "'" + text + "' is not a byte size (like 20GiB, 500MB or 1048576)");
}

CacheSettings CacheSettings::from_environment() {
  CacheSettings s;
  s.dir = environment_dir();
  s.limit = environment_limit();
  return s;
}

std::filesystem::path CacheSettings::environment_dir() {
  std::string dir = env("FLOWSTATE_CACHE_DIR");
  if (dir.empty()) {
    const std::string xdg = env("XDG_CACHE_HOME");
    const std::string home = env("HOME");
    dir = !xdg.empty() ? xdg + "/flowstate" : (!home.empty() ? home + "/.cache/flowstate" : "");
    if (dir.empty()) dir = "/tmp/flowstate-cache-" + std::to_string(::getuid());
  }
  return dir;
}

std::uint64_t CacheSettings::environment_limit() {
  std::uint64_t limit = std::uint64_t{20} << 30;
  const std::string text = env("FLOWSTATE_CACHE_LIMIT");
  if (!text.empty()) limit = parse_byte_size(text, "FLOWSTATE_CACHE_LIMIT");
  if (limit == 0) throw ConfigError("FLOWSTATE_CACHE_LIMIT", "must be more than 0 bytes");
  return limit;
}

std::string cache_key(const RemoteObject& object) {
  return hex64(hash64(object.url)) + hex64(hash_combine(hash64(object.etag), object.size));
}

std::string block_key(const RemoteObject& object, std::uint64_t offset, std::uint64_t length) {
  // The whole object's key with the range folded into its second half: another name for each
  // block, and none equal to a whole copy's (a range is never hashed into the whole key).
  return hex64(hash64(object.url)) +
         hex64(hash_combine(
             hash_combine(hash_combine(hash64(object.etag), object.size), hash64("range")),
             hash_combine(offset, length)));
}

CachePin::~CachePin() {
  if (fd_ >= 0) ::close(fd_);
}

ObjectCache::ObjectCache(CacheSettings settings)
    : settings_(std::move(settings)),
      objects_(settings_.dir / "objects"),
      partial_(settings_.dir / "partial"),
      lock_path_(settings_.dir / "lock") {
  std::error_code ec;
  std::filesystem::create_directories(objects_, ec);
  if (!ec) std::filesystem::create_directories(partial_, ec);
  if (ec)
    throw DataError(
        settings_.dir.string(), DataError::kNoOffset,
        "cannot create the cache directory '" + settings_.dir.string() + "': " + ec.message());
}

std::uint64_t ObjectCache::usage() const {
  std::uint64_t total = 0;
  for (const auto& e : list_dir(objects_))
    if (is_copy_name(e.name)) total += e.bytes;
  for (const auto& e : list_dir(partial_))
    if (partial_owner(e.name) > 0) total += e.bytes;
  return total;
}

bool ObjectCache::make_room(std::uint64_t bytes) {
  // Dead writers' partial files first: a process killed mid-download left them.
  for (const auto& e : list_dir(partial_)) {
    const pid_t owner = partial_owner(e.name);
    if (owner > 0 && ::kill(owner, 0) != 0 && errno == ESRCH) ::unlink((partial_ / e.name).c_str());
  }
  std::uint64_t used = usage();
  if (used + bytes <= settings_.limit) return true;
  std::vector<Entry> copies;
  for (auto& e : list_dir(objects_))
    if (is_copy_name(e.name) && ends_with(e.name, ".obj")) copies.push_back(std::move(e));
  std::sort(copies.begin(), copies.end(),
            [](const Entry& a, const Entry& b) { return a.mtime_ns < b.mtime_ns; });
  for (const auto& e : copies) {
    const std::string path = (objects_ / e.name).string();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    // A copy someone reads holds a shared lock: skip it.
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      std::uint64_t freed = 0;
      struct stat st {};
      if (::unlink(path.c_str()) == 0) freed += e.bytes;
      if (::stat((path + ".fsidx").c_str(), &st) == 0 && ::unlink((path + ".fsidx").c_str()) == 0)
        freed += static_cast<std::uint64_t>(st.st_size);
      used -= std::min(used, freed);
    }
    ::close(fd);
    if (used + bytes <= settings_.limit) return true;
  }
  return used + bytes <= settings_.limit;
}

std::shared_ptr<const CachePin> ObjectCache::lookup(const RemoteObject& object) {
  return lookup(cache_key(object), object.size);
}

std::shared_ptr<const CachePin> ObjectCache::lookup(const std::string& key, std::uint64_t size) {
  const std::string path = (objects_ / (key + ".obj")).string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) != size ||
      ::flock(fd, LOCK_SH | LOCK_NB) != 0) {
    // Not whole (cannot happen through this cache): it goes, and is downloaded again.
    if (::fstat(fd, &st) == 0 && static_cast<std::uint64_t>(st.st_size) != size)
      ::unlink(path.c_str());
    ::close(fd);
    return nullptr;
  }
  ::futimens(fd, nullptr);  // most recently used
  return std::make_shared<const CachePin>(path, fd);
}

std::shared_ptr<const CachePin> ObjectCache::download(const RemoteObject& object,
                                                      const RemoteSettings& remote) {
  return download(cache_key(object), object, 0, object.size, remote);
}

std::shared_ptr<const CachePin> ObjectCache::download(const std::string& key,
                                                      const RemoteObject& object,
                                                      std::uint64_t offset, std::uint64_t length,
                                                      const RemoteSettings& remote) {
  // What is cached: the whole object, or (a block) its bytes [offset, offset + length).
  const bool whole = offset == 0 && length == object.size;
  const std::string shown = whole ? object.url
                                  : object.url + " bytes " + std::to_string(offset) + "-" +
                                        std::to_string(offset + length - 1);
  const std::string part = (partial_ / (key + "." + std::to_string(::getpid()) + "." +
                                        std::to_string(g_partial_counter.fetch_add(1)) + ".part"))
                               .string();
  int fd = -1;
  const auto deadline = std::chrono::steady_clock::now() + remote.timeout;
  for (;;) {
    {
      CacheLock lock(lock_path_);
      if (auto pin = lookup(key, length)) return pin;  // another process fetched it meanwhile
      if (make_room(length)) {
        fd = ::open(part.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(length)) != 0) {
          const int err = errno;
          if (fd >= 0) {
            ::close(fd);
            ::unlink(part.c_str());
          }
          throw DataError(part, DataError::kNoOffset,
                          "cannot create the cache file '" + part + "': " + std::strerror(err));
        }
        break;
      }
    }
    if (std::chrono::steady_clock::now() > deadline)
      throw DataError(object.url, DataError::kNoOffset,
                      "cannot cache '" + shown + "' (" + bytes_text(length) + "): the cache '" +
                          settings_.dir.string() + "' (limit " + bytes_text(settings_.limit) +
                          ") is held by copies other processes are reading");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  try {
    download_range(object, offset, length, fd, remote);
    if (::fsync(fd) != 0)
      throw DataError(part, DataError::kNoOffset,
                      "cannot write the cache file '" + part + "': " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) != length)
      throw DataError(object.url, DataError::kNoOffset,
                      "the cached copy of '" + shown + "' is not " + bytes_text(length));
    const std::string path = (objects_ / (key + ".obj")).string();
    {
      CacheLock lock(lock_path_);
      ::flock(fd, LOCK_SH);  // pinned before it is visible as a copy
      if (::rename(part.c_str(), path.c_str()) != 0)
        throw DataError(path, DataError::kNoOffset,
                        "cannot commit the cache file '" + path + "': " + std::strerror(errno));
      fsync_dir(objects_);
    }
    return std::make_shared<const CachePin>(path, fd);
  } catch (...) {
    ::close(fd);
    ::unlink(part.c_str());
    throw;
  }
}

std::vector<std::shared_ptr<const CachePin>> ObjectCache::fetch(
    const std::vector<RemoteObject>& objects, const RemoteSettings& remote) {
  std::uint64_t total = 0, largest = 0;
  for (const auto& o : objects) {
    total += o.size;
    largest = std::max(largest, o.size);
  }
  if (total > settings_.limit)
    throw ConfigError(settings_.limit_key,
                      "the cache limit " + bytes_text(settings_.limit) + " is smaller than the " +
                          bytes_text(total) + " of the " + std::to_string(objects.size()) +
                          " remote objects a source holds open together (largest " +
                          bytes_text(largest) + "); raise " + settings_.limit_key);
  std::vector<std::shared_ptr<const CachePin>> pins(objects.size());
  std::vector<std::size_t> missing;
  {
    CacheLock lock(lock_path_);
    for (std::size_t i = 0; i < objects.size(); ++i)
      if (!(pins[i] = lookup(objects[i]))) missing.push_back(i);
  }
  for_each_connection(missing.size(), remote.connections, [&](std::size_t j) {
    pins[missing[j]] = download(objects[missing[j]], remote);
  });
  return pins;
}

std::shared_ptr<const CachePin> ObjectCache::fetch_range(const RemoteObject& object,
                                                         std::uint64_t offset, std::uint64_t length,
                                                         const RemoteSettings& remote) {
  if (length > settings_.limit)
    throw ConfigError(settings_.limit_key, "the cache limit " + bytes_text(settings_.limit) +
                                               " is smaller than a block of " + bytes_text(length) +
                                               " of '" + object.url + "'; raise " +
                                               settings_.limit_key);
  const std::string key = block_key(object, offset, length);
  {
    CacheLock lock(lock_path_);
    if (auto pin = lookup(key, length)) return pin;
  }
  return download(key, object, offset, length, remote);
}

std::vector<std::shared_ptr<const CachePin>> ObjectCache::pin_cached(
    const std::vector<Range>& ranges) {
  std::vector<std::string> keys;
  keys.reserve(ranges.size());
  for (const Range& r : ranges) keys.push_back(block_key(*r.object, r.offset, r.length));
  std::vector<std::shared_ptr<const CachePin>> pins(ranges.size());
  CacheLock lock(lock_path_);
  for (std::size_t i = 0; i < ranges.size(); ++i) pins[i] = lookup(keys[i], ranges[i].length);
  return pins;
}

std::vector<ExpandedPath> expand_remote_paths(const std::string& pattern,
                                              const SourceRemote* source) {
  const RemoteSettings remote = resolve_remote_settings(source);
  const auto objects = job_listing(pattern, remote);  // once per job (remote_listing.h)
  ObjectCache cache(resolve_cache_settings(source));
  const auto pins = cache.fetch(objects, remote);
  std::vector<ExpandedPath> out;
  out.reserve(objects.size());
  for (std::size_t i = 0; i < objects.size(); ++i)
    out.push_back({.path = pins[i]->path(),
                   .name = objects[i].url,
                   .keep = pins[i],
                   .etag = objects[i].etag});
  return out;
}

}  // namespace flowstate
