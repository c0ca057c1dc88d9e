#include "nodes/batch.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace flowstate {

NodeDescription BatchOptions::describe() const {
  return {"batch", {{"size", std::to_string(size)}, {"drop_last", drop_last ? "true" : "false"}}};
}

bool SkipRanges::contains(std::uint64_t step) const {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), step,
                             [](std::uint64_t s, const auto& r) { return s < r.first; });
  return it != ranges.begin() && std::prev(it)->second >= step;
}

void SkipRanges::add(std::uint64_t first, std::uint64_t last) {
  ranges.emplace_back(first, last);
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<std::uint64_t, std::uint64_t>> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() &&
        (merged.back().second == ~std::uint64_t{0} || r.first <= merged.back().second + 1)) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  ranges = std::move(merged);
}

// ---- planner ----

BatchPlanner::BatchPlanner(std::string name, BatchOptions options)
    : StatefulSpineNode(std::move(name)), options_(options) {
  if (options_.size == 0) throw ConfigError("batch.size", "batch size must be greater than zero");
}

std::uint64_t BatchPlanner::batches_in_epoch(std::uint64_t epoch) const {
  std::uint64_t n = upstream_->size(epoch);
  return n / options_.size + ((!options_.drop_last && n % options_.size != 0) ? 1 : 0);
}

std::uint64_t BatchPlanner::batch_samples(std::uint64_t epoch, std::uint64_t index) const {
  std::uint64_t n = upstream_->size(epoch);
  return index < n / options_.size ? options_.size : n % options_.size;
}

bool BatchPlanner::is_last_delivered(std::uint64_t epoch, std::uint64_t index,
                                     std::uint64_t step) const {
  // Last when every later batch of the epoch is skipped.
  std::uint64_t later = batches_in_epoch(epoch) - 1 - index;
  if (later == 0) return true;
  for (const auto& [first, last] : skips_.ranges) {
    if (first <= step + 1 && last >= step + later) return true;
  }
  return false;
}

void BatchPlanner::start_epoch(std::uint64_t epoch) {
  upstream_->start_epoch(epoch);
  state_.epoch = epoch;
  state_.index_in_epoch = 0;
  state_.started = true;
}

std::size_t BatchPlanner::pull(std::span<Ref> out) { return upstream_->pull(out); }

std::optional<BatchPlan> BatchPlanner::next() {
  for (;;) {
    if (!state_.started) {
      if (epochs_ != 0 && state_.epoch >= epochs_) return std::nullopt;
      // An empty data set run "forever" ends instead of spinning through empty epochs.
      if (epochs_ == 0 && upstream_->size(state_.epoch) == 0) return std::nullopt;
      start_epoch(state_.epoch);
    }
    const std::uint64_t total = batches_in_epoch(state_.epoch);
    if (state_.index_in_epoch >= total) {
      ++state_.epoch;
      state_.started = false;
      continue;
    }
    const std::uint64_t count = batch_samples(state_.epoch, state_.index_in_epoch);
    const std::uint64_t step = state_.step++;
    const std::uint64_t index = state_.index_in_epoch++;
    if (skips_.contains(step)) {
      // Dropped at the spine: the cursors move past its Refs, nothing is read.
      scratch_.resize(count);
      upstream_->pull(scratch_);
      continue;
    }
    BatchPlan plan;
    BatchInfo& info = plan.info;
    info.refs.resize(count);
    std::size_t got = upstream_->pull(info.refs);
    if (got != count)
      throw Error("upstream of '" + name() + "' ended after " + std::to_string(got) + " of " +
                  std::to_string(count) + " samples in epoch " + std::to_string(state_.epoch));
    info.step = step;
    info.epoch = state_.epoch;
    info.index_in_epoch = index;
    info.batches_in_epoch = total;
    info.is_last_in_epoch = is_last_delivered(state_.epoch, index, step);
    info.num_samples = static_cast<std::uint32_t>(count);
    info.remainder = count < options_.size ? static_cast<std::uint32_t>(count) : 0;
    return plan;
  }
}

// ---- assembler ----

BatchAssembler::BatchAssembler(const RecordStore* store, std::string source_name,
                               std::vector<SampleStage> sample_stages,
                               std::vector<BatchStage> batch_stages,
                               std::shared_ptr<BufferPool> pool)
    : store_(store),
      source_name_(std::move(source_name)),
      sample_stages_(std::move(sample_stages)),
      batch_stages_(std::move(batch_stages)),
      pool_(std::move(pool)) {}

