#include "flowstate/nodes/sources/remote_window.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <set>

#include "flowstate/core/error.h"
#include "flowstate/nodes/sources/cache_reservations.h"
#include "flowstate/nodes/sources/file_source.h"
#include "flowstate/nodes/sources/remote_listing.h"
#include "flowstate/nodes/sources/remote_options.h"

namespace flowstate {

namespace {

std::atomic<std::uint64_t> g_window_ids{1};

/// The mapping a thread read last, and whose: it lives until the thread's next data() call,
/// so a pointer data() returned stays valid however the window moves meanwhile.
struct HeldMapping {
  std::uint64_t window = 0;
  std::size_t k = 0;
  std::shared_ptr<const MappedFile> map;
  std::shared_ptr<const void> prepared;
};
thread_local HeldMapping t_held;

}  // namespace

std::vector<SourceFile> list_source_files(const std::vector<std::string>& patterns,
                                          const std::filesystem::path& base_dir,
                                          const SourceRemote* source) {
  std::vector<SourceFile> out;
  std::set<std::string> seen;
  std::optional<RemoteSettings> remote;
  for (const auto& pattern : patterns) {
    if (is_remote_url(pattern)) {
      if (!remote) remote = resolve_remote_settings(source);
      for (auto& o : job_listing(pattern, *remote))  // once per job (remote_listing.h)
        if (seen.insert(o.url).second) out.push_back({.local = {}, .remote = std::move(o)});
      continue;
    }
    for (auto& f : expand_named_paths({pattern}, base_dir))
      if (seen.insert(f.path).second) out.push_back({.local = std::move(f), .remote = {}});
  }
  return out;
}

/// The budget of the look-ahead windows of this process that read one cache directory (see
/// the file comment of remote_window.h). Lock order: a window's mu_, then this mu; reclaim()
/// holds this mu and only tries windows' locks.
struct WindowBudget {
  struct Member {
    RemoteWindow* window = nullptr;
    std::uint64_t reserve = 0;  ///< the window's look-ahead and one copy more
    std::uint64_t held = 0;     ///< bytes of its copies pinned or downloading
    BuildTag tag;
  };
  std::mutex mu;
  std::map<std::uint64_t, Member> members;  ///< by window id

