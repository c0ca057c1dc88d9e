// A map transform and a filter predicate, written as a user writes them: an options table and a
// make function each (nodes/transform.h, nodes/filter.h), registered by the plugin (plugin.cpp)
// beside its nodes. YAML names them by `fn`, in the pipeline that loads the plugin and in every
// mix input it reads:
//
//   xor_bytes   `- map: {fn: xor_bytes, key: 90}`: every byte of `field` XOR `key`, per sample
//               or per batch (after batch); twice with one key gives the bytes back.
//   byte_below  `- filter: {fn: byte_below, below: 128}`: keeps the samples whose `field`'s
//               first byte is below `below` (the built-in `value` with max: below - 1 keeps the
//               same ones).
#pragma once

#include "flowstate/nodes/transform.h"

namespace flowstate::examples {

/// The `xor_bytes` transform.
TransformSchema xor_bytes_transform();
/// The `byte_below` predicate.
PredicateSchema byte_below_predicate();

}  // namespace flowstate::examples
