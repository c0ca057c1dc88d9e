#include "flowstate/nodes/sources/mapped_file.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "flowstate/core/error.h"

namespace flowstate {

MappedFile::MappedFile(std::string path) : path_(std::move(path)) {
  int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw DataError(path_, DataError::kNoOffset,
                    "cannot open '" + path_ + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw DataError(path_, DataError::kNoOffset,
                    "cannot stat '" + path_ + "': " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw DataError(path_, DataError::kNoOffset, "'" + path_ + "' is not a regular file");
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      throw DataError(path_, DataError::kNoOffset,
                      "cannot map '" + path_ + "': " + std::strerror(err));
    }
    // Records are read in shuffled order: tell the kernel not to read ahead.
    ::madvise(p, size_, MADV_RANDOM);
    data_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
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
                                             const std::filesystem::path& base_dir) {
  std::vector<ExpandedPath> out;
  std::set<std::string> seen;
  for (const auto& written : patterns) {
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
