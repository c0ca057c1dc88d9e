// The `indexed` source: Megatron-LM pairs (PREFIX.idx + PREFIX.bin), local or remote, many
// at once; one pair (its checks, copy and byte ranges) is IndexedFile, indexed_file.cpp.
#include "flowstate/nodes/sources/indexed.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14
#endif

#include "flowstate/core/error.h"
#include "flowstate/nodes/sources/remote_listing.h"
#include "flowstate/nodes/sources/remote_store.h"

namespace flowstate {

const NodeDef& indexed_node() {
  static const NodeDef def = define_file_source<IndexedSource, IndexedOptions>(
      {.type = "indexed",
       .doc = "Megatron-LM indexed data sets (PREFIX.idx + PREFIX.bin), memory-mapped; a "
              "record is a document or a sequence of tokens"});
  return def;
}

IndexedSource::IndexedSource(std::string name, IndexedOptions options, std::uint32_t source_id)
    : FileSource(std::move(name), "indexed",
                 options.unit == IndexedUnit::kDocument ? "documents" : "sequences", source_id),
      options_(std::move(options)),
      field_(field_id(options_.field)) {
  validate_fields(options_, "indexed");
  set_verify(options_.verify);
  if (std::any_of(options_.paths.begin(), options_.paths.end(),
                  [](const std::string& p) { return is_remote_url(p); })) {
    open_with_remote();
    return;  // nothing is mapped to populate
  }
  const auto pairs = expand_named_paths(options_.paths, options_.base_dir);
  // Two files a pair. With more than a source keeps mapped, each .idx is read into memory and
  // each .bin mapped as reads reach it, a bounded set at a time.
  LocalMappings local(2 * pairs.size());
  for (const auto& named : pairs) add_local_pair(named, local);
  set_ = std::move(local).set();
  for (const auto& f : files_data_) f->use_set(set_.get());
  start_populating();
}

void IndexedSource::check_dtype(const IndexedFile& f, const std::string& shown) const {
  if (files_data_.empty() || f.dtype() == files_data_.front()->dtype()) return;
  throw DataError(shown, DataError::kNoOffset,
                  "'" + shown + "' holds " + std::string(dtype_name(f.dtype())) + " tokens, '" +
                      files_data_.front()->bin_name() + "' " +
                      std::string(dtype_name(files_data_.front()->dtype())) +
                      ": one indexed source reads one dtype");
}

void IndexedSource::add_local_pair(const ExpandedPath& named, LocalMappings& local) {
  auto f = std::make_unique<IndexedFile>(named.path, local.bounded() ? &index_copies_ : nullptr);
  check_dtype(*f, named.path);
  // The identity is the .bin's (the tokens); the index's count is its `items`.
  add_file({.path = f->bin_name(), .name = megatron_bin_path(named.name)}, *f->mapped_bin(),
           options_.unit == IndexedUnit::kDocument ? f->documents() : f->sequences());
  std::size_t slot = 0;
  if (local.keep(f->bin_mapping(), slot) == nullptr) f->read_bin_through_set(slot);
  files_data_.push_back(std::move(f));
}

void IndexedSource::open_with_remote() {
  // Each pattern's pairs in order: a local pattern's as expand_named_paths gives them, a URL's
  // .idx objects as listed (once per job), each with the .bin listed beside it.
  struct Pair {
    ExpandedPath local;
    std::optional<RemoteObject> idx;  ///< a remote pair's .idx
    std::size_t bin = 0;              ///< a remote pair's .bin among `bins`
  };
  std::vector<Pair> pairs;
  std::vector<RemoteObject> idx_objects, bins;
  const SourceRemote settings = source_remote("indexed", options_);
  const RemoteSettings remote = resolve_remote_settings(&settings);
  for (const auto& p : options_.paths) {
    if (!is_remote_url(p)) {
      for (auto& named : expand_named_paths({p}, options_.base_dir))
        pairs.push_back({.local = std::move(named)});
      continue;
    }
    const std::string idx_pattern = p.ends_with(".idx") ? p : p + ".idx";
    const auto idx_listed = job_listing(idx_pattern, remote);
    const auto bin_listed = job_listing(megatron_bin_path(idx_pattern), remote);
    std::unordered_map<std::string, const RemoteObject*> bin_by_url;
    for (const auto& o : bin_listed) bin_by_url.emplace(o.url, &o);
    for (const auto& o : idx_listed) {
      const std::string want = megatron_bin_path(o.url);
      const auto it = bin_by_url.find(want);
      if (it == bin_by_url.end())
        throw DataError(want, DataError::kNoOffset,
                        "'" + o.url + "' has no '" + want +
                            "' beside it (an indexed source "
                            "reads PREFIX.idx with PREFIX.bin)");
      pairs.push_back({.idx = o, .bin = bins.size()});
      idx_objects.push_back(o);
      bins.push_back(*it->second);
    }
  }
  // The .idx copies stay pinned while the source lives (every lookup reads them); the .bin
  // blocks share the rest of the limit, checked before any download.
  std::uint64_t idx_bytes = 0;
  for (const auto& o : idx_objects) idx_bytes += o.size;
  CacheSettings cache = resolve_cache_settings(&settings);
  blocks_ = std::make_unique<RemoteBlocks>(bins, options_.lookahead, block_bytes_from_environment(),
                                           cache, remote, idx_bytes);
  const auto idx_pins = ObjectCache(cache).fetch(idx_objects, remote);
  std::size_t r = 0;
  LocalMappings local(2 * (pairs.size() - idx_objects.size()));
  for (auto& pair : pairs) {
    if (!pair.idx) {
      add_local_pair(pair.local, local);
      continue;
    }
    auto f = std::make_unique<IndexedFile>(idx_pins[r++], pair.idx->url, *blocks_, pair.bin);
    check_dtype(*f, pair.idx->url);
    // The pair is two objects: the .bin's URL names it, and the ETag recorded is both (the
    // index decides where each document starts: a changed .idx is other data).
    const RemoteObject& bin = bins[pair.bin];
    const std::string etag = bin.etag.empty() && pair.idx->etag.empty()
                                 ? std::string()
                                 : bin.etag + " (index " + pair.idx->etag + ")";
    add_remote_file(bin.url, bin.size, etag,
                    options_.unit == IndexedUnit::kDocument ? f->documents() : f->sequences());
    files_data_.push_back(std::move(f));
  }
  set_ = std::move(local).set();
  for (const auto& f : files_data_) f->use_set(set_.get());
}

IndexedSource::~IndexedSource() {
  if (!populate_) return;
  stop_populating_.store(true, std::memory_order_relaxed);
  if (::getpid() == populate_pid_)
    populate_->join();
  else
    (void)populate_.release();  // a forked child: there is no such thread here to join
}

void IndexedSource::start_populating() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return;
  const auto memory = static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page);
  std::uint64_t total = 0;
  std::vector<const MappedFile*> bins;
  for (const auto& f : files_data_) {
    const MappedFile* bin = f->mapped_bin();
    if (bin == nullptr || bin->in_memory() || bin->size() == 0) continue;
    total += bin->size();
    bins.push_back(bin);
  }
  if (bins.empty() || total > memory / 4) return;
  populate_pid_ = ::getpid();
  populate_ = std::make_unique<std::thread>([this, bins = std::move(bins)] {
    constexpr std::size_t kChunk = std::size_t{8} << 20;
    for (const MappedFile* bin : bins) {
      // A mapping starts on a page; a chunk's end past the file's last page stays in it.
      auto* base = const_cast<std::byte*>(bin->data());
      for (std::size_t at = 0; at < bin->size(); at += kChunk) {
        if (stop_populating_.load(std::memory_order_relaxed)) return;
        // EINVAL: a kernel before 5.14 (the workers' faults map the pages instead); EFAULT:
        // the file shrank (a read there is the SIGBUS guard's, as without this thread).
        if (::madvise(base + at, std::min(kChunk, bin->size() - at), MADV_POPULATE_READ) != 0)
          return;
      }
    }
  });
}

