// One listing per job: the objects a remote pattern names are listed once for the whole job —
// by rank 0, handed to the other ranks through the Coordinator — and saved beside the job's
// checkpoints (`<checkpoint dir>/listings/<16 hex>.json`, named by the pattern), where a
// resume reads them instead of listing again. A Loader sets the context (a ListingScope) for
// the thread that opens its sources; expand_remote_paths asks job_listing() for each pattern.
// Outside any scope (a lone Pipeline build, `flowstate inspect`), job_listing lists.
//
//   ListingScope scope({.dir = "ck", .coordinator = coord.get(), .memo = memo});
//   auto objects = job_listing("s3://bucket/train-*.tar", RemoteSettings::from_environment());
//
// A saved listing holds per object its URL (redacted), size and ETag, never a fetch URL or
// anything else of the settings: a URL's user info or query (a presigned signature) stays out,
// and the GET URL is made again from the settings in force (another endpoint, a proxy).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "flowstate/core/coordinator.h"
#include "flowstate/nodes/sources/remote_store.h"

namespace flowstate {

/// The directory under a checkpoint directory that holds its saved listings.
inline constexpr const char* kListingsDir = "listings";

/// What reading a remote object whole once told a source that numbers its records from its
/// bytes (`tar`, `lines`): its record count as that source counts them, and the identity a
/// local file's bytes would give (nodes/sources/file_source.h's sampled blocks under the URL,
/// and the whole-content hash). With them, a build needs no byte of the object.
struct ObjectFacts {
  std::uint64_t items = 0;                ///< records, as `kind` counts them
  std::array<std::uint64_t, 4> blocks{};  ///< XXH3-64 of the identity's sampled blocks
  std::uint64_t full = 0;                 ///< XXH3-64 of the whole object
  bool operator==(const ObjectFacts&) const = default;
};

/// The listings one Loader made, by pattern: a rebuild of its sources (a restore into a
/// running loader) does not list again. Thread-safe.
struct ListingMemo {
  std::mutex mu;
  std::map<std::string, std::vector<RemoteObject>> listings;  ///< by redacted pattern
  /// Listings made afresh (ListingContext::reuse false) and not saved yet: (file, text).
  std::vector<std::pair<std::filesystem::path, std::string>> pending;
  /// Object facts made or read (job_object_facts), by kind, URL, ETag and size.
  std::map<std::string, ObjectFacts> facts;
};

/// Saves the memo's pending listings (durably, each replacing the one saved before) and
/// forgets them. A Loader calls it once a restore succeeded: a restore that continues over a
/// changed bucket and is refused leaves the job's saved listing as it was. Throws
/// CheckpointError naming a file it cannot write.
void save_pending_listings(ListingMemo& memo);

/// Where and how a job's listings are made, for the sources a Loader opens.
struct ListingContext {
  /// The job's checkpoint directory: listings are saved in (and, with `reuse`, read from) its
  /// `listings/`. Empty: nothing is saved or read.
  std::filesystem::path dir;
  /// Read a saved listing, when there is one, instead of listing. False: list afresh, as a
  /// resume that continues over a changed bucket must, and keep the listing in the memo's
  /// `pending` until save_pending_listings (saved at once when there is no memo).
  bool reuse = true;
  /// The job's ranks: rank 0 lists (or reads the saved listing) and the others receive it
  /// through all_gather — a collective call per remote pattern, made by every rank as it
  /// opens the same pipeline. Null: this process lists.
  Coordinator* coordinator = nullptr;
  /// Listings already made by this Loader (looked up first); null: none kept.
  std::shared_ptr<ListingMemo> memo;
  /// The job's default cache directory (LoaderOptions::cache_dir, `--cache-dir`): the sources
  /// opened under this context that set no `cache.dir` use it. Empty: the environment's.
  std::filesystem::path cache_dir;
  /// The job's default cache limit in bytes (LoaderOptions::cache_limit, `--cache-limit`);
  /// 0: the environment's. See resolve_cache_settings (nodes/sources/remote_options.h).
  std::uint64_t cache_limit = 0;
};

/// The calling thread's ListingContext (the innermost ListingScope), or null outside any.
const ListingContext* current_listing_context();

/// Sets the ListingContext of the calling thread while it lives (scopes nest; the previous
/// context comes back).
class ListingScope {
 public:
  explicit ListingScope(ListingContext context);
  ~ListingScope();
  ListingScope(const ListingScope&) = delete;
  ListingScope& operator=(const ListingScope&) = delete;

