// The read-only mapping of a whole file, for the hand-written W2 programs (w2_ceiling,
// w2_two_core_probe): no flowstate code, so that what they time is theirs alone.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace w2 {

struct Map {
  const std::byte* data = nullptr;
  std::size_t size = 0;
};

/// Maps `path` read-only (its pages mapped at once with `populate`); exits on an error.
inline Map map_file(const std::string& path, bool populate) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    std::perror(path.c_str());
    std::exit(1);
  }
  struct stat st {};
  ::fstat(fd, &st);
  Map m;
  m.size = static_cast<std::size_t>(st.st_size);
  void* p = ::mmap(nullptr, m.size, PROT_READ, MAP_PRIVATE | (populate ? MAP_POPULATE : 0), fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  m.data = static_cast<const std::byte*>(p);
  return m;
}

}  // namespace w2
