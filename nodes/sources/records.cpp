#include "flowstate/nodes/sources/records.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "flowstate/core/error.h"
#include "flowstate/core/rng.h"

namespace flowstate {

const NodeDef& records_node() {
  static const NodeDef def = define_file_source<RecordsSource, RecordsOptions>(
      {.type = "records",
       .doc = "fixed-size records in shard files (e.g. token .bin files), memory-mapped"});
  return def;
}

RecordsSource::RecordsSource(std::string name, RecordsOptions options, std::uint32_t source_id)
    : FileSource(std::move(name), "records", "records", source_id),
      options_(std::move(options)),
      field_(field_id(options_.field)) {
  validate_fields(options_, "records");
  set_verify(options_.verify);
  std::vector<RemoteObject> remote;
  const SourceRemote settings = source_remote("records", options_);
  auto files = list_source_files(options_.paths, options_.base_dir, &settings);
  // More local files than a source keeps mapped: the large ones are mapped as reads reach
  // them, a bounded set at a time, and closed after their check here.
  LocalMappings local(local_file_count(files));
  for (auto& file : files) {
    if (file.remote) {
      // Numbered from the listing: nothing is downloaded until a record is read.
      const RemoteObject& o = *file.remote;
      if (o.size % options_.record_bytes != 0)
        throw DataError(o.url, o.size - o.size % options_.record_bytes,
                        "size of '" + o.url + "' (" + std::to_string(o.size) +
                            " bytes) is not a multiple of record_bytes (" +
                            std::to_string(options_.record_bytes) + ")");
      add_remote_file(o.url, o.size, o.etag, o.size / options_.record_bytes);
      maps_.push_back(nullptr);
      in_set_.push_back(false);
      slot_.push_back(remote.size());
      remote.push_back(o);
      continue;
    }
    const ExpandedPath& named = file.local;
    const std::string& f = named.path;
    auto m = std::make_shared<const MappedFile>(f);
    if (m->size() % options_.record_bytes != 0)
      throw DataError(f, m->size() - m->size() % options_.record_bytes,
                      "size of '" + f + "' (" + std::to_string(m->size()) +
                          " bytes) is not a multiple of record_bytes (" +
                          std::to_string(options_.record_bytes) + ")");
    add_file(named, *m, m->size() / options_.record_bytes);
    std::size_t slot = 0;
    maps_.push_back(local.keep(std::move(m), slot));
    in_set_.push_back(maps_.back() == nullptr);
    slot_.push_back(slot);
  }
  set_ = std::move(local).set();
  if (remote.empty()) return;
  // By blocks, whatever the limit: when it holds every block they all download from the first
  // read on, `connections` at a time, stay pinned and are read without a lock (a global
  // shuffle's random reads need every object at once); when it does not, a shuffle's random
  // reads download blocks, not objects again. (Whole objects through a RemoteWindow took its
  // lock per record and downloaded a global shuffle's objects two or three at a time:
  // bench/RESULTS.md, "a warm cache and a cold global shuffle".)
  blocks_ = std::make_unique<RemoteBlocks>(
      std::move(remote), options_.lookahead, block_bytes_from_environment(),
      resolve_cache_settings(&settings), resolve_remote_settings(&settings));
}

std::span<const std::byte> RecordsSource::record(const Ref& ref) const {
  const std::size_t offset = local(ref) * options_.record_bytes;
  const MappedFile* m = maps_[ref.shard].get();
  if (m != nullptr) [[likely]]
    return {m->data() + offset, options_.record_bytes};
  // A file of the set's, or a remote file's, bytes stay valid on this thread until its next
  // read of another file (another block).
  if (in_set_[ref.shard]) return set_->read(slot_[ref.shard], offset, options_.record_bytes);
  return blocks_->read(slot_[ref.shard], offset, options_.record_bytes);
}

void RecordsSource::plan_reads(std::span<const Ref> refs) const {
  thread_local std::vector<PlannedRead> reads;
  reads.clear();
  for (const Ref& ref : refs) {
    const Ref r = ref.record();  // padding reads its record again
    const std::size_t k = r.shard;
    // Local (or not a record: its read says so).
    if (k >= maps_.size() || maps_[k] != nullptr || in_set_[k]) continue;
    std::uint64_t i = 0;
    try {
      i = local(r);
    } catch (const DataError&) {
      continue;  // not one of this source's records: its read says so
    }
    reads.push_back({slot_[k], i * options_.record_bytes, options_.record_bytes});
  }
  blocks_->plan(reads);
}

void RecordsSource::epoch_started(std::uint64_t /*epoch*/) {
  if (blocks_) blocks_->new_pass();
}

void RecordsSource::read(const Ref& ref, Sample& sample) const {
  // A copy, not a view of the read-only mapping: maps may modify samples in place.
  auto bytes = record(ref);
  sample.ref = ref;
  sample.set(field_, bytes_tensor(bytes.data(), bytes.size()));
}

// ---- writing ----

namespace {

/// Stores the low `n` bytes of `v` at `dst`, little-endian.
void put_le(std::byte* dst, std::uint64_t v, std::size_t n) {
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(dst, &v, n);
  } else {
    for (std::size_t k = 0; k < n; ++k) dst[k] = static_cast<std::byte>(v >> (8 * k));
  }
}

/// Bytes of the chunks generate_synthetic_records hands out.
constexpr std::size_t kChunkBytes = std::size_t{8} << 20;

}  // namespace

void fill_synthetic_record(std::span<std::byte> record, std::uint64_t index, std::uint64_t seed) {
  const std::size_t size = record.size();
  put_le(record.data(), index, std::min<std::size_t>(8, size));
  for (std::size_t b = 8; b < size; b += 8)
    put_le(record.data() + b, philox64(seed, index, b / 8), std::min<std::size_t>(8, size - b));
}

void generate_synthetic_records(std::uint64_t begin, std::uint64_t end, std::size_t record_bytes,
                                std::uint64_t seed,
                                const std::function<void(std::span<const std::byte>)>& write) {
  if (record_bytes == 0)
    throw std::invalid_argument("synthetic records need record_bytes of at least 1");
  if (end <= begin) return;
  const std::size_t per_chunk = std::max<std::size_t>(1, kChunkBytes / record_bytes);
  std::vector<std::byte> chunk(
      static_cast<std::size_t>(std::min<std::uint64_t>(per_chunk, end - begin)) * record_bytes);
  for (std::uint64_t i = begin; i < end;) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(per_chunk, end - i));
    for (std::size_t r = 0; r < n; ++r)
      fill_synthetic_record({chunk.data() + r * record_bytes, record_bytes}, i + r, seed);
    write({chunk.data(), n * record_bytes});
    i += n;
  }
}

void write_synthetic_records(const std::string& path, std::uint64_t begin, std::uint64_t end,
                             std::size_t record_bytes, std::uint64_t seed) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw DataError(path, DataError::kNoOffset, "cannot create '" + path + "'");
  std::uint64_t offset = 0;
  generate_synthetic_records(begin, end, record_bytes, seed, [&](std::span<const std::byte> b) {
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    if (!out) throw DataError(path, offset, "cannot write '" + path + "'");
    offset += b.size();
  });
  out.close();
  if (!out) throw DataError(path, offset, "cannot write '" + path + "'");
}

}  // namespace flowstate