 private:
  ListingContext context_;
  const ListingContext* previous_;
  std::uint64_t previous_build_;
};

/// Which build the calling thread opens sources for: the Loader (its memo; null outside a
/// Loader's ListingScope) and a number unique to the innermost ListingScope (0 outside any).
/// A Loader opens each runtime under a scope of its own, so the look-ahead windows of a runtime
/// that a rebuild replaces tell themselves from the new runtime's (remote_window.h).
struct BuildTag {
  const void* loader = nullptr;
  std::uint64_t build = 0;
};
/// The calling thread's BuildTag.
BuildTag current_build();

/// The facts of each of `objects` under `kind` (what the count depends on, e.g. "tar/1
/// fields=jpg,cls on_missing=error"), made once per job under the calling thread's
/// ListingContext, as job_listing makes listings: from the memo; else on rank 0 (or a process
/// on its own) from the saved `listings/facts-<16 hex of kind>.json` for the objects it holds
/// (an entry counts only for the same URL, size and ETag) and `compute` for the others — the
/// indices into `objects` it must read, answered in that order — saving them there; on the
/// other ranks from rank 0's answer (an error rank 0 met is thrown on every rank). Throws
/// what `compute` throws; CheckpointError naming a saved file that is not one.
std::vector<ObjectFacts> job_object_facts(
    const std::string& kind, const std::vector<RemoteObject>& objects,
    const std::function<std::vector<ObjectFacts>(const std::vector<std::size_t>&)>& compute);

/// The file under `dir` that holds the saved facts of `kind`:
/// `dir/listings/facts-<XXH3-64 of kind, 16 hex>.json`.
std::filesystem::path facts_file(const std::filesystem::path& dir, const std::string& kind);

/// The objects `pattern` names, made once per job under the calling thread's ListingContext:
/// from the memo; else on rank 0 (or a process on its own) from the saved listing (with
/// `reuse`), else — when `settings.listing_max_age` is above 0 — from the listing the cache
/// directory (`settings.listing_dir`) saved no longer ago than that, else list_remote — saving
/// what it listed beside the checkpoints, and in the cache directory when listings may be
/// reused — and on the other ranks from rank 0's answer. An error rank 0 met (a DataError
/// naming the URL, a ConfigError) is thrown on every rank. A saved listing beside the
/// checkpoints that cannot be read is a CheckpointError naming its file; one in the cache
/// that cannot be read is listed again.
///
/// A listing reused from the cache is a snapshot up to `listing_max_age` old: objects added
/// or removed since are not seen until it expires. It never lets another version through:
/// every object keeps the size and ETag listed, cached copies are keyed by them, and a copy
/// not cached is downloaded with If-Match on the listed ETag — an object changed since is a
/// DataError naming it when read, as when it changes during a run.
std::vector<RemoteObject> job_listing(const std::string& pattern, const RemoteSettings& settings);

/// The file under the cache directory `cache_dir` that holds the listing jobs may reuse
/// (RemoteSettings::listing_max_age) of `pattern` as `settings` reach it:
/// `cache_dir/listings/<XXH3-64 of the redacted pattern, endpoint, region and key id, 16
/// hex>.json`, in encode_listing's format. The cache's eviction never touches it.
std::filesystem::path reusable_listing_file(const std::filesystem::path& cache_dir,
                                            const std::string& pattern,
                                            const RemoteSettings& settings);

/// The file under `dir` that holds the saved listing of `pattern`:
/// `dir/listings/<XXH3-64 of the redacted pattern, 16 hex>.json`.
std::filesystem::path listing_file(const std::filesystem::path& dir, const std::string& pattern);

/// A listing as saved (JSON: format, pattern, objects with url, size, etag).
std::string encode_listing(const std::string& pattern, const std::vector<RemoteObject>& objects);
/// A listing saved by encode_listing for `pattern`, its fetch URLs made for `settings`.
/// Throws CheckpointError naming `file` when the text is not one, or is another pattern's.
std::vector<RemoteObject> decode_listing(const std::string& text, const std::string& pattern,
                                         const RemoteSettings& settings, const std::string& file);

}  // namespace flowstate