  /// Counts `bytes` more as held by window `id` when every window's reservation still fits
  /// `limit` (a window's share is the larger of what it holds and what it reserved).
  bool admit(std::uint64_t id, std::uint64_t bytes, std::uint64_t limit) {
    std::lock_guard lock(mu);
    std::uint64_t committed = 0;
    for (const auto& [other, m] : members)
      committed += other == id ? std::max(m.held + bytes, m.reserve) : std::max(m.held, m.reserve);
    if (committed > limit) return false;
    members.at(id).held += bytes;
    return true;
  }
  void release(std::uint64_t id, std::uint64_t bytes) {
    std::lock_guard lock(mu);
    Member& m = members.at(id);
    m.held -= std::min(m.held, bytes);
  }
  /// Asks the windows other than `id` that hold more than their reservation to unpin what
  /// they can of it (those whose lock is free now; the caller tries again later).
  void reclaim(std::uint64_t id) {
    std::lock_guard lock(mu);
    for (auto& [other, m] : members) {
      if (other == id || m.held <= m.reserve) continue;
      if (!m.window->mu_.try_lock()) continue;
      m.window->shed_locked();
      m.window->mu_.unlock();
    }
  }
};

namespace {

std::mutex g_budgets_mu;
std::map<std::string, std::weak_ptr<WindowBudget>> g_budgets;

/// The budget of the cache directory `dir`, made when no window holds it.
std::shared_ptr<WindowBudget> budget_of(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::path key = std::filesystem::absolute(dir, ec);
  if (ec) key = dir;
  std::lock_guard lock(g_budgets_mu);
  auto& weak = g_budgets[key.lexically_normal().string()];
  auto budget = weak.lock();
  if (!budget) weak = budget = std::make_shared<WindowBudget>();
  return budget;
}

}  // namespace

RemoteWindow::RemoteWindow(std::vector<RemoteObject> objects, std::size_t lookahead,
                           Prepare prepare)
    : RemoteWindow(std::move(objects), lookahead, CacheSettings::from_environment(),
                   RemoteSettings::from_environment(), std::move(prepare)) {}

RemoteWindow::RemoteWindow(std::vector<RemoteObject> objects, std::size_t lookahead,
                           CacheSettings cache, RemoteSettings remote, Prepare prepare)
    : objects_(std::move(objects)),
      lookahead_(std::max<std::size_t>(1, lookahead)),
      remote_(std::move(remote)),
      cache_(std::move(cache)),
      prepare_(std::move(prepare)),
      id_(g_window_ids.fetch_add(1)),
      slots_(objects_.size()) {
  // The look-ahead and one copy more must fit: the largest such set of objects.
  std::vector<std::uint64_t> sizes;
  for (const auto& o : objects_) sizes.push_back(o.size);
  std::sort(sizes.begin(), sizes.end(), std::greater<>());
  const std::size_t held = std::min(sizes.size(), lookahead_ + 1);
  std::uint64_t need = 0;
  for (std::size_t i = 0; i < held; ++i) need += sizes[i];
  const std::uint64_t limit = cache_.settings().limit;
  if (need > limit)
    throw ConfigError(cache_.settings().limit_key,
                      "the cache limit " + bytes_text(limit) + " is smaller than the " +
                          bytes_text(need) + " of the " + std::to_string(held) +
                          " largest remote objects the look-ahead holds together (lookahead: " +
                          std::to_string(lookahead_) + " files ahead of the one read, of " +
                          std::to_string(objects_.size()) + "); raise " +
                          cache_.settings().limit_key + " or lower the source's lookahead");
  reservation_ = need;
  // The other windows of this process over the same cache reserve their share of the limit
  // too — but not those of a runtime this build replaces (same Loader, another build).
  // So do the other processes of this machine that share the directory (cache_reservations.h).
  budget_ = budget_of(cache_.settings().dir);
  {
    std::lock_guard lock(budget_->mu);
    const BuildTag tag = current_build();
    std::uint64_t others = 0;
    std::size_t count = 0;
    for (const auto& [other, m] : budget_->members) {
      if (m.tag.loader != nullptr && m.tag.loader == tag.loader && m.tag.build != tag.build)
        continue;
      others += m.reserve;
      ++count;
    }
    const auto check = [&](const std::vector<ProcessReservation>& processes) {
      const std::uint64_t elsewhere = reserved_bytes(processes);
      if (others + need + elsewhere <= limit) return std::vector<CacheClaim>{{.bytes = need}};
      const std::string key = cache_.settings().limit_key;
      throw ConfigError(
          key,
          "the cache limit " + bytes_text(limit) + " of '" + cache_.settings().dir.string() +
              "' is smaller than the " + bytes_text(others + need + elsewhere) +
              " the look-ahead windows of " + std::to_string(count + 1) +
              " remote sources of this process reserve together (" + bytes_text(need) +
              " for this one's lookahead of " + std::to_string(lookahead_) +
              " files and one more, " + bytes_text(others) + " for " + std::to_string(count) +
              " other" + (count == 1 ? "" : "s") + ")" +
              (processes.empty() ? "; raise " + key + " or lower the sources' lookahead"
                                 : " with " + reserved_by_others(processes) + "; raise " + key +
                                       ", lower the sources' lookahead or " + kOwnCacheDirectory));
    };
    shared_ = std::make_unique<CacheReservation>(cache_.settings(), check);
    budget_->members[id_] = {.window = this, .reserve = need, .held = 0, .tag = tag};
  }
  const std::size_t downloaders =
      std::min<std::size_t>(lookahead_, static_cast<std::size_t>(std::max(1, remote_.connections)));
  for (std::size_t i = 0; i < downloaders; ++i)
    downloaders_.emplace_back([this] { download_ahead(); });
}

RemoteWindow::~RemoteWindow() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  work_.notify_all();
  for (auto& t : downloaders_) t.join();
  std::lock_guard lock(budget_->mu);  // no reclaim() reaches this window after this
  budget_->members.erase(id_);
}

void RemoteWindow::new_pass() {
  std::lock_guard lock(mu_);
  new_pass_ = true;
}

void RemoteWindow::rewind() {
  std::lock_guard lock(mu_);
  front_ = 0;
  new_pass_ = false;
  started_ = false;  // the look-ahead downloads again from the next read on
}

std::uint64_t RemoteWindow::fetches() const {
  std::lock_guard lock(mu_);
  return fetches_;
}

