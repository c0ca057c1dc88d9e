#include "nodes/sources/records.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace flowstate {

NodeDescription RecordsOptions::describe() const {
  std::string joined;
  for (const auto& p : paths) joined += (joined.empty() ? "" : ",") + p;
  return {"records",
          {{"paths", joined}, {"record_bytes", std::to_string(record_bytes)}, {"field", field}}};
}

RecordsSource::RecordsSource(std::string name, RecordsOptions options, std::uint32_t source_id)
    : StatefulSpineNode(std::move(name)),
      options_(std::move(options)),
      source_id_(source_id),
      field_(field_id(options_.field)) {
  if (options_.record_bytes == 0)
    throw ConfigError("records.record_bytes", "record_bytes must be greater than zero");
  if (options_.paths.empty())
    throw ConfigError("records.paths", "paths must name at least one file or glob");
  files_ = expand_paths(options_.paths);
  first_.push_back(0);
  for (const auto& f : files_) {
    auto m = std::make_shared<const MappedFile>(f);
    if (m->size() % options_.record_bytes != 0)
      throw DataError(f, m->size() - m->size() % options_.record_bytes,
                      "size of '" + f + "' (" + std::to_string(m->size()) +
                          " bytes) is not a multiple of record_bytes (" +
                          std::to_string(options_.record_bytes) + ")");
    total_ += m->size() / options_.record_bytes;
    first_.push_back(total_);
    maps_.push_back(std::move(m));
  }
}

Ref RecordsSource::at(std::uint64_t, std::uint64_t i) const {
  // The file holding i: the last k with first_[k] <= i.
  auto it = std::upper_bound(first_.begin(), first_.end(), i);
  auto k = static_cast<std::uint32_t>(it - first_.begin() - 1);
  return Ref{source_id_, k, i};
}

void RecordsSource::start_epoch(std::uint64_t epoch) { state_ = {epoch, 0}; }

std::size_t RecordsSource::pull(std::span<Ref> out) {
  std::size_t n =
      static_cast<std::size_t>(std::min<std::uint64_t>(out.size(), total_ - state_.cursor));
  for (std::size_t j = 0; j < n; ++j) out[j] = at(state_.epoch, state_.cursor + j);
  state_.cursor += n;
  return n;
}

std::span<const std::byte> RecordsSource::record(const Ref& ref) const {
  const std::size_t k = ref.shard;
  if (k >= maps_.size() || ref.index < first_[k] || ref.index >= first_[k + 1])
    throw DataError(k < files_.size() ? files_[k] : options_.paths.front(), DataError::kNoOffset,
                    "record " + std::to_string(ref.index) + " is out of range");
  std::size_t offset = (ref.index - first_[k]) * options_.record_bytes;
  return {maps_[k]->data() + offset, options_.record_bytes};
}

void RecordsSource::read(const Ref& ref, Sample& sample) const {
  // A copy, not a view of the read-only mapping: maps may modify samples in place.
  auto bytes = record(ref);
  Tensor t(DType::kUInt8, Shape{static_cast<std::int64_t>(bytes.size())});
  std::memcpy(t.data(), bytes.data(), bytes.size());
  sample.ref = ref;
  sample.set(field_, std::move(t));
}

void RecordsSource::validate(const CursorState& s) const {
  if (s.cursor > total_)
    throw CheckpointError(name(), "records cursor " + std::to_string(s.cursor) +
                                      " is past the source's " + std::to_string(total_) +
                                      " records");
}

}  // namespace flowstate
