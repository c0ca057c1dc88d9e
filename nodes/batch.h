// `batch`: groups samples into batches of `size` and collates each field (stack, pad or
// ragged). Its options are what the runtime's planner and assembler take (BatchOptions,
// nodes/assembly.h); the node's build hands the runtime a BatchPlanner (AssemblyStage).
//
// `is_last_in_epoch` is set before a batch is handed out: from the epoch's length when the
// upstream knows it, else by looking one batch ahead (the stamp is cut before the look-ahead,
// so look-ahead Refs are never state). Skipped steps (Loader::skip) are dropped in the
// planner: their Refs are pulled but no record is read, and later batches keep their
// scheduled step numbers.
#pragma once

#include "flowstate/nodes/assembly.h"
#include "flowstate/nodes/definition.h"

namespace flowstate {

/// The `batch` node's definition.
const NodeDef& batch_node();

}  // namespace flowstate
