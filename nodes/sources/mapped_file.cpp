#include "flowstate/nodes/sources/mapped_file.h"

#include <fcntl.h>
#include <glob.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "flowstate/core/error.h"
#include "flowstate/nodes/sources/object_cache.h"
#include "flowstate/nodes/sources/remote_store.h"

namespace flowstate {

/// The live mappings by address, for the SIGBUS handler. A spin lock, not a mutex: the handler
/// takes it too (it runs on the thread whose read faulted, which never holds it: only the
/// registration below takes it, and it reads no mapped byte).
struct MappingRegistry {
  static MappingRegistry& get() {
    static MappingRegistry* r = new MappingRegistry;  // never destroyed: a late fault finds it
    return *r;
  }
  void lock() {
    while (busy.test_and_set(std::memory_order_acquire)) {
    }
  }
  void unlock() { busy.clear(std::memory_order_release); }

  void add(const MappedFile* f) {
    install();
    lock();
    try {
      files.emplace(reinterpret_cast<std::uintptr_t>(f->data_), f);
    } catch (...) {
      unlock();
      throw;
    }
    unlock();
  }
  void remove(const MappedFile* f) {
    lock();
    files.erase(reinterpret_cast<std::uintptr_t>(f->data_));
    if (f->fault_offset_.load(std::memory_order_relaxed) != MappedFile::kNoFault)
      faulted.fetch_sub(1, std::memory_order_relaxed);
    unlock();
  }

