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

#include "flowstate/core/buffer.h"
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
  /// Samples of this batch that repeat a record so that every rank takes the same number of
  /// steps (shard's `uneven: pad`); their Refs are marked (Ref::is_pad).
  std::uint32_t padding = 0;
  std::vector<Ref> refs;  ///< provenance: the records of its samples, in order
};

/// A CUDA stream (a `cudaStream_t`) as flowstate's API passes it, so that headers need no CUDA
/// headers; nullptr is the legacy default stream.
using CudaStream = void*;

/// Completion of asynchronous work on a batch (a device copy). Loader::next() waits on it on
/// the host before handing the batch out; Loader::next(stream) and Batch::wait(stream) order
/// a consumer's stream after it instead (DECISIONS.md, "The CUDA stream handover").
class Fence {
 public:
  virtual ~Fence() = default;
  /// Blocks until the work is complete; throws Error when it failed.
  virtual void wait() const = 0;
  /// Makes the work queued on `stream` from now on wait for this work, without blocking the
  /// host, and makes the reuse of the batch's device buffers, once dropped, wait for the work
  /// `stream` has queued by then. Throws Error when a CUDA call fails. Thread-safe. This
  /// default, for work that is not on a stream, blocks as wait() does.
  virtual void wait(CudaStream stream) const {
    (void)stream;
    wait();
  }
  /// The device the work runs on (host memory when it does not run on one).
  virtual Device device() const { return Device{}; }
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
  /// Set by device_copy until the copy is known complete (Loader::next() waits and resets it;
  /// Loader::next(stream) keeps it, with `stream` ordered after it).
  std::shared_ptr<const Fence> fence;

  const Tensor& operator[](std::string_view name) const { return fields.at(name); }
  /// Blocks until the batch's device copy is complete; a no-op without one. Throws Error.
  void wait() const {
    if (fence) fence->wait();
  }
  /// Orders the work queued on `stream` after the batch's device copy without blocking the
  /// host (cudaStreamWaitEvent), and the reuse of its device buffers after the work `stream`
  /// has queued when they are dropped (see Fence::wait(CudaStream)); a no-op without a copy.
  /// Throws Error.
  void wait(CudaStream stream) const {
    if (fence) fence->wait(stream);
  }
  /// A 64-bit hash over the fields in order: name, dtype, shape, bytes. Host memory only.
  std::uint64_t digest() const;
};

}  // namespace flowstate