Batch BatchAssembler::assemble(BatchPlan plan) const {
  Batch batch;
  if (sample_stages_.empty() && store_->record_bytes() > 0) {
    try {
      batch = gather(plan);
    } catch (...) {
      rethrow_with_node(std::current_exception(), source_name_);
    }
  } else {
    std::vector<Sample> samples(plan.info.refs.size());
    for (std::size_t i = 0; i < samples.size(); ++i) {
      const Ref& ref = plan.info.refs[i];
      try {
        store_->read(ref, samples[i]);
      } catch (...) {
        rethrow_with_node(std::current_exception(), source_name_);
      }
      for (const auto& stage : sample_stages_) {
        MapContext ctx{plan.info.epoch,
                       ElementRng(stage.key, element_stream(plan.info.epoch, ref))};
        try {
          stage.fn(samples[i], ctx);
        } catch (...) {
          rethrow_with_node(std::current_exception(), stage.name);
        }
      }
    }
    try {
      batch = collate(plan, samples);
    } catch (...) {
      rethrow_with_node(std::current_exception(), "batch");
    }
  }
  for (const auto& stage : batch_stages_) {
    MapContext ctx{batch.info.epoch,
                   ElementRng(stage.key, philox64(batch.info.epoch, batch.info.step, 1))};
    try {
      stage.fn(batch, ctx);
    } catch (...) {
      rethrow_with_node(std::current_exception(), stage.name);
    }
  }
  return batch;
}

Batch BatchAssembler::gather(BatchPlan& plan) const {
  const std::size_t rb = store_->record_bytes();
  const auto& refs = plan.info.refs;
  auto buffer = pool_->acquire(refs.size() * rb);
  auto* dst = static_cast<std::byte*>(buffer->data());
  // Shuffled records are DRAM misses taken one at a time; asking for the record a few
  // ahead overlaps them (bench/RESULTS.md: about +25% on W1).
  constexpr std::size_t kAhead = 4;
  constexpr std::size_t kLine = 64;
  auto prefetch = [&](std::size_t i) {
    const std::byte* p = store_->record(refs[i]).data();
    // Large records stream sequentially; the hardware prefetcher takes it from there.
    for (std::size_t off = 0; off < std::min<std::size_t>(rb, 4096); off += kLine)
      __builtin_prefetch(p + off);
  };
  for (std::size_t i = 0; i < std::min(kAhead, refs.size()); ++i) prefetch(i);
  for (std::size_t i = 0; i < refs.size(); ++i) {
    if (i + kAhead < refs.size()) prefetch(i + kAhead);
    std::memcpy(dst + i * rb, store_->record(refs[i]).data(), rb);
  }
  Batch batch;
  batch.fields.set(store_->record_field(), Tensor(std::move(buffer), 0, DType::kUInt8,
                                                  Shape{static_cast<std::int64_t>(refs.size()),
                                                        static_cast<std::int64_t>(rb)}));
  batch.info = std::move(plan.info);
  batch.stamp = std::move(plan.stamp);
  return batch;
}

Batch BatchAssembler::collate(BatchPlan& plan, std::vector<Sample>& samples) const {
  Batch batch;
  const auto b = static_cast<std::int64_t>(samples.size());
  if (!samples.empty()) {
    const Sample& first = samples.front();
    for (const auto& [id, proto] : first) {
      std::size_t bytes = proto.nbytes();
      auto buffer = pool_->acquire(bytes * samples.size());
      auto* dst = static_cast<std::byte*>(buffer->data());
      for (std::size_t i = 0; i < samples.size(); ++i) {
        const Tensor* t = samples[i].find(id);
        if (t == nullptr)
          throw DataError("", DataError::kNoOffset,
                          "field '" + std::string(field_name(id)) + "' is missing in sample " +
                              std::to_string(i) + " (record " + samples[i].ref.to_string() +
                              ") of step " + std::to_string(plan.info.step));
        if (t->dtype() != proto.dtype() || !(t->shape() == proto.shape()))
          throw DataError("", DataError::kNoOffset,
                          "field '" + std::string(field_name(id)) + "' is " +
                              std::string(dtype_name(proto.dtype())) + proto.shape().to_string() +
                              " in sample 0 but " + std::string(dtype_name(t->dtype())) +
                              t->shape().to_string() + " in sample " + std::to_string(i) +
                              " of step " + std::to_string(plan.info.step) +
                              ": stacking needs equal shapes");
        if (bytes > 0) std::memcpy(dst + i * bytes, t->data(), bytes);
      }
      batch.fields.set(id, Tensor(std::move(buffer), 0, proto.dtype(), proto.shape().prepend(b)));
    }
    for (std::size_t i = 1; i < samples.size(); ++i) {
      if (samples[i].size() != first.size())
        throw DataError("", DataError::kNoOffset,
                        "sample " + std::to_string(i) + " of step " +
                            std::to_string(plan.info.step) + " has " +
                            std::to_string(samples[i].size()) + " fields, sample 0 has " +
                            std::to_string(first.size()));
    }
  }
  batch.info = std::move(plan.info);
  batch.stamp = std::move(plan.stamp);
  return batch;
}

}  // namespace flowstate
