// `device_copy`: moves every batch to the accelerator (DESIGN.md §8). With CUDA, batches are
// collated straight into pinned host buffers (staging_pool), copied with cudaMemcpyAsync on the
// node's own stream into pooled device buffers, and carry a Fence (a CUDA event) that the
// Loader waits on before handing the batch out; device buffers go back to their pool when the
// consumer drops the batch, and a later copy may overwrite them — so finish (or stream-order)
// device work on a batch before dropping it. Without CUDA, or without a usable device (also
// when device 0 exists but cannot be set up), `auto` hands out host memory and `cuda:N` fails
// with a clear ConfigError.
#pragma once

#include <memory>
#include <string>

#include "core/batch.h"
#include "core/buffer.h"
#include "nodes/node.h"

namespace flowstate {

/// Options of the `device_copy` node.
struct DeviceCopyOptions {
  /// "auto" (the first CUDA device, else host), "cpu", or "cuda:N". Free: the bytes a batch
  /// holds are the same wherever they live.
  std::string device = "auto";
  NodeDescription describe() const;
};

/// True when this build has CUDA support compiled in.
bool cuda_compiled();
/// Number of usable CUDA devices (0 without CUDA, without a driver, or without a device).
int cuda_device_count();

/// The runtime side of `device_copy`. `copy` runs serially on the graph; `staging_pool` is
/// where the batch assembler should collate batches bound for this node.
class DeviceCopy {
 public:
  /// Resolves the device; throws ConfigError (key `device_copy.device`) when it is unusable.
  explicit DeviceCopy(const DeviceCopyOptions& options);
  ~DeviceCopy();
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;

  /// Where batches end up.
  const Device& target() const { return target_; }
  /// The pool the assembler collates into: pinned host memory when copying to a device,
  /// plain host memory otherwise.
  std::shared_ptr<BufferPool> staging_pool() const { return staging_; }
  /// Starts copying every field of `batch` to the target; returns the batch with device
  /// tensors and a Fence. On host targets returns `batch` unchanged.
  Batch copy(Batch batch);

 private:
  struct Impl;
  Device target_;
  std::shared_ptr<BufferPool> staging_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flowstate
