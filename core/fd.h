// Fd: a file descriptor closed on scope exit — unless closed explicitly, which reports
// close(2)'s result (a deferred write error shows up there).
#pragma once

#include <unistd.h>

namespace flowstate {

/// Owns a descriptor (or -1). Not copyable.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  /// Closes now; returns close(2)'s result (0, or -1 with errno set).
  int close() {
    const int r = ::close(fd_);
    fd_ = -1;
    return r;
  }

 private:
  int fd_;
};

}  // namespace flowstate
