// What the processes of one machine reserve of a cache directory's limit (issue 23: the cache
// is shared by the processes of one machine, and "a limit smaller than what the look-ahead
// needs is a clear configuration error at build time, not a deadlock").
//
// Each process that reads remote files through a cache directory holds an exclusive flock on
// DIR/reservations/PID while it lives, and names each claim of its sources there by an empty
// file, DIR/reservations/PID_ID_K_BYTES_SHARE (no bytes: the directory's stay the copies').
// The kernel releases the lock when the process dies, however it dies (a SIGKILL included), so
// claims whose lock another process can take are a dead one's: the next process that reserves
// removes them, under the cache's lock. A forked child that reserves has files of its own.
//
// A claim is private (a look-ahead's copies: the blocks or files this process reads next) or
// shared: the copies of one set of objects that every process reading them holds — a range
// reader that holds all its blocks, the index files of an `indexed` source. Ranks of one job
// reading one data set share those copies (the same cache keys), so a share counts once,
// whatever the number of processes claiming it.
//
// A source's build checks that its claims, with what the other processes reserve, fit the
// limit — else a ConfigError naming each other process and its bytes — and its downloads
// leave the other processes' reservations free (they count the limit less those as their
// room, read again at each download): a process that borrowed room beyond its reservation
// while alone gives it back at its next download once another process reserves.
//
//   CacheReservation r(cache, [&](const std::vector<ProcessReservation>& others) {
//     if (need + reserved_bytes(others) > cache.limit) throw ConfigError(...);
//     return std::vector<CacheClaim>{{.bytes = need}};
//   });
//   std::uint64_t room = cache.limit - reserved_bytes(other_reservations(cache.dir));
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "flowstate/nodes/sources/object_cache.h"

namespace flowstate {

/// Bytes one reservation holds of a cache directory: private to its process, or — `share`
/// not empty — the copies every claim of that share holds, counted once.
struct CacheClaim {
  std::uint64_t bytes = 0;
  std::string share;  ///< letters and digits (objects_share); empty: private
};

/// Another live process's claims on a cache directory.
struct ProcessReservation {
  pid_t pid = 0;
  std::vector<CacheClaim> claims;
};

/// The reservations of the live processes other than this one over the cache directory `dir`
/// (read without the cache's lock: a file being rewritten reads as its old or its new claims).
/// Dead processes' files are skipped.
std::vector<ProcessReservation> other_reservations(const std::filesystem::path& dir);

/// The bytes `others` reserve together, each share once (its largest claim), leaving out the
/// share `mine` (the caller's own claim of it counts those bytes).
std::uint64_t reserved_bytes(const std::vector<ProcessReservation>& others,
                             const std::string& mine = {});

/// "2 other processes on this machine (pid 41: 300 bytes, pid 57: 1.00 MB)": at most 8 named,
/// each with the bytes of its claims.
std::string describe_other_processes(const std::vector<ProcessReservation>& others);

/// "the 300 bytes that 1 other process on this machine (pid 41: 300 bytes) reserve of it":
/// what a "limit too small" ConfigError says of `others` (their reserved_bytes, leaving out
/// `mine`).
std::string reserved_by_others(const std::vector<ProcessReservation>& others,
                               const std::string& mine = {});

/// The advice a "limit too small" ConfigError ends with when other processes share the
/// directory.
inline constexpr const char* kOwnCacheDirectory = "give each process a cache directory of its own";

/// The share of the copies of `objects` (their cache keys, and `block` for a range reader's
/// blocks; 0 for whole copies): the same for every process that reads the same objects.
std::string objects_share(const std::vector<RemoteObject>& objects, std::uint64_t block);

/// Adds claims to this process's reservation of a cache directory while it lives.
class CacheReservation {
 public:
  /// Called under the cache's lock with the other live processes' reservations (dead ones'
  /// files removed): returns the claims to add, or throws to refuse (nothing is reserved).
  using Check =
      std::function<std::vector<CacheClaim>(const std::vector<ProcessReservation>& others)>;

  /// Reserves for this process what `check` returns of `cache.dir`. Throws what `check`
  /// throws, or DataError naming a file of the directory it cannot write.
  CacheReservation(const CacheSettings& cache, const Check& check);
  /// Gives the claims back (the process's file is removed with its last reservation).
  ~CacheReservation();
  CacheReservation(const CacheReservation&) = delete;
  CacheReservation& operator=(const CacheReservation&) = delete;

 private:
  std::shared_ptr<struct ReservationFile> file_;
  std::uint64_t id_ = 0;  ///< this reservation among the process's
  std::vector<CacheClaim> claims_;
};

}  // namespace flowstate