RemoteWindow::Held RemoteWindow::read(std::size_t k) {
  if (t_held.window == id_ && t_held.k == k) [[likely]]
    return {t_held.map->data(), t_held.prepared.get()};
  // Hold nothing while this read waits: the copy the thread read last is not kept for it.
  t_held = {};
  Copy copy = open(k);
  const Held held{copy.map->data(), copy.prepared.get()};
  t_held = {
      .window = id_, .k = k, .map = std::move(copy.map), .prepared = std::move(copy.prepared)};
  return held;
}

RemoteWindow::Copy RemoteWindow::open(std::size_t k) {
  std::unique_lock lock(mu_);
  if (k >= front_ || (new_pass_ && !slots_[k].map && !slots_[k].fetching)) {
    if (k < front_) new_pass_ = false;
    if (k != front_ || !started_) {
      front_ = k;  // reading moved on, or the next epoch started over
      started_ = true;
      work_.notify_all();  // only when the look-ahead moved: a read per record must not wake
    }
  }
  for (;;) {
    Slot& s = slots_[k];
    s.last_read = ++clock_;
    if (s.map) return {s.map, s.prepared};
    if (s.error) std::rethrow_exception(s.error);
    if (s.fetching) {
      changed_.wait(lock);
      continue;
    }
    // Not held and no one downloads it: this read fetches it, once there is room.
    if (!claim_waiting(k, lock)) continue;  // another thread took it meanwhile
    if (s.map || s.fetching || s.error) {   // (claim_waiting's last check saw it not taken)
      budget_->release(id_, objects_[k].size);
      continue;
    }
    s.fetching = true;
    fetch(k, lock);
  }
}

void RemoteWindow::unpin(std::size_t j) {
  // Unpinned: the cache may evict it. A thread still reading it holds the mapping.
  slots_[j].pin.reset();
  slots_[j].map.reset();
  slots_[j].prepared.reset();
}

bool RemoteWindow::claim(std::uint64_t bytes) {
  // The limit less what other processes reserve of the directory now: room borrowed while
  // they were not there is given back here.
  const std::uint64_t limit = cache_.settings().limit;
  const std::uint64_t elsewhere = reserved_bytes(other_reservations(cache_.settings().dir));
  const std::uint64_t room = limit - std::min(limit, elsewhere);
  for (;;) {
    if (budget_->admit(id_, bytes, room)) return true;
    std::size_t victim = slots_.size();
    for (std::size_t j = 0; j < slots_.size(); ++j) {
      const Slot& s = slots_[j];
      if (!s.pin || needed(j)) continue;
      if (victim == slots_.size() || s.last_read < slots_[victim].last_read) victim = j;
    }
    // Only the look-ahead and downloads in flight are held: the caller waits.
    if (victim == slots_.size()) return false;
    unpin(victim);
    budget_->release(id_, objects_[victim].size);
  }
}

void RemoteWindow::shed_locked() {
  WindowBudget::Member& me = budget_->members.at(id_);
  while (me.held > me.reserve) {
    std::size_t victim = slots_.size();
    for (std::size_t j = 0; j < slots_.size(); ++j) {
      const Slot& s = slots_[j];
      if (!s.pin || needed(j)) continue;
      if (victim == slots_.size() || s.last_read < slots_[victim].last_read) victim = j;
    }
    if (victim == slots_.size()) return;
    unpin(victim);
    me.held -= std::min(me.held, objects_[victim].size);
  }
}

bool RemoteWindow::claim_waiting(std::size_t k, std::unique_lock<std::mutex>& lock) {
  std::optional<std::chrono::steady_clock::time_point> deadline;
  while (!claim(objects_[k].size)) {
    // A background download took the file meanwhile (or finished it): nothing to claim.
    if (slots_[k].map || slots_[k].fetching || slots_[k].error) return false;
    const bool own =
        std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.fetching; });
    if (!own) {
      // Not this window's downloads: other windows hold the room beyond their reservations
      // (they give it back), or a runtime being replaced still holds its reservation.
      lock.unlock();
      budget_->reclaim(id_);
      lock.lock();
      if (slots_[k].map || slots_[k].fetching || slots_[k].error) return false;
      if (claim(objects_[k].size)) return true;
      const auto now = std::chrono::steady_clock::now();
      if (!deadline) {
        deadline = now + remote_.timeout;
      } else if (now > *deadline) {
        throw DataError(objects_[k].url, DataError::kNoOffset,
                        "cannot hold '" + objects_[k].url + "' (" + bytes_text(objects_[k].size) +
                            "): the cache limit " + bytes_text(cache_.settings().limit) + " of '" +
                            cache_.settings().dir.string() +
                            "' is held by the look-ahead of other sources of this process, or "
                            "by other processes that share the directory");
      }
    }
    changed_.wait_for(lock, std::chrono::milliseconds(20));
  }
  return true;
}