  /// Called on SIGBUS: a read at `addr` of a mapping whose file lost that page gets a page of
  /// zeros there and the mapping remembers the offset; false when `addr` is no mapping's.
  bool on_fault(std::uintptr_t addr) {
    lock();
    bool handled = false;
    auto it = files.upper_bound(addr);
    if (it != files.begin()) {
      --it;
      const MappedFile* f = it->second;
      if (addr < it->first + f->size_) {
        const std::uintptr_t page = addr & ~(page_size - 1);
        void* p = ::mmap(reinterpret_cast<void*>(page), page_size, PROT_READ,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if (p != MAP_FAILED) {
          const std::uint64_t offset = addr - it->first;
          std::uint64_t prev = f->fault_offset_.load(std::memory_order_relaxed);
          if (prev == MappedFile::kNoFault) faulted.fetch_add(1, std::memory_order_relaxed);
          while (offset < prev &&
                 !f->fault_offset_.compare_exchange_weak(prev, offset, std::memory_order_release)) {
          }
          handled = true;
        }
      }
    }
    unlock();
    return handled;
  }

  static void handler(int sig, siginfo_t* info, void* ctx) {
    if (get().on_fault(reinterpret_cast<std::uintptr_t>(info->si_addr))) return;
    // Not a read of ours: whatever handled SIGBUS before flowstate does.
    const struct sigaction& prev = get().previous;
    if ((prev.sa_flags & SA_SIGINFO) != 0 && prev.sa_sigaction != nullptr) {
      prev.sa_sigaction(sig, info, ctx);
    } else if ((prev.sa_flags & SA_SIGINFO) == 0 && prev.sa_handler != SIG_DFL &&
               prev.sa_handler != SIG_IGN) {
      prev.sa_handler(sig);
    } else {
      // The default action: returning repeats the read, which raises SIGBUS again.
      ::signal(SIGBUS, SIG_DFL);
    }
  }

  void install() {
    std::call_once(installed, [this] {
      page_size = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
      struct sigaction sa {};
      sa.sa_sigaction = &MappingRegistry::handler;
      sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
      sigemptyset(&sa.sa_mask);
      ::sigaction(SIGBUS, &sa, &previous);
    });
  }

  std::atomic_flag busy = ATOMIC_FLAG_INIT;
  std::map<std::uintptr_t, const MappedFile*> files;
  std::atomic<std::uint64_t> faulted{0};
  std::uintptr_t page_size = 4096;
  struct sigaction previous {};
  std::once_flag installed;
};

std::size_t live_mappings() {
  MappingRegistry& r = MappingRegistry::get();
  r.lock();
  const std::size_t n = r.files.size();
  r.unlock();
  return n;
}

std::uint64_t faulted_mappings() {
  return MappingRegistry::get().faulted.load(std::memory_order_relaxed);
}

void check_mappings() {
  MappingRegistry& r = MappingRegistry::get();
  if (r.faulted.load(std::memory_order_acquire) == 0) return;
  std::string path;
  std::uint64_t offset = MappedFile::kNoFault, size = 0;
  r.lock();
  for (const auto& [base, f] : r.files) {
    const std::uint64_t o = f->fault_offset();
    if (o == MappedFile::kNoFault) continue;
    path = f->path();
    offset = o;
    size = f->size();
    break;
  }
  r.unlock();
  if (offset == MappedFile::kNoFault) return;
  struct stat st {};
  const std::string now = ::stat(path.c_str(), &st) == 0
                              ? "it has " + std::to_string(st.st_size) + " bytes now"
                              : "it is gone now (" + std::string(std::strerror(errno)) + ")";
  throw DataError(path, offset,
                  "'" + path + "' changed while it was read: byte " + std::to_string(offset) +
                      " is past its end (it had " + std::to_string(size) + " bytes when opened; " +
                      now +
                      "); a data file must not be truncated or replaced while a run reads it");
}

MappedFile::MappedFile(std::string path) : path_(std::move(path)) {
  int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw DataError(path_, DataError::kNoOffset,
                    "cannot open '" + path_ + "': " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    throw DataError(path_, DataError::kNoOffset,
                    "cannot stat '" + path_ + "': " + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    throw DataError(path_, DataError::kNoOffset, "'" + path_ + "' is not a regular file");
  auto ns = [](const struct timespec& t) {
    return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
  };
  stat_ = {static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino),
           ns(st.st_mtim), ns(st.st_ctim)};
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ == 0) return;
  if (size_ <= kReadIntoMemoryBytes) {
    // A small file is read whole now: no mapping held, and nothing can cut it short later.
    buffer_ = std::make_unique_for_overwrite<std::byte[]>(size_);
    std::size_t got = 0;
    while (got < size_) {
      const ssize_t r = ::pread(fd, buffer_.get() + got, size_ - got, static_cast<off_t>(got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0)
        throw DataError(path_, got, "cannot read '" + path_ + "': " + std::strerror(errno));
      if (r == 0)
        throw DataError(path_, got,
                        "'" + path_ + "' changed while it was read: byte " + std::to_string(got) +
                            " is past its end (it had " + std::to_string(size_) +
                            " bytes when opened); a data file must not be truncated or "
                            "replaced while a run reads it");
      got += static_cast<std::size_t>(r);
    }
    data_ = buffer_.get();
    return;
  }
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    std::string why = std::strerror(err);
    if (err == ENOMEM)
      why += " (" + std::to_string(live_mappings()) +
             " files are mapped already; the kernel allows vm.max_map_count mappings per "
             "process, 65 530 by default: files of more than " +
             std::to_string(kReadIntoMemoryBytes >> 10) +
             " KiB are mapped one mapping each, up to FLOWSTATE_MAPPED_FILES per source (a "
             "quarter of that limit), so lower FLOWSTATE_MAPPED_FILES, join shards or raise "
             "vm.max_map_count)";
    throw DataError(path_, DataError::kNoOffset, "cannot map '" + path_ + "': " + why);
  }
  // Records are read in shuffled order: tell the kernel not to read ahead.
  ::madvise(p, size_, MADV_RANDOM);
  data_ = static_cast<const std::byte*>(p);
  try {
    MappingRegistry::get().add(this);
  } catch (...) {
    ::munmap(p, size_);
    data_ = nullptr;
    throw;
  }
}

MappedFile::~MappedFile() {
  if (data_ == nullptr || buffer_ != nullptr) return;
  MappingRegistry::get().remove(this);
  ::munmap(const_cast<std::byte*>(data_), size_);
}

namespace {

/// The index caches flowstate writes beside data files (and their temporary files): never data.
bool is_index_cache(std::string_view path) {
  return path.ends_with(".fsidx") || path.find(".fsidx.tmp.") != std::string_view::npos;
}

}  // namespace

namespace {

/// The directory part of `pattern` before its first wildcard, with its trailing '/' ("" when
/// the pattern has none).
std::string pattern_root(const std::string& pattern) {
  const std::size_t wild = pattern.find_first_of("*?[");
  const std::size_t slash =
      pattern.rfind('/', wild == std::string::npos ? std::string::npos : wild);
  return slash == std::string::npos ? "" : pattern.substr(0, slash + 1);
}

}  // namespace

std::vector<std::string> expand_paths(const std::vector<std::string>& patterns,
                                      const std::filesystem::path& base_dir) {
  std::vector<std::string> out;
  for (auto& f : expand_named_paths(patterns, base_dir)) out.push_back(std::move(f.path));
  return out;
}

std::vector<ExpandedPath> expand_named_paths(const std::vector<std::string>& patterns,
                                             const std::filesystem::path& base_dir,
                                             const SourceRemote* remote) {
  std::vector<ExpandedPath> out;
  std::set<std::string> seen;
  for (const auto& written : patterns) {
    if (is_remote_url(written)) {
      for (auto& r : expand_remote_paths(written, remote))
        if (seen.insert(r.name).second) out.push_back(std::move(r));
      continue;
    }
    const std::filesystem::path w(written);
    const std::string pattern =
        w.is_relative() && !base_dir.empty() ? (base_dir / w).string() : written;
    glob_t g{};
    int rc = ::glob(pattern.c_str(), GLOB_NOSORT, nullptr, &g);
    std::vector<std::string> matches;
    if (rc == 0) {
      // A glob like "data/*" also matches the index caches of the files it names.
      for (std::size_t i = 0; i < g.gl_pathc; ++i)
        if (!is_index_cache(g.gl_pathv[i])) matches.emplace_back(g.gl_pathv[i]);
    }
    ::globfree(&g);
    if (matches.empty())
      throw DataError(pattern, DataError::kNoOffset, "no file matches '" + pattern + "'");
    std::sort(matches.begin(), matches.end());
    // glob keeps the pattern's literal directories as given, so each match starts with the
    // resolved pattern's root; `pattern` ends with `written`.
    const std::string root = pattern_root(written);
    const std::size_t resolved_root = pattern.size() - written.size() + root.size();
    for (auto& m : matches) {
      if (!seen.insert(m).second) continue;
      std::string name = m.compare(0, resolved_root, pattern, 0, resolved_root) == 0
                             ? root + m.substr(resolved_root)
                             : m;
      out.push_back({std::move(m), std::move(name)});
    }
  }
  return out;
}

}  // namespace flowstate
