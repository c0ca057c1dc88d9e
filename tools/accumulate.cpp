#include "flowstate/tools/accumulate.h"

#include <string>

#include "flowstate/core/error.h"

namespace flowstate {

GradientAccumulator::GradientAccumulator(std::uint64_t micro_batches, std::uint64_t batch_size)
    : micro_batches_(micro_batches), batch_size_(batch_size) {
  if (micro_batches_ == 0)
    throw ConfigError("accumulate.micro_batches", "micro_batches must be greater than zero");
  if (batch_size_ == 0)
    throw ConfigError("accumulate.batch_size", "batch_size must be greater than zero");
}

bool GradientAccumulator::step_after(const BatchInfo& info) const {
  return info.is_last_in_epoch || position(info) + 1 == micro_batches_;
}

double GradientAccumulator::loss_scale(const BatchInfo& info) const {
  if (info.num_samples > batch_size_)
    throw Error(
        "batch " + std::to_string(info.step) + " holds " + std::to_string(info.num_samples) +
        " samples, more than the GradientAccumulator's batch_size " + std::to_string(batch_size_));
  return static_cast<double>(info.num_samples) / static_cast<double>(micro_batches_ * batch_size_);
}

std::uint64_t GradientAccumulator::window_samples(const BatchInfo& info) const {
  return position(info) * batch_size_ + info.num_samples;
}

double GradientAccumulator::step_scale(const BatchInfo& info) const {
  const std::uint64_t samples = window_samples(info);
  if (samples == 0) return 1.0;  // an empty batch contributed nothing to scale
  return static_cast<double>(micro_batches_ * batch_size_) / static_cast<double>(samples);
}

}  // namespace flowstate
