// PipelineState: everything needed to resume a pipeline exactly — the stamp of the last batch
// the consumer received, the skipped step ranges, and the fingerprint of the pipeline that
// produced it. Loader::state() returns it encoded; it is also a checkpoint's state.bin.
//
// Encoding: the 8-byte magic "FLWSTATE", then a cereal portable-binary archive.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flowstate {

/// A canonical parameter of the pipeline: "batch.size" -> "256".
using CanonicalParam = std::pair<std::string, std::string>;

/// One change of a run's data (LoaderOptions::on_data_change, Loader::set_mix_weights): the
/// first step that saw it and what changed, one line per parameter or note.
struct DataChangeRecord {
  std::uint64_t step = 0;
  std::string what;
  bool operator==(const DataChangeRecord&) const = default;
};

/// A pipeline's resumable state.
struct PipelineState {
  /// Format of the encoding; bumped on incompatible changes. Version 2 adds the history of data
  /// changes; a state without any is written as version 1, byte for byte as before.
  static constexpr std::uint32_t kFormatVersion = 2;

  /// The version written: at least 2 when there are data changes (see kFormatVersion).
  std::uint32_t format_version = 1;
  std::uint64_t fingerprint = 0;            ///< hash of `canonical`
  std::vector<CanonicalParam> canonical;    ///< the pipeline without its free parameters
  std::optional<std::uint64_t> last_step;   ///< last delivered step; none before the first
  std::optional<std::uint64_t> last_epoch;  ///< its epoch
  std::vector<std::pair<std::uint64_t, std::uint64_t>> skips;  ///< inclusive, sorted, disjoint
  std::string spine;                           ///< serialized stamp: the spine nodes' states
  std::vector<DataChangeRecord> data_changes;  ///< the run's data changes, oldest first

  /// The bytes of this state.
  std::string encode() const;
  /// Parses `bytes`; throws CheckpointError naming `origin` (a file, or "state") and what is
  /// wrong: bad magic, a newer format, truncation.
  static PipelineState decode(std::string_view bytes, const std::string& origin = "state");
};

/// Fingerprint of a canonical description.
std::uint64_t fingerprint_of(const std::vector<CanonicalParam>& canonical);

/// Names every difference between a checkpoint's canonical description and the current one,
/// one per line ("batch.size: 256 in checkpoint, 512 now"); empty when they agree.
std::string describe_mismatch(const std::vector<CanonicalParam>& in_checkpoint,
                              const std::vector<CanonicalParam>& now);

}  // namespace flowstate
