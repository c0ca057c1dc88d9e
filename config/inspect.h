// Reading a saved pipeline state back for people: every node's state through its definition's
// inspect function (nodes/definition.h), looked up by the node type its stamp entry names.
// A node whose type no registered definition knows (a plugin's node, without its plugin) is
// shown by size instead of stopping the inspector; states of the first stamp format, which
// have no entries, are decoded node by node up to the first node it cannot read.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "flowstate/config/registry.h"
#include "flowstate/serialization/pipeline_state.h"

namespace flowstate {

/// The spine's node states as a JSON array (text) of {"name", "type", "state": {...}}; an
/// entry whose type no definition of `registry` reads is {"name", "type", "state_bytes": N,
/// "unknown_type": true}; a first-format stamp stops at a node it cannot read with
/// {"name", "type", "undecoded_bytes": N}. Throws CheckpointError naming `origin` when the
/// states are truncated or corrupt.
std::string describe_node_states(std::string_view spine,
                                 const std::vector<CanonicalParam>& canonical,
                                 const std::string& origin,
                                 const Registry& registry = Registry::global());

/// Where a state shown by describe_state comes from: a checkpoint's step directory, a file
/// holding the bytes of Loader::state(), or those bytes in memory (Python's describe_state).
struct StateSource {
  enum class Kind { kCheckpoint, kFile, kBytes };
  Kind kind = Kind::kBytes;
  std::string path;  ///< the step-N directory or the file; empty for bytes
  /// A checkpoint's N; unset: the state's own next step (last delivered + 1, or 0).
  std::optional<std::uint64_t> step;
  std::vector<std::string> skipped;  ///< newer checkpoints that failed to verify
  /// A JSON object (text) of other fields stored beside the bytes (a Python state_dict's
  /// epoch, step, ...), shown as they are; empty: none.
  std::string fields_json;
};

/// What `flowstate inspect` shows of a saved state, as one JSON object (text): source
/// ("checkpoint", "file" or "bytes"), path, bytes (the state's size), step, format_version,
/// fingerprint, last_step, last_epoch, skipped_checkpoints, pipeline ([{key, value}]),
/// skipped_steps, nodes (describe_node_states) and, when given, state_dict (the other fields).
/// Throws CheckpointError naming the state file (or "state" for bytes) when `state` is not a
/// flowstate state or is corrupt.
std::string describe_state(std::string_view state, const StateSource& source,
                           const Registry& registry = Registry::global());

/// describe_state's JSON as the text `flowstate inspect` prints.
std::string render_state_description(std::string_view description);

}  // namespace flowstate
