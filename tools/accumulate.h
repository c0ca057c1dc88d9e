// GradientAccumulator: the trainer's side of gradient accumulation. The optimizer steps once
// per window of `micro_batches` batches; windows are positions in the epoch's schedule
// (index_in_epoch / micro_batches), and the epoch's last batch always closes its window, so a
// short last window is stepped on its own — neither lost nor mixed into the next epoch. Every
// answer is a pure function of the batch's BatchInfo, so after a restore (Loader::restore /
// load_state) the windows are exactly those of the uninterrupted run, also mid-window.
//
// Scaling is by samples, so a window's gradient is the mean over the samples it saw: scale
// each batch's mean loss by loss_scale() (num_samples / (micro_batches * batch_size)), and
// before a step multiply the accumulated gradients by step_scale() — 1 for a full window,
// more for the epoch's short last window (fewer batches, or a short last batch).
//
//   GradientAccumulator acc(4, /*batch_size=*/32);
//   for (const Batch& b : loader) {
//     (model.loss(b) * acc.loss_scale(b.info)).backward();
//     if (acc.step_after(b.info)) {
//       scale_gradients(acc.step_scale(b.info));
//       optimizer.step();
//       optimizer.zero_grad();
//     }
//   }
//
// A checkpoint taken mid-window resumes mid-window: gradients accumulated before it are not
// part of the loader's state, so save the trainer at step_after() batches when they matter.
// Skipped steps (Loader::skip) leave holes in their windows; skip whole windows to keep every
// step's window complete.
#pragma once

#include <cstdint>

#include "flowstate/core/batch.h"

namespace flowstate {

/// See the file comment. Immutable after construction; thread-safe.
class GradientAccumulator {
 public:
  /// `micro_batches` batches per optimizer step (>= 1) of `batch_size` samples (the batch
  /// node's size, >= 1). Throws ConfigError (key `accumulate.micro_batches` /
  /// `accumulate.batch_size`) when either is zero.
  GradientAccumulator(std::uint64_t micro_batches, std::uint64_t batch_size);

  std::uint64_t micro_batches() const { return micro_batches_; }
  std::uint64_t batch_size() const { return batch_size_; }

  /// The batch's window within its epoch (0-based).
  std::uint64_t window(const BatchInfo& info) const { return info.index_in_epoch / micro_batches_; }
  /// The batch's position in its window (0-based).
  std::uint64_t position(const BatchInfo& info) const {
    return info.index_in_epoch % micro_batches_;
  }
  /// True for a window's first position (gradients should be zero before its backward).
  bool starts_window(const BatchInfo& info) const { return position(info) == 0; }
  /// True when the optimizer steps after this batch: it fills its window, or it is the last
  /// batch of its epoch (a short window is stepped, not carried into the next epoch).
  bool step_after(const BatchInfo& info) const;
  /// The factor for this batch's mean loss: num_samples / (micro_batches * batch_size).
  /// Throws Error when num_samples exceeds batch_size.
  double loss_scale(const BatchInfo& info) const;
  /// Samples in this batch's window up to and including it: earlier positions hold full
  /// batches (only an epoch's last batch is short). At a step_after() batch: the window's
  /// samples.
  std::uint64_t window_samples(const BatchInfo& info) const;
  /// The factor for the accumulated gradients before the step after this batch:
  /// micro_batches * batch_size / window_samples(info). 1 for a full window.
  double step_scale(const BatchInfo& info) const;

 private:
  std::uint64_t micro_batches_;
  std::uint64_t batch_size_;
};

}  // namespace flowstate
