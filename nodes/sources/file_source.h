// FileSource: what every file-backed source (records, lines, tar) shares — records numbered
// across files in order (record i of the source is record i - first_k of file k), O(1)
// random access, and a cursor as its whole state. A derived source opens its files in its
// constructor, calling add_file() once per file in order, and reads records by Ref.
#pragma once

#include <string>
#include <vector>

#include "core/error.h"
#include "nodes/definition.h"
#include "nodes/node.h"
#include "nodes/options.h"

namespace flowstate {

/// The check of a source's `paths` option: at least one path, none empty.
std::string check_paths(const ParamValue& value);
/// The doc of a source's `paths` option.
inline constexpr const char* kPathsDoc =
    "files or globs, each glob's matches in sorted order; relative to the YAML file";
/// A uint8 [size] tensor holding a copy of `size` bytes at `data` (samples are writable, so
/// they never view a read-only mapping).
Tensor bytes_tensor(const void* data, std::size_t size);

/// The spine state of a sequential source: where its cursor is.
struct CursorState {
  std::uint64_t epoch = 0;
  std::uint64_t cursor = 0;  ///< Refs emitted in this epoch
  template <class Archive>
  void serialize(Archive& ar, std::uint32_t version) {
    require_state_version("CursorState", version, 1);
    ar(epoch, cursor);
  }
  static constexpr auto inspect_fields() {
    return std::tuple{std::pair{"epoch", &CursorState::epoch},
                      std::pair{"cursor", &CursorState::cursor}};
  }
};

/// The base of file-backed sources. Not thread-safe in its spine part; `local()` is.
class FileSource : public StatefulSpineNode<CursorState>, public RecordStore {
 public:
  /// `kind` names the source in messages ("records"); `source_id` goes into its Refs.
  FileSource(std::string name, std::string kind, std::uint32_t source_id);

  std::uint64_t size(std::uint64_t) const final { return total_; }
  bool indexed() const final { return true; }
  Ref at(std::uint64_t epoch, std::uint64_t i) const final;
  void start_epoch(std::uint64_t epoch) final;
  std::size_t pull(std::span<Ref> out) final;

  /// The files, in record order.
  const std::vector<std::string>& files() const { return files_; }

 protected:
  /// Appends the next file, holding `records` records.
  void add_file(std::string path, std::uint64_t records);
  /// The index of `ref` within its file; throws DataError naming the file for a Ref that is
  /// not one of this source's. Inline: the gather fast path calls it twice per record.
  std::uint64_t local(const Ref& ref) const {
    const std::size_t k = ref.shard;
    if (k >= files_.size() || ref.index < first_[k] || ref.index >= first_[k + 1]) [[unlikely]]
      out_of_range(ref);
    return ref.index - first_[k];
  }
  void validate(const CursorState& s) const final;
  [[noreturn]] void out_of_range(const Ref& ref) const;

  std::uint32_t source_id_;
  std::vector<std::string> files_;

 private:
  std::string kind_;
  std::vector<std::uint64_t> first_{0};  ///< first global index of each file, plus the total
  std::uint64_t total_ = 0;
};

/// The build function of a file source `Source` (constructed as Source(name, options, id)).
template <class Source, class Options>
void add_file_source(BuildContext& ctx, const Options& options) {
  auto node = std::make_unique<Source>(ctx.name(), options, ctx.source_id());
  const RecordStore* store = node.get();
  ctx.add_store(std::move(node), store);
}

}  // namespace flowstate

CEREAL_CLASS_VERSION(flowstate::CursorState, 1);
