// Reads planned from the order (issue 23): a store that reads remote data (a `records` or
// `indexed` source over URLs) learns from the spine which records the next batches read, before
// any worker reads them, and downloads ahead along that order (nodes/sources/remote_blocks.h,
// "Reads planned from the order").
//
// The spine asks its store once, when it is built, whether it wants the plan (a store that is
// not a ReadPlanner, or says no, is never called: a pipeline of local files pays nothing per
// batch but one null test). Then, for every batch it plans, in step order, it hands the store
// the batch's Refs. A plan names reads, it never changes one, and it is not state: a resumed
// spine plans from the position it restored.
#pragma once

#include <span>

#include "flowstate/core/ref.h"

namespace flowstate {

/// A store that downloads ahead along the spine's planned order (see the file comment).
class ReadPlanner {
 public:
  virtual ~ReadPlanner() = default;
  /// Whether plan_reads does anything (asked once, when the spine is built).
  virtual bool plans_reads() const = 0;
  /// The Refs of the next planned batch, in the order the batches were planned; called on the
  /// spine's thread before any worker reads them. Must not throw for a Ref it cannot place
  /// (the read will say what is wrong).
  virtual void plan_reads(std::span<const Ref> refs) const = 0;
};

}  // namespace flowstate
