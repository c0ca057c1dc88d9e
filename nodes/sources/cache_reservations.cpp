#include "flowstate/nodes/sources/cache_reservations.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>

#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"

namespace flowstate {

/// This process's lock file DIR/reservations/PID (empty, exclusively flock'ed while open) and
/// its claims, an empty file each: DIR/reservations/PID_ID_K_BYTES_SHARE (SHARE "-" when
/// private). Names, not contents, hold the claims, so the directory's bytes stay the copies'
/// (the limit counts them) and a claim appears or goes whole.
struct ReservationFile {
  std::filesystem::path dir;  ///< DIR/reservations
  std::filesystem::path lock_path;
  pid_t pid = 0;
  int fd = -1;
  std::uint64_t next_id = 0;

  ~ReservationFile() {
    if (fd < 0) return;
    if (pid == ::getpid()) {
      try {
        CacheLock lock(dir.parent_path() / "lock");
        ::unlink(lock_path.c_str());
      } catch (...) {  // (the file stays; unlocked once closed, the next reserver removes it)
      }
    }
    ::close(fd);  // releases the lock (a forked child's copy leaves the parent's lock held)
  }
};

namespace {

std::mutex g_mu;
std::map<std::string, std::weak_ptr<ReservationFile>> g_files;  ///< by cache directory

std::filesystem::path reservations_dir(const std::filesystem::path& dir) {
  return dir / "reservations";
}

std::string directory_key(const std::filesystem::path& dir) {
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(dir, ec);
  return (ec ? dir : absolute).lexically_normal().string();
}

std::string claim_name(pid_t pid, std::uint64_t id, std::size_t k, const CacheClaim& c) {
  return std::to_string(pid) + "_" + std::to_string(id) + "_" + std::to_string(k) + "_" +
         std::to_string(c.bytes) + "_" + (c.share.empty() ? "-" : c.share);
}

/// A name's pid, and its claim when it is a claim's (nullopt for a process's lock file).
struct Parsed {
  pid_t pid = 0;
  std::optional<CacheClaim> claim;
};
std::optional<Parsed> parse_name(const std::string& name) {
  std::vector<std::string> parts;
  for (std::size_t at = 0;;) {
    const std::size_t next = name.find('_', at);
    parts.push_back(name.substr(at, next - at));
    if (next == std::string::npos) break;
    at = next + 1;
  }
  auto number = [](const std::string& t) -> std::optional<std::uint64_t> {
    if (t.empty() || t.size() > 20 || t.find_first_not_of("0123456789") != std::string::npos)
      return std::nullopt;
    return std::stoull(t);
  };
  const auto pid = number(parts[0]);
  if (!pid || *pid == 0 || *pid > 0x7fffffff) return std::nullopt;
  Parsed out{.pid = static_cast<pid_t>(*pid)};
  if (parts.size() == 1) return out;
  const auto bytes = parts.size() == 5 ? number(parts[3]) : std::nullopt;
  if (!bytes || parts[4].empty()) return std::nullopt;
  out.claim = CacheClaim{.bytes = *bytes, .share = parts[4] == "-" ? std::string() : parts[4]};
  return out;
}

/// Whether process `pid`'s lock file in `where` is held (its process alive).
bool held(const std::filesystem::path& where, pid_t pid) {
  const int fd = ::open((where / std::to_string(pid)).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;  // a claim without its lock file: its process is gone
  const bool taken = ::flock(fd, LOCK_SH | LOCK_NB) != 0;
  ::close(fd);
  return taken;
}

/// The names in `where`, by pid. Skips what is not a reservation.
std::map<pid_t, std::vector<std::pair<std::string, std::optional<CacheClaim>>>> list_by_pid(
    const std::filesystem::path& where) {
  std::map<pid_t, std::vector<std::pair<std::string, std::optional<CacheClaim>>>> out;
  DIR* d = ::opendir(where.c_str());
  if (d == nullptr) return out;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (const auto parsed = parse_name(name)) out[parsed->pid].emplace_back(name, parsed->claim);
  }
  ::closedir(d);
  return out;
}

/// The live reservations over `dir` other than this process's; with `remove_dead` (under the
/// cache's lock) the files of dead processes are removed.
std::vector<ProcessReservation> scan(const std::filesystem::path& dir, bool remove_dead) {
  std::vector<ProcessReservation> out;
  const std::filesystem::path where = reservations_dir(dir);
  const pid_t self = ::getpid();
  for (const auto& [pid, names] : list_by_pid(where)) {
    if (pid == self) continue;
    if (!held(where, pid)) {
      if (remove_dead)
        for (const auto& [name, claim] : names) ::unlink((where / name).c_str());
      continue;
    }
    ProcessReservation r{.pid = pid, .claims = {}};
    for (const auto& [name, claim] : names)
      if (claim) r.claims.push_back(*claim);
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

std::vector<ProcessReservation> other_reservations(const std::filesystem::path& dir) {
  return scan(dir, /*remove_dead=*/false);
}

std::uint64_t reserved_bytes(const std::vector<ProcessReservation>& others,
                             const std::string& mine) {
  std::uint64_t total = 0;
  std::map<std::string, std::uint64_t> shares;
  for (const auto& p : others)
    for (const CacheClaim& c : p.claims) {
      if (c.share.empty()) {
        total += c.bytes;
      } else if (c.share != mine) {
        auto& most = shares[c.share];
        most = std::max(most, c.bytes);
      }
    }
  for (const auto& [share, bytes] : shares) total += bytes;
  return total;
}

std::string describe_other_processes(const std::vector<ProcessReservation>& others) {
  constexpr std::size_t kNamed = 8;
  const std::size_t n = others.size();
  std::string out =
      std::to_string(n) + " other process" + (n == 1 ? "" : "es") + " on this machine (";
  for (std::size_t i = 0; i < n && i < kNamed; ++i) {
    std::uint64_t bytes = 0;
    for (const CacheClaim& c : others[i].claims) bytes += c.bytes;
    out += (i > 0 ? ", pid " : "pid ") + std::to_string(others[i].pid) + ": " + bytes_text(bytes);
  }
  if (n > kNamed) out += ", and " + std::to_string(n - kNamed) + " more";
  return out + ")";
}

std::string reserved_by_others(const std::vector<ProcessReservation>& others,
                               const std::string& mine) {
  return "the " + bytes_text(reserved_bytes(others, mine)) + " that " +
         describe_other_processes(others) + " reserve of it";
}

std::string objects_share(const std::vector<RemoteObject>& objects, std::uint64_t block) {
  std::uint64_t h = hash64("flowstate cache share");
  h = hash_combine(h, block);
  for (const RemoteObject& o : objects) h = hash_combine(h, hash64(cache_key(o)));
  return hex64(h);
}

CacheReservation::CacheReservation(const CacheSettings& cache, const Check& check) {
  std::lock_guard guard(g_mu);
  const std::filesystem::path where = reservations_dir(cache.dir);
  std::error_code ec;
  std::filesystem::create_directories(where, ec);
  if (ec)
    throw DataError(where.string(), DataError::kNoOffset,
                    "cannot create '" + where.string() + "': " + ec.message());
  auto& weak = g_files[directory_key(cache.dir)];
  // Declared before the lock: a new file dropped by a throw below takes the lock in its
  // destructor, after this scope's lock is released.
  std::shared_ptr<ReservationFile> file = weak.lock();
  CacheLock lock(cache.dir / "lock");
  std::vector<CacheClaim> claims = check(scan(cache.dir, /*remove_dead=*/true));
  const pid_t self = ::getpid();
  auto fail = [&](const std::filesystem::path& path, int error) {
    return DataError(
        path.string(), DataError::kNoOffset,
        "cannot write the cache reservation '" + path.string() + "': " + std::strerror(error));
  };
  if (!file || file->pid != self) {  // none yet, or a forked parent's
    // A dead process's files under this pid (the pid reused) are not this process's claims.
    auto listed = list_by_pid(where);  // (a local: a range-for keeps no temporary map alive)
    for (const auto& [name, claim] : listed[self]) ::unlink((where / name).c_str());
    file = std::make_shared<ReservationFile>();
    file->dir = where;
    file->lock_path = where / std::to_string(self);
    file->pid = self;
    const int fd = ::open(file->lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 || ::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int error = errno;
      if (fd >= 0) ::close(fd);  // (file->fd stays -1: its destructor must not take the lock)
      throw fail(file->lock_path, error);
    }
    file->fd = fd;
    weak = file;
  }
  const std::uint64_t id = file->next_id++;
  for (std::size_t k = 0; k < claims.size(); ++k) {
    const std::filesystem::path path = where / claim_name(self, id, k, claims[k]);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      const int error = errno;
      for (std::size_t j = 0; j < k; ++j)
        ::unlink((where / claim_name(self, id, j, claims[j])).c_str());
      throw fail(path, error);
    }
    ::close(fd);
  }
  file_ = std::move(file);
  id_ = id;
  claims_ = std::move(claims);
}

CacheReservation::~CacheReservation() {
  std::lock_guard guard(g_mu);
  if (file_->pid == ::getpid()) {
    try {
      CacheLock lock(file_->dir.parent_path() / "lock");
      for (std::size_t k = 0; k < claims_.size(); ++k)
        ::unlink((file_->dir / claim_name(file_->pid, id_, k, claims_[k])).c_str());
    } catch (...) {  // the lock file is gone: the claims stay until this process ends
    }
  }
  file_.reset();  // the last one removes the lock file
}

}  // namespace flowstate
