#include "flowstate/nodes/sources/mapped_file_set.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <utility>

#include "flowstate/core/error.h"

namespace flowstate {

std::size_t mapped_files_limit() {
  if (const char* v = std::getenv("FLOWSTATE_MAPPED_FILES"); v != nullptr && *v != '\0') {
    std::size_t n = 0;
    const char* end = v + std::strlen(v);
    const auto [p, ec] = std::from_chars(v, end, n);
    if (ec != std::errc{} || p != end || n == 0)
      throw ConfigError("FLOWSTATE_MAPPED_FILES",
                        "'" + std::string(v) +
                            "' is not a positive integer (the most local files one source keeps "
                            "mapped at once)");
    return n;
  }
  static const std::size_t from_kernel = [] {
    std::ifstream in("/proc/sys/vm/max_map_count");
    std::size_t n = 0;
    if (!(in >> n) || n < 64) n = 65'530;
    return n / 4;
  }();
  return from_kernel;
}

namespace {

/// The mapping of this thread's last read through a MappedFileSet: its next read of the same
/// file takes no lock, and the bytes it returned stay valid until it reads another file.
struct HeldMapping {
  std::uint64_t set = 0;
  std::size_t k = 0;
  std::shared_ptr<const MappedFile> file;
};
thread_local HeldMapping t_held;

std::atomic<std::uint64_t> g_next_set_id{1};

bool faulted(const MappedFile& m) { return m.fault_offset() != MappedFile::kNoFault; }

std::string describe(std::size_t size, const FileStat& s) {
  return std::to_string(size) + " bytes, inode " + std::to_string(s.inode) + ", mtime " +
         std::to_string(s.mtime_ns) + " ns";
}

}  // namespace

MappedFileSet::MappedFileSet(std::vector<File> files, std::size_t limit)
    : files_(std::move(files)),
      limit_(std::max<std::size_t>(1, limit)),
      id_(g_next_set_id.fetch_add(1, std::memory_order_relaxed)),
      held_(files_.size()),
      used_(files_.size(), 0) {
  ring_.reserve(std::min(limit_, files_.size()));
}

MappedFileSet::~MappedFileSet() {
  // This thread's held mapping is dropped with the set; another thread's goes at its next read.
  if (t_held.set == id_) t_held = {};
}

std::shared_ptr<const MappedFile> MappedFileSet::open(std::size_t k) const {
  const File& f = files_[k];
  auto m = std::make_shared<const MappedFile>(f.path);
  if (m->size() != f.size || m->stat() != f.stat)
    throw DataError(f.path, DataError::kNoOffset,
                    "'" + f.path + "' changed while it was read: it had " +
                        describe(f.size, f.stat) + " when the run opened it and has " +
                        describe(m->size(), m->stat()) +
                        " now; a data file must not be replaced or changed while a run reads it");
  return m;
}

std::span<const std::byte> MappedFileSet::read(std::size_t k, std::size_t offset,
                                               std::size_t bytes) const {
  HeldMapping& h = t_held;
  if (h.set == id_ && h.k == k && h.file) [[likely]]
    return {h.file->data() + offset, bytes};
  std::shared_ptr<const MappedFile> file;
  // Mappings this read lets go of are closed after the lock is released.
  std::vector<std::shared_ptr<const MappedFile>> closed;
  {
    std::lock_guard lock(mu_);
    if (held_[k]) {
      file = held_[k];
      used_[k] = 1;
    }
  }
  if (!file) {
    std::shared_ptr<const MappedFile> opened = open(k);  // syscalls: outside the lock
    std::lock_guard lock(mu_);
    ++opens_;
    if (held_[k]) {  // another thread mapped it meanwhile
      file = held_[k];
      used_[k] = 1;
      closed.push_back(std::move(opened));
    } else {
      file = opened;
      held_[k] = std::move(opened);
      used_[k] = 1;
      // The clock: a file read since the hand last passed gets a second chance; a file cut
      // short under a read stays mapped, so that check_mappings() still names it.
      bool placed = ring_.size() < limit_;
      if (placed) ring_.push_back(static_cast<std::uint32_t>(k));
      for (std::size_t step = 0; !placed && step < 2 * ring_.size() + 1; ++step) {
        const std::uint32_t v = ring_[hand_];
        if (used_[v] != 0) {
          used_[v] = 0;
        } else if (!faulted(*held_[v])) {
          closed.push_back(std::move(held_[v]));
          ring_[hand_] = static_cast<std::uint32_t>(k);
          placed = true;
        }
        hand_ = (hand_ + 1) % ring_.size();
      }
      if (!placed) ring_.push_back(static_cast<std::uint32_t>(k));  // every one faulted
    }
  }
  const bool ours = h.set == id_;
  const std::size_t previous_k = h.k;
  std::shared_ptr<const MappedFile> previous = std::exchange(h.file, file);
  h.set = id_;
  h.k = k;
  if (previous && faulted(*previous)) {
    // A mapping that this thread's read found cut short, which its set may have closed
    // meanwhile: kept with this set (and so in the SIGBUS guard's registry) so that the
    // batch's check still names the file. Once: a set that still holds it keeps it anyway.
    std::lock_guard lock(mu_);
    if (!(ours && held_[previous_k] == previous) &&
        std::find(kept_faulted_.begin(), kept_faulted_.end(), previous) == kept_faulted_.end())
      kept_faulted_.push_back(std::move(previous));
  }
  return {file->data() + offset, bytes};
}

std::size_t MappedFileSet::mapped() const {
  std::lock_guard lock(mu_);
  return ring_.size();
}

std::uint64_t MappedFileSet::opens() const {
  std::lock_guard lock(mu_);
  return opens_;
}

LocalMappings::LocalMappings(std::size_t local_files)
    : limit_(mapped_files_limit()), bounded_(local_files > limit_) {}

std::shared_ptr<const MappedFile> LocalMappings::keep(std::shared_ptr<const MappedFile> m,
                                                      std::size_t& slot) {
  slot = 0;
  if (!bounded_ || m->in_memory() || m->size() == 0) return m;  // holds no mapping
  slot = files_.size();
  files_.push_back({m->path(), m->size(), m->stat()});
  return nullptr;
}

std::unique_ptr<MappedFileSet> LocalMappings::set() && {
  if (files_.empty()) return nullptr;
  return std::make_unique<MappedFileSet>(std::move(files_), limit_);
}

}  // namespace flowstate
