// A read-only memory mapping of a whole file. Errors name the file.
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace flowstate {

/// A file mapped read-only. Empty files map to no memory. Immutable and thread-safe.
class MappedFile {
 public:
  /// Maps `path`; throws DataError naming the file when it cannot be opened or mapped.
  explicit MappedFile(std::string path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  std::string path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

/// A file a pattern matched.
struct ExpandedPath {
  std::string path;  ///< as opened (base_dir applied)
  /// The pattern's root as written — its directory part before the first wildcard — then the
  /// path below it: the same wherever base_dir, or an absolute root's directory, lies.
  std::string name;
};

/// expand_paths, with each file's name (see ExpandedPath).
std::vector<ExpandedPath> expand_named_paths(const std::vector<std::string>& patterns,
                                             const std::filesystem::path& base_dir = {});

/// Expands `patterns` (plain paths or globs): each pattern's matches in sorted order,
/// patterns in the given order, duplicates dropped, flowstate's index caches (*.fsidx) left
/// out. A relative pattern is taken relative to `base_dir` when one is given (a YAML file's
/// directory). Throws DataError naming a pattern that matches nothing.
std::vector<std::string> expand_paths(const std::vector<std::string>& patterns,
                                      const std::filesystem::path& base_dir = {});

}  // namespace flowstate
