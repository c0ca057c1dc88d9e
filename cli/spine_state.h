// Decoding of a state's spine blob (serialize_stamp: a count, then per node its name and its
// state) for `flowstate inspect`. Node states are plain versioned structs without length
// prefixes, so a node is decoded by its type (from the canonical description); decoding
// stops at the first node of a type it does not know, which reports its remaining bytes.
#pragma once

#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "serialization/pipeline_state.h"

namespace flowstate::cli {

/// The spine's node states as a JSON array of {"name", "type", "state": {...}} (or
/// {"name", "type", "undecoded_bytes": N} for an unknown type, which ends the array).
/// Throws CheckpointError naming `origin` when the blob is truncated or corrupt.
nlohmann::ordered_json describe_spine_state(std::string_view spine,
                                            const std::vector<CanonicalParam>& canonical,
                                            const std::string& origin);

}  // namespace flowstate::cli
