// `device_copy`: moves every batch to the accelerator (DESIGN.md §8). With CUDA, batches are
// collated straight into pinned host buffers (staging_pool), copied with cudaMemcpyAsync on the
// node's own stream into pooled device buffers, and carry a Fence (a CUDA event).
// Loader::next() waits on it on the host before handing the batch out; Loader::next(stream)
// (or Batch::wait(stream)) hands the batch over to the consumer's stream instead: the stream
// waits on the event (cudaStreamWaitEvent), the host does not, and when the batch's device
// buffers are dropped an event recorded on that stream orders their reuse by a later copy.
//
//   while (auto b = loader.next(stream)) train_step(*b, stream);  // no host sync per batch
//
// A batch taken with next() names no stream: device buffers go back to their pool when the
// consumer drops it and a later copy may overwrite them — so finish device work on it before
// dropping it. Without CUDA, or without a usable device (also when device 0 exists but cannot
// be set up), `auto` hands out host memory and `cuda:N` fails with a clear ConfigError.
//
// User values (Batch::user, from from_range()) move through the ToDevice<T> customization
// point: copy() calls the batch's user_to_device, which calls ToDevice<C>::to_device on the
// collated value; a specialization moves the value's tensors with DeviceCopy::to_device, so
// they join the batch's Fence.
//
//   template <>
//   struct flowstate::ToDevice<MyBatch> {
//     static void to_device(MyBatch& b, DeviceCopy& copy) { b.pixels = copy.to_device(b.pixels); }
//   };
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "flowstate/core/batch.h"
#include "flowstate/core/buffer.h"
#include "flowstate/core/collate.h"
#include "flowstate/nodes/assembly.h"
#include "flowstate/nodes/node.h"
#include "flowstate/nodes/options.h"

namespace flowstate {

/// Options of the `device_copy` node.
struct DeviceCopyOptions {
  /// "auto" (cuda:LOCAL_RANK — the launcher's local rank, 0 without one — else host), "cpu",
  /// or "cuda:N". Free: the bytes a batch holds are the same wherever they live.
  std::string device = "auto";

  static constexpr auto table() {
    return std::tuple{
        param("device", &DeviceCopyOptions::device,
              {.free = true,
               .doc = "auto (cuda:LOCAL_RANK, 0 without a launcher, else host), cpu, or cuda:N",
               .check = check_device})};
  }
  /// The check of `device`: auto, cpu or cuda:N.
  static std::string check_device(const ParamValue& value);
  /// Delivering host memory: device=cpu (nullopt when it is so already).
  std::optional<std::string> on_host() const;
};

struct NodeDef;
/// The `device_copy` node's definition.
const NodeDef& device_copy_node();

/// True when this build has CUDA support compiled in.
bool cuda_compiled();
/// Number of usable CUDA devices (0 without CUDA, without a driver, or without a device).
int cuda_device_count();

/// The runtime side of `device_copy`: the node's deliver stage. `copy` runs serially on the
/// graph; `staging_pool` is where the batch assembler should collate batches bound for it.
class DeviceCopy final : public DeliverStage {
 public:
  /// Resolves the device; throws ConfigError (key `device_copy.device`) when it is unusable.
  explicit DeviceCopy(const DeviceCopyOptions& options);
  ~DeviceCopy() override;
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;

  /// Where batches end up.
  const Device& target() const { return target_; }
  /// The pool the assembler collates into: pinned host memory when copying to a device,
  /// plain host memory otherwise.
  std::shared_ptr<BufferPool> staging_pool() const override { return staging_; }
  /// DeliverStage: copy().
  Batch deliver(Batch batch) override { return copy(std::move(batch)); }
  /// Starts copying every field of `batch` to the target, then runs `batch.user_to_device`
  /// (when set) on `batch.user`; returns the batch with device tensors and one Fence covering
  /// every copy. On host targets the fields stay as they are and user_to_device still runs
  /// (its to_device calls return their tensors unchanged). Not thread-safe.
  Batch copy(Batch batch);
  /// Starts copying `tensor` to the target and returns the device tensor; a tensor already
  /// there, or any tensor on a host target, comes back unchanged. Called from a
  /// user_to_device inside copy(), the copy joins that batch's Fence (the Loader waits on it);
  /// called anywhere else, it is complete when this returns. Same thread as copy(). Throws
  /// Error naming the failed CUDA call.
  Tensor to_device(const Tensor& tensor);

 private:
  struct Impl;
  Device target_;
  std::shared_ptr<BufferPool> staging_;
  std::unique_ptr<Impl> impl_;
};

/// A Tensor moves to the target.
template <>
struct ToDevice<Tensor> {
  static void to_device(Tensor& value, DeviceCopy& copy) { value = copy.to_device(value); }
};

/// Every tensor of the list moves to the target.
template <>
struct ToDevice<std::vector<Tensor>> {
  static void to_device(std::vector<Tensor>& values, DeviceCopy& copy) {
    for (Tensor& t : values) t = copy.to_device(t);
  }
};

}  // namespace flowstate