void RemoteWindow::fetch(std::size_t k, std::unique_lock<std::mutex>& lock) {
  ++fetches_;
  lock.unlock();
  std::shared_ptr<const CachePin> pin;
  std::shared_ptr<const MappedFile> map;
  std::shared_ptr<const void> prepared;
  std::exception_ptr error;
  try {
    pin = cache_.fetch({objects_[k]}, remote_).front();
    map = std::make_shared<const MappedFile>(pin->path());
    if (map->size() != objects_[k].size)
      throw DataError(
          objects_[k].url, DataError::kNoOffset,
          "the cached copy of '" + objects_[k].url + "' is not " + bytes_text(objects_[k].size));
    if (prepare_) prepared = prepare_(k, *map);
  } catch (...) {
    error = std::current_exception();
  }
  lock.lock();
  Slot& s = slots_[k];
  s.fetching = false;
  if (error) {
    budget_->release(id_, objects_[k].size);
    s.error = error;
  } else {
    s.pin = std::move(pin);
    s.map = std::move(map);
    s.prepared = std::move(prepared);
  }
  changed_.notify_all();
  work_.notify_all();
  if (error) std::rethrow_exception(error);
}

void RemoteWindow::download_ahead() {
  // One of `connections` downloaders: each takes the look-ahead's first file not held (if it
  // fits), downloads it, and takes the next — so a file the front reaches starts as soon as a
  // connection is free, not when a round of downloads ends.
  std::unique_lock lock(mu_);
  for (;;) {
    if (stop_) return;
    std::size_t claimed = slots_.size();
    bool blocked = false;
    if (started_) {
      const std::size_t end = std::min(slots_.size(), front_ + lookahead_);
      for (std::size_t j = front_; j < end; ++j) {
        Slot& s = slots_[j];
        if (s.map || s.fetching || s.error) continue;
        if (claim(objects_[j].size)) {
          s.fetching = true;
          claimed = j;
        } else {
          blocked = true;
        }
        break;
      }
    }
    if (claimed == slots_.size()) {
      // Blocked by the budget: other windows may give room back without a notification here.
      if (blocked)
        work_.wait_for(lock, std::chrono::milliseconds(20));
      else
        work_.wait(lock);
      continue;
    }
    try {
      fetch(claimed, lock);
    } catch (...) {
      // Stored in the slot: the read that needs the file raises it.
    }
  }
}

std::vector<ObjectFacts> window_object_facts(
    const std::string& kind, const std::vector<RemoteObject>& remote, RemoteWindow& window,
    const std::function<std::uint64_t(const void*)>& items) {
  return job_object_facts(kind, remote, [&](const std::vector<std::size_t>& missing) {
    std::vector<ObjectFacts> out;
    for (const std::size_t k : missing) {
      const RemoteWindow::Copy copy = window.open(k);
      const FileIdentity id =
          file_identity(remote[k].url, *copy.map, items(copy.prepared.get()), true);
      out.push_back({.items = id.items, .blocks = id.blocks, .full = *id.full});
    }
    window.rewind();
    return out;
  });
}

std::vector<ObjectFacts> open_remote_files(const std::vector<SourceFile>& files,
                                           const SourceRemote& settings, std::size_t lookahead,
                                           RemoteWindow::Prepare prepare, const std::string& kind,
                                           const std::function<std::uint64_t(const void*)>& items,
                                           std::unique_ptr<RemoteWindow>& window,
                                           std::vector<std::atomic<std::uint64_t>>& expected) {
  std::vector<RemoteObject> remote;
  for (const auto& file : files)
    if (file.remote) remote.push_back(*file.remote);
  if (remote.empty()) return {};
  expected = std::vector<std::atomic<std::uint64_t>>(remote.size());
  for (auto& e : expected) e.store(kItemsUnknown);
  window = std::make_unique<RemoteWindow>(remote, lookahead, resolve_cache_settings(&settings),
                                          resolve_remote_settings(&settings), std::move(prepare));
  std::vector<ObjectFacts> facts = window_object_facts(kind, remote, *window, items);
  for (std::size_t k = 0; k < facts.size(); ++k) expected[k].store(facts[k].items);
  return facts;
}

}  // namespace flowstate
