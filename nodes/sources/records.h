// `records` source: fixed-size records in one or more shard files, memory-mapped, with O(1)
// random access. Record i of the source is record (i - first_k) of file k, where files are
// taken in sorted order and first_k counts the records of the files before k.
//
//   RecordsOptions o{.paths = {"data/train-*.bin"}, .record_bytes = 1024};
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "nodes/node.h"
#include "nodes/sources/mapped_file.h"

namespace flowstate {

/// Options of the `records` source.
struct RecordsOptions {
  std::vector<std::string> paths;  ///< files or globs; each glob's matches sorted
  std::size_t record_bytes = 0;    ///< bytes per record; required, > 0
  std::string field = "data";      ///< name of the uint8 [record_bytes] field in each sample
  NodeDescription describe() const;
};

/// The spine state of a sequential source: where its cursor is.
struct CursorState {
  std::uint64_t epoch = 0;
  std::uint64_t cursor = 0;  ///< Refs emitted in this epoch
  template <class Archive>
  void serialize(Archive& ar, std::uint32_t version) {
    if (version > 1)
      throw CheckpointError("state", "CursorState version " + std::to_string(version) +
                                         " is newer than this build's 1; upgrade flowstate");
    ar(epoch, cursor);
  }
};

/// The `records` source. Opening validates every file: an empty match, an unreadable file,
/// or a size that is not a multiple of record_bytes is a DataError naming the file.
class RecordsSource final : public StatefulSpineNode<CursorState>, public RecordStore {
 public:
  RecordsSource(std::string name, RecordsOptions options, std::uint32_t source_id = 0);

  std::uint64_t size(std::uint64_t) const override { return total_; }
  bool indexed() const override { return true; }
  Ref at(std::uint64_t epoch, std::uint64_t i) const override;
  void start_epoch(std::uint64_t epoch) override;
  std::size_t pull(std::span<Ref> out) override;

  std::size_t record_bytes() const override { return options_.record_bytes; }
  std::span<const std::byte> record(const Ref& ref) const override;
  void read(const Ref& ref, Sample& sample) const override;
  FieldId record_field() const override { return field_; }

  const std::vector<std::string>& files() const { return files_; }

 protected:
  void validate(const CursorState& s) const override;

 private:
  RecordsOptions options_;
  std::uint32_t source_id_;
  FieldId field_;
  std::vector<std::string> files_;
  std::vector<std::shared_ptr<const MappedFile>> maps_;
  std::vector<std::uint64_t> first_;  ///< first global index of each file, plus the total
  std::uint64_t total_ = 0;
};

}  // namespace flowstate

CEREAL_CLASS_VERSION(flowstate::CursorState, 1);
