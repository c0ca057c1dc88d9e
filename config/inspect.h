// Reading a saved pipeline state back for people: every node's state through its definition's
// inspect function (nodes/definition.h), looked up by the node type its stamp entry names.
// A node whose type no registered definition knows (a plugin's node, without its plugin) is
// shown by size instead of stopping the inspector; states of the first stamp format, which
// have no entries, are decoded node by node up to the first node it cannot read.
#pragma once

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

}  // namespace flowstate
