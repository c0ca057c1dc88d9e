// What `flowstate run` shows and keeps while it runs (cli/cmd_run.cpp): the SIGTERM/SIGINT
// flag and its handlers, append-only line files (--digests, --provenance) that survive a
// killed run, and the progress line. Private to the command.
#pragma once

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>

#include "cli/command.h"
#include "flowstate/core/batch.h"
#include "flowstate/core/error.h"
#include "flowstate/nodes/sources/mapped_file.h"

namespace flowstate::cli {

/// The signal that asked the run to stop (0: none); set by the handler SignalScope installs.
inline std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "signal flag must be lock-free");

// Only sets the flag: RunLoop::run checks it between batches.
inline void on_signal(int sig) { g_signal.store(sig, std::memory_order_relaxed); }

/// Installs the SIGTERM/SIGINT handlers for its lifetime. SA_RESETHAND: a second signal
/// takes the default action, so a stuck run can still be killed.
class SignalScope {
 public:
  SignalScope() {
    g_signal.store(0);
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    ::sigaction(SIGTERM, &sa, &old_term_);
    ::sigaction(SIGINT, &sa, &old_int_);
  }
  ~SignalScope() {
    ::sigaction(SIGTERM, &old_term_, nullptr);
    ::sigaction(SIGINT, &old_int_, nullptr);
  }
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

 private:
  struct sigaction old_term_ {};
  struct sigaction old_int_ {};
};

/// Where the whole lines of `path` end when its last line lacks its newline, else nullopt.
/// A run killed in the middle of a write leaves such a line (Linux stops a write to a file at a
/// page boundary for a fatal signal), and a resumed run appending after it would glue its first
/// line to it. (Mapped: only the pages from the last newline on are read.)
inline std::optional<std::uintmax_t> cut_last_line(const std::string& path) {
  const MappedFile f(path);
  if (f.size() == 0 || f.data()[f.size() - 1] == std::byte{'\n'}) return std::nullopt;
  const void* nl = ::memrchr(f.data(), '\n', f.size());
  return nl == nullptr ? 0 : static_cast<const std::byte*>(nl) - f.data() + 1;
}

/// An append-only line file ("-": stdout), flushed after every line. A last line that a killed
/// run left cut short is dropped before appending (its batch is delivered again after the
/// resume), so every line of the file stays whole.
class LineOutput {
 public:
  LineOutput(const std::optional<std::string>& path, const std::string& flag) : flag_(flag) {
    if (!path) return;
    path_ = *path;
    if (*path == "-") {
      file_ = stdout;
      return;
    }
    std::error_code ec;
    if (std::filesystem::is_regular_file(*path, ec)) {
      if (const auto whole = cut_last_line(*path)) {
        std::filesystem::resize_file(*path, *whole, ec);
        if (ec)
          throw ConfigError(flag, "cannot drop the cut last line of '" + *path + "' for " + flag +
                                      ": " + ec.message());
        note(flag + " " + *path + ": dropped a last line a killed run left cut short");
      }
    }
    file_ = std::fopen(path->c_str(), "a");
    if (file_ == nullptr)
      throw ConfigError(flag,
                        "cannot open '" + *path + "' for " + flag + ": " + std::strerror(errno));
    owned_ = true;
  }
  ~LineOutput() {
    if (owned_) std::fclose(file_);
  }
  LineOutput(const LineOutput&) = delete;
  LineOutput& operator=(const LineOutput&) = delete;

  explicit operator bool() const { return file_ != nullptr; }
  void write(const std::string& line) {
    if (std::fputs(line.c_str(), file_) < 0 || std::fputc('\n', file_) == EOF ||
        std::fflush(file_) != 0)
      throw Error("cannot write " + flag_ + " file '" + path_ + "': " + std::strerror(errno));
  }

 private:
  std::string flag_;
  std::string path_;
  std::FILE* file_ = nullptr;
  bool owned_ = false;
};

using Clock = std::chrono::steady_clock;

/// A positive number of seconds ("0.5"), or also 0 with `allow_zero`; UsageError naming `flag`
/// otherwise.
inline double parse_seconds(const std::string& text, const std::string& flag,
                            bool allow_zero = false) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !(allow_zero ? v >= 0 : v > 0) || v > 1e6)
    throw UsageError(flag + " expects a " + (allow_zero ? "non-negative" : "positive") +
                     " number of seconds, got '" + text + "'");
  return v;
}

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

/// Progress: a live line on a terminal, periodic plain lines otherwise.
class Progress {
 public:
  explicit Progress(double interval) : tty_(::isatty(STDERR_FILENO) == 1), interval_(interval) {
    if (tty_) interval_ = 0.25;
  }

  /// `total`: the steps the run will have scheduled when it ends, when known.
  void batch(const Batch& b, std::uint64_t bytes, std::optional<std::uint64_t> total) {
    samples_ += b.info.num_samples;
    bytes_ += bytes;
    ++batches_;
    const double dt = seconds_since(since_);
    if (dt < interval_) return;
    char line[320];
    int n = std::snprintf(line, sizeof(line), "step %llu  epoch %llu  %ssamples/s  %s/s",
                          static_cast<unsigned long long>(b.info.step),
                          static_cast<unsigned long long>(b.info.epoch),
                          format_count(static_cast<double>(samples_) / dt).c_str(),
                          format_bytes(static_cast<double>(bytes_) / dt).c_str());
    if (total && *total > b.info.step) {
      // The ETA assumes the rest goes at this run's average rate so far.
      const std::uint64_t done = b.info.step + 1, left = *total - done;
      const double rate = static_cast<double>(batches_) / std::max(seconds_since(start_), 1e-9);
      std::snprintf(line + n, sizeof(line) - static_cast<std::size_t>(n), "  %.1f%%  ETA %s",
                    100.0 * static_cast<double>(done) / static_cast<double>(*total),
                    format_duration(static_cast<double>(left) / rate).c_str());
    }
    if (tty_) {
      std::fprintf(stderr, "\r\033[K%s", line);
      std::fflush(stderr);
      live_ = true;
    } else {
      note(line);
    }
    samples_ = 0;
    bytes_ = 0;
    since_ = Clock::now();
  }
  /// Ends the live line before other output.
  void clear() {
    if (live_) std::fprintf(stderr, "\r\033[K");
    live_ = false;
  }

 private:
  /// "42s", "3m05s", "2h07m".
  static std::string format_duration(double s) {
    const auto t = static_cast<unsigned long long>(std::min(s, 1e9) + 0.5);
    char buf[48];
    if (t >= 3600)
      std::snprintf(buf, sizeof(buf), "%lluh%02llum", t / 3600, t % 3600 / 60);
    else if (t >= 60)
      std::snprintf(buf, sizeof(buf), "%llum%02llus", t / 60, t % 60);
    else
      std::snprintf(buf, sizeof(buf), "%llus", t);
    return buf;
  }

  bool tty_;
  double interval_;
  bool live_ = false;
  Clock::time_point start_ = Clock::now();
  Clock::time_point since_ = start_;
  std::uint64_t samples_ = 0, bytes_ = 0, batches_ = 0;
};

}  // namespace flowstate::cli
