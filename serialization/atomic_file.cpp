#include "flowstate/serialization/atomic_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "flowstate/core/error.h"
#include "flowstate/core/fd.h"

namespace flowstate {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& path, const std::string& what, int err) {
  throw CheckpointError(path, "cannot " + what + " '" + path + "': " + std::strerror(err));
}

std::string parent_of(const std::string& path) {
  fs::path p = fs::path(path).parent_path();
  return p.empty() ? "." : p.string();
}

void write_all(int fd, const std::string& path, std::string_view data) {
  const char* p = data.data();
  std::size_t left = data.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path, "write", errno);
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

int fsync_retrying(int fd) {
  int r;
  do {
    r = ::fsync(fd);
  } while (r != 0 && errno == EINTR);
  return r;
}

}  // namespace

namespace {

void create_and_write(const std::string& path, std::string_view data, bool sync) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) fail(path, "create", errno);
  try {
    write_all(fd.get(), path, data);
    if (sync && fsync_retrying(fd.get()) != 0) fail(path, "fsync", errno);
    if (fd.close() != 0) fail(path, "close", errno);
  } catch (...) {
    ::unlink(path.c_str());
    throw;
  }
}

}  // namespace

void write_file_durably(const std::string& path, std::string_view data) {
  create_and_write(path, data, true);
}

void write_file(const std::string& path, std::string_view data) {
  create_and_write(path, data, false);
}

void fsync_directory(const std::string& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) fail(dir, "open directory", errno);
  if (fsync_retrying(fd.get()) != 0) fail(dir, "fsync directory", errno);
}

void replace_file_atomically(const std::string& path, std::string_view data,
                             Durability durability) {
  const bool durable = durability == Durability::kDurable;
  const std::string tmp = path + ".tmp";
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) fail(tmp, "remove", errno);
  create_and_write(tmp, data, durable);
  try {
    rename_path(tmp, path);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  if (durable) fsync_directory(parent_of(path));
}

void rename_path(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    throw CheckpointError(from,
                          "cannot rename '" + from + "' to '" + to + "': " + std::strerror(errno));
}

void create_directories_durably(const std::string& path) {
  // Create from the outermost missing ancestor inwards, fsyncing each new entry's parent.
  std::vector<fs::path> missing;
  std::error_code ec;
  for (fs::path p = fs::path(path).lexically_normal(); !p.empty(); p = p.parent_path()) {
    if (fs::exists(p, ec)) break;
    missing.push_back(p);
    if (p == p.parent_path()) break;
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    const std::string dir = it->string();
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) fail(dir, "create directory", errno);
    fsync_directory(parent_of(dir));
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(path, "create directory", errno);
  if (!S_ISDIR(st.st_mode))
    throw CheckpointError(
        path, "cannot use '" + path + "' as a checkpoint directory: " + std::strerror(ENOTDIR));
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) throw CheckpointError(path, "cannot remove '" + path + "': " + ec.message());
}

std::string read_small_file(const std::string& path, std::size_t max_bytes) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) fail(path, "open", errno);
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(path, "read", errno);
    }
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > max_bytes)
      throw CheckpointError(
          path, "'" + path + "' is larger than " + std::to_string(max_bytes) + " bytes");
  }
  return out;
}

DirectoryLock::DirectoryLock(const std::string& path) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(path, "create lock file", errno);
  while (::flock(fd_, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    int err = errno;
    ::close(fd_);
    fail(path, "lock", err);
  }
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the only descriptor releases the flock
}

RunLock::RunLock(const std::string& path, const std::string& what) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(path, "create lock file", errno);
  struct flock want {};
  want.l_type = F_WRLCK;
  want.l_whence = SEEK_SET;  // the whole file (l_start 0, l_len 0)
  while (::fcntl(fd_, F_SETLK, &want) != 0) {
    if (errno == EINTR) continue;
    const int err = errno;
    std::string holder;
    if (err == EACCES || err == EAGAIN) {
      struct flock held {};
      held.l_type = F_WRLCK;
      held.l_whence = SEEK_SET;
      if (::fcntl(fd_, F_GETLK, &held) == 0 && held.l_type != F_UNLCK && held.l_pid > 0)
        holder = "pid " + std::to_string(held.l_pid);
      else if (std::string wrote = read_small_file(path, 64).substr(0, 20); !wrote.empty())
        holder = "pid " + wrote;  // a holder in another pid namespace: what it wrote
      else
        holder = "another process";
    }
    ::close(fd_);
    fd_ = -1;
    if (holder.empty()) fail(path, "lock", err);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    throw CheckpointError(path, what + " is in use by another run (" + holder +
                                    ", which holds the lock '" + path +
                                    "'): two runs writing one directory would overwrite each "
                                    "other's checkpoints; wait for that run to end, or give this "
                                    "one another directory");
  }
  // For people (ls, cat): who holds it. The lock, not the file, decides.
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) < 0) {
    // Best effort: the lock is held either way.
  }
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the descriptor releases the record lock
}

}  // namespace flowstate
