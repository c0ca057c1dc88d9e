#include "flowstate/nodes/sources/remote_window.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <set>

#include "flowstate/core/error.h"
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

RemoteWindow::RemoteWindow(std::vector<RemoteObject> objects, std::size_t lookahead)
    : RemoteWindow(std::move(objects), lookahead, CacheSettings::from_environment(),
                   RemoteSettings::from_environment()) {}

RemoteWindow::RemoteWindow(std::vector<RemoteObject> objects, std::size_t lookahead,
                           CacheSettings cache, RemoteSettings remote)
    : objects_(std::move(objects)),
      lookahead_(std::max<std::size_t>(1, lookahead)),
      remote_(std::move(remote)),
      cache_(std::move(cache)),
      id_(g_window_ids.fetch_add(1)),
      slots_(objects_.size()),
      ready_(objects_.size()) {
  // The look-ahead and one copy more must fit: the largest such set of objects.
  std::vector<std::uint64_t> sizes;
  for (const auto& o : objects_) sizes.push_back(o.size);
  std::sort(sizes.begin(), sizes.end(), std::greater<>());
  const std::size_t held = std::min(sizes.size(), lookahead_ + 1);
  std::uint64_t need = 0;
  for (std::size_t i = 0; i < held; ++i) need += sizes[i];
  const std::uint64_t limit = cache_.settings().limit;
  std::uint64_t total = 0;
  for (const auto size : sizes) total += size;
  all_fit_ = total <= limit;
  if (need > limit)
    throw ConfigError(cache_.settings().limit_key,
                      "the cache limit " + bytes_text(limit) + " is smaller than the " +
                          bytes_text(need) + " of the " + std::to_string(held) +
                          " largest remote objects the look-ahead holds together (lookahead: " +
                          std::to_string(lookahead_) + " files ahead of the one read, of " +
                          std::to_string(objects_.size()) + "); raise " +
                          cache_.settings().limit_key + " or lower the source's lookahead");
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
}

void RemoteWindow::new_pass() {
  std::lock_guard lock(mu_);
  new_pass_ = true;
}

std::uint64_t RemoteWindow::fetches() const {
  std::lock_guard lock(mu_);
  return fetches_;
}

const std::byte* RemoteWindow::data(std::size_t k) {
  if (t_held.window == id_ && t_held.k == k) [[likely]]
    return t_held.map->data();
  if (all_fit_) {
    // Never unpinned: the mapping lives as long as the window.
    if (const std::byte* bytes = ready_[k].load(std::memory_order_acquire)) [[likely]]
      return bytes;
  }
  // Hold nothing while this read waits: the copy the thread read last is not kept for it.
  t_held = {};
  auto map = open(k);
  const std::byte* bytes = map->data();
  t_held = {.window = id_, .k = k, .map = std::move(map)};
  return bytes;
}

std::shared_ptr<const MappedFile> RemoteWindow::open(std::size_t k) {
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
    if (s.map) return s.map;
    if (s.error) std::rethrow_exception(s.error);
    if (s.fetching) {
      changed_.wait(lock);
      continue;
    }
    // Not held and no one downloads it: this read fetches it, once there is room.
    while (!make_room(objects_[k].size)) changed_.wait(lock);
    if (s.map || s.fetching) continue;
    s.fetching = true;
    held_bytes_ += objects_[k].size;
    fetch(k, lock);
  }
}

bool RemoteWindow::make_room(std::size_t bytes) {
  const std::uint64_t limit = cache_.settings().limit;
  while (held_bytes_ + bytes > limit) {
    std::size_t victim = slots_.size();
    for (std::size_t j = 0; j < slots_.size(); ++j) {
      const Slot& s = slots_[j];
      if (!s.pin || needed(j)) continue;
      if (victim == slots_.size() || s.last_read < slots_[victim].last_read) victim = j;
    }
    if (victim == slots_.size()) {
      // Only the look-ahead and downloads in flight are held. When nothing is in flight the
      // build-time check says the bytes fit; the cache decides (other processes share it).
      return std::none_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.fetching; });
    }
    // Unpinned: the cache may evict it. A thread still reading it holds the mapping.
    slots_[victim].pin.reset();
    slots_[victim].map.reset();
    held_bytes_ -= objects_[victim].size;
  }
  return true;
}

void RemoteWindow::fetch(std::size_t k, std::unique_lock<std::mutex>& lock) {
  ++fetches_;
  lock.unlock();
  std::shared_ptr<const CachePin> pin;
  std::shared_ptr<const MappedFile> map;
  std::exception_ptr error;
  try {
    pin = cache_.fetch({objects_[k]}, remote_).front();
    map = std::make_shared<const MappedFile>(pin->path());
    if (map->size() != objects_[k].size)
      throw DataError(
          objects_[k].url, DataError::kNoOffset,
          "the cached copy of '" + objects_[k].url + "' is not " + bytes_text(objects_[k].size));
  } catch (...) {
    error = std::current_exception();
  }
  lock.lock();
  Slot& s = slots_[k];
  s.fetching = false;
  if (error) {
    held_bytes_ -= objects_[k].size;
    s.error = error;
  } else {
    s.pin = std::move(pin);
    s.map = std::move(map);
    if (all_fit_) ready_[k].store(s.map->data(), std::memory_order_release);
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
    if (started_) {
      // The look-ahead in file order from the front; every file, round from the front, when
      // the limit holds them all.
      const std::size_t n = slots_.size();
      const std::size_t count = all_fit_ ? n : std::min(n, front_ + lookahead_) - front_;
      for (std::size_t i = 0; i < count; ++i) {
        const std::size_t j = (front_ + i) % n;
        Slot& s = slots_[j];
        if (s.map || s.fetching || s.error) continue;
        if (make_room(objects_[j].size)) {
          s.fetching = true;
          held_bytes_ += objects_[j].size;
          claimed = j;
        }
        break;
      }
    }
    if (claimed == slots_.size()) {
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

}  // namespace flowstate