void IndexedSource::epoch_started(std::uint64_t /*epoch*/) {
  if (blocks_) blocks_->new_pass();
}

std::span<const std::byte> IndexedSource::record(const Ref& ref) const {
  const std::uint64_t i = local(ref);
  const IndexedFile& f = *files_data_[ref.shard];
  return options_.unit == IndexedUnit::kDocument ? f.document(i) : f.sequence(i);
}

void IndexedSource::read(const Ref& ref, Sample& sample) const {
  const auto bytes = record(ref);
  const IndexedFile& f = *files_data_[ref.shard];
  const auto n = static_cast<std::int64_t>(bytes.size() / dtype_size(f.dtype()));
  Tensor t(f.dtype(), Shape{n});
  if (!bytes.empty()) std::memcpy(t.data(), bytes.data(), bytes.size());
  sample.ref = ref;
  sample.set(field_, std::move(t));
}

void IndexedSource::plan_reads(std::span<const Ref> refs) const {
  thread_local std::vector<PlannedRead> reads;
  reads.clear();
  const bool documents = options_.unit == IndexedUnit::kDocument;
  for (const Ref& ref : refs) {
    const Ref r = ref.record();  // padding reads its record again
    if (r.shard >= files_data_.size() || !files_data_[r.shard]->remote()) continue;
    std::uint64_t i = 0;
    try {
      i = local(r);
    } catch (const DataError&) {
      continue;  // not one of this source's records: its read says so
    }
    reads.push_back(files_data_[r.shard]->planned_read(i, documents));
  }
  blocks_->plan(reads);
}

