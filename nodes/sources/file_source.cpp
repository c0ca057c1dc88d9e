#include "nodes/sources/file_source.h"

#include <algorithm>
#include <cstring>

namespace flowstate {

std::string check_paths(const ParamValue& value) {
  const auto& paths = std::get<std::vector<std::string>>(value);
  if (paths.empty()) return "must name at least one file or glob";
  for (const auto& s : paths)
    if (s.empty()) return "must not contain an empty path";
  return "";
}

Tensor bytes_tensor(const void* data, std::size_t size) {
  Tensor t(DType::kUInt8, Shape{static_cast<std::int64_t>(size)});
  if (size > 0) std::memcpy(t.data(), data, size);
  return t;
}

FileSource::FileSource(std::string name, std::string kind, std::uint32_t source_id)
    : StatefulSpineNode(std::move(name)), source_id_(source_id), kind_(std::move(kind)) {}

void FileSource::add_file(std::string path, std::uint64_t records) {
  files_.push_back(std::move(path));
  total_ += records;
  first_.push_back(total_);
}

Ref FileSource::at(std::uint64_t, std::uint64_t i) const {
  // The file holding i: the last k with first_[k] <= i.
  auto it = std::upper_bound(first_.begin(), first_.end(), i);
  auto k = static_cast<std::uint32_t>(it - first_.begin() - 1);
  return Ref{source_id_, k, i};
}

void FileSource::start_epoch(std::uint64_t epoch) { state_ = {epoch, 0}; }

std::size_t FileSource::pull(std::span<Ref> out) {
  std::size_t n =
      static_cast<std::size_t>(std::min<std::uint64_t>(out.size(), total_ - state_.cursor));
  for (std::size_t j = 0; j < n; ++j) out[j] = at(state_.epoch, state_.cursor + j);
  state_.cursor += n;
  return n;
}

void FileSource::out_of_range(const Ref& ref) const {
  throw DataError(ref.shard < files_.size() ? files_[ref.shard] : kind_, DataError::kNoOffset,
                  "record " + std::to_string(ref.index) + " is out of range");
}

void FileSource::validate(const CursorState& s) const {
  if (s.cursor > total_)
    throw CheckpointError(name(), kind_ + " cursor " + std::to_string(s.cursor) +
                                      " is past the source's " + std::to_string(total_) +
                                      " records");
}

}  // namespace flowstate
