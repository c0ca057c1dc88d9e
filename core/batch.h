// Batch: collated fields ([B, ...] tensors), the BatchInfo the trainer needs (which step,
// which epoch, whether this batch ends the epoch), and the Stamp that makes it resumable.
//
//   for (const Batch& b : loader) {
//     train_step(b["data"]);
//     if (b.info.is_last_in_epoch) flush_gradient_accumulation();
//   }
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "flowstate/core/ref.h"
#include "flowstate/core/sample.h"
#include "flowstate/core/state.h"

namespace flowstate {

class DeviceCopy;

/// What a trainer needs to know about a batch. Set before the batch is handed out.
struct BatchInfo {
  std::uint64_t step = 0;            ///< global: counts every scheduled batch, across epochs
  std::uint64_t epoch = 0;           ///< 0-based
  std::uint64_t index_in_epoch = 0;  ///< 0-based position in the epoch's schedule
  std::optional<std::uint64_t> batches_in_epoch;  ///< the epoch's scheduled batches, if known
  bool is_last_in_epoch = false;  ///< no later batch of this epoch will be delivered
  std::uint32_t num_samples = 0;  ///< samples in this batch
  std::uint32_t remainder = 0;    ///< valid samples of a short last batch; 0 when full
  std::vector<Ref> refs;          ///< provenance: the records of its samples, in order
};

/// Completion of asynchronous work on a batch (a device copy). The Loader waits on it before
/// handing the batch out.
class Fence {
 public:
  virtual ~Fence() = default;
  /// Blocks until the work is complete; throws Error when it failed.
  virtual void wait() const = 0;
};

/// A batch of collated fields. Cheap to move; copying shares the tensors.
class Batch {
 public:
  Fields fields;
  BatchInfo info;
  Stamp stamp;  ///< the pipeline state after this batch is consumed
  /// The collated user values (set by the batch node's user collate, see Collate<T>); empty
  /// for tensor batches.
  UserValue user;
  /// Moves `user` to the device; set together with `user` by a typed collate (ToDevice<T>).
  /// device_copy calls it with its target; unset: the value stays where it is.
  std::function<void(UserValue&, DeviceCopy&)> user_to_device;
  /// Set by device_copy until the copy is known complete.
  std::shared_ptr<const Fence> fence;

  const Tensor& operator[](std::string_view name) const { return fields.at(name); }
  /// A 64-bit hash over the fields in order: name, dtype, shape, bytes. Host memory only.
  std::uint64_t digest() const;
};

}  // namespace flowstate