std::optional<RecordView> IndexedSource::view(const Ref& ref, FieldId field) const {
  if (field != field_) return std::nullopt;
  const IndexedFile& f = *files_data_[ref.shard];
  // A file of the set's: its bytes last until this thread's next read of another file, so
  // pack and filter read() its documents.
  if (f.in_set()) return std::nullopt;
  if (f.remote()) {
    // Blocks of a remote .bin stay where they lie only while the reader holds them all;
    // otherwise pack and filter read() its documents.
    if (!blocks_->holds_all()) return std::nullopt;
    return RecordView{f.dtype(), f.stable(local(ref), options_.unit == IndexedUnit::kDocument)};
  }
  return RecordView{f.dtype(), record(ref)};
}

void IndexedSource::views(std::span<const Ref> refs, FieldId field,
                          std::span<std::optional<RecordView>> out) const {
  if (field != field_) {
    std::fill_n(out.begin(), refs.size(), std::nullopt);
    return;
  }
  // A chunk of a shuffled order: each lookup is a cache miss (and, under nested paging, a page
  // walk). Asking for them all first lets them overlap; the reads below then mostly hit. (A
  // remote pair's index is a local copy too.)
  const bool documents = options_.unit == IndexedUnit::kDocument;
  for (const Ref& ref : refs) {
    const std::uint64_t i = local(ref);
    const IndexedFile& f = *files_data_[ref.shard];
    if (documents)
      f.prefetch_document(i);
    else
      f.prefetch_sequence(i);
  }
  if (blocks_ || set_) {
    // A remote .bin's views follow view()'s rule (none unless its blocks are all held), and
    // so do those of a .bin read through the set (none).
    for (std::size_t k = 0; k < refs.size(); ++k) out[k] = view(refs[k], field);
    return;
  }
  for (std::size_t k = 0; k < refs.size(); ++k)
    out[k] = RecordView{files_data_[refs[k].shard]->dtype(), record(refs[k])};
}

}  // namespace flowstate
