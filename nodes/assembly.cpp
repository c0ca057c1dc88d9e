// Batch planning and assembly in one file (over 600 lines): the planner, the assembler and the
// batch slots share the plan's private helpers and the collation path, which a split would
// have to expose in a header.
#include "flowstate/nodes/assembly.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "flowstate/core/error.h"
#include "flowstate/nodes/sources/mapped_file.h"

namespace flowstate {

std::string_view collate_mode_name(CollateMode mode) { return enum_name(mode); }

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
    : StatefulSpineNode(std::move(name)), options_(options) {}

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
      const std::uint64_t n = upstream_->size(state_.epoch);
      // An empty data set run "forever" ends instead of spinning through empty epochs.
      if (epochs_ == 0 && n == 0) return std::nullopt;
      start_epoch(state_.epoch);
    }
    std::optional<BatchPlan> plan =
        upstream_->size(state_.epoch) == kUnknownSize ? next_unsized() : next_sized();
    if (plan) return plan;
    if (state_.started) continue;  // the epoch ended; the next one starts on the next turn
    if (epochs_ == 0 && !epoch_had_refs_) return std::nullopt;  // unsized and empty
  }
}

std::optional<BatchPlan> BatchPlanner::next_sized() {
  for (;;) {
    const std::uint64_t total = batches_in_epoch(state_.epoch);
    if (state_.index_in_epoch >= total) {
      ++state_.epoch;
      state_.started = false;
      epoch_had_refs_ = total > 0;
      return std::nullopt;
    }
    const std::uint64_t count = batch_samples(state_.epoch, state_.index_in_epoch);
    const std::uint64_t step = state_.step++;
    const std::uint64_t index = state_.index_in_epoch++;
    if (skips_.contains(step)) {
      // Dropped at the spine: the cursors move past its Refs, nothing is read.
      scratch_.resize(count);
      upstream_->pull(scratch_);
      release(scratch_);
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
    finish(info);
    if (snapshot_) plan.stamp = snapshot_();
    return plan;
  }
}

void BatchPlanner::finish(BatchInfo& info) const {
  if (!plan_stages_.empty()) {
    const PlanStage::Context ctx{.batch_size = options_.size,
                                 .release = [this](std::span<const Ref> refs) { release(refs); }};
    for (const auto& stage : plan_stages_) stage.fn(info, ctx);
  }
  info.padding = static_cast<std::uint32_t>(
      std::count_if(info.refs.begin(), info.refs.end(), [](const Ref& r) { return r.is_pad(); }));
}

void BatchPlanner::look_ahead() {
  ahead_valid_ = true;
  for (;;) {
    ahead_.resize(options_.size);
    ahead_.resize(upstream_->pull(ahead_));
    if (!ahead_.empty()) epoch_had_refs_ = true;
    if (ahead_ends_epoch() || !skips_.contains(state_.step)) return;
    // A skipped step: its Refs are pulled and dropped, the step still counts.
    release(ahead_);
    ++state_.step;
    ++state_.index_in_epoch;
  }
}

std::optional<BatchPlan> BatchPlanner::next_unsized() {
  if (!ahead_valid_) {
    if (state_.index_in_epoch == 0) epoch_had_refs_ = false;
    look_ahead();
  }
  if (ahead_ends_epoch()) {
    release(ahead_);  // a short batch under drop_last
    ahead_.clear();
    ahead_valid_ = false;
    ++state_.epoch;
    state_.started = false;
    return std::nullopt;
  }
  BatchPlan plan;
  BatchInfo& info = plan.info;
  info.refs = std::move(ahead_);
  ahead_.clear();
  const auto count = static_cast<std::uint32_t>(info.refs.size());
  info.step = state_.step++;
  info.epoch = state_.epoch;
  info.index_in_epoch = state_.index_in_epoch++;
  // The stamp is cut before the look-ahead: restored, the planner pulls the same Refs again.
  if (snapshot_) plan.stamp = snapshot_();
  look_ahead();
  info.is_last_in_epoch = ahead_ends_epoch();
  // Known now: the look-ahead counted any skipped steps that close the epoch.
  if (info.is_last_in_epoch) info.batches_in_epoch = state_.index_in_epoch;
  info.num_samples = count;
  info.remainder = count < options_.size ? count : 0;
  finish(info);
  return plan;
}

// ---- assembler ----

BatchAssembler::BatchAssembler(const RecordStore* store, std::string store_name,
                               BatchOptions options, std::vector<SampleStage> sample_stages,
                               std::vector<BatchStage> batch_stages,
                               std::shared_ptr<BufferPool> pool)
    : store_(store),
      store_name_(std::move(store_name)),
      sample_stages_(std::move(sample_stages)),
      options_(std::move(options)),
      batch_stages_(std::move(batch_stages)),
      pool_(std::move(pool)) {}

void MappedReader::read_after(MappedReader* prev) {
  if (prev == nullptr || prev->stages_ != stages_ || prev->store_ != store_ ||
      prev->count_ > count_)
    return;
  prev_ = prev;
  prev->wanted_ = true;
}

void MappedReader::pass_on(const Ref& ref, std::uint64_t epoch, Sample&& sample) const {
  if (!wanted_) return;
  std::lock_guard lock(passed_mu_);
  if (passed_.size() >= kMaxPassed) passed_.clear();
  passed_.insert_or_assign({epoch, ref}, std::move(sample));
}

bool MappedReader::take(const Ref& ref, std::uint64_t epoch, Sample& sample) const {
  std::lock_guard lock(passed_mu_);
  auto it = passed_.find({epoch, ref});
  if (it == passed_.end()) return false;
  sample = std::move(it->second);
  passed_.erase(it);
  return true;
}

void MappedReader::read(const Ref& ref, std::uint64_t epoch, Sample& sample) const {
  // From the sample an earlier reader along the same maps passed on, with the maps since.
  std::size_t first = 0;
  if (prev_ != nullptr && prev_->take(ref, epoch, sample)) {
    first = prev_->count_;
  } else {
    try {
      store_->read(ref.record(), sample);
    } catch (...) {
      rethrow_with_node(std::current_exception(), store_name_);
    }
  }
  for (std::size_t i = first; i < count_; ++i) {
    const SampleStage& stage = (*stages_)[i];
    MapContext ctx{epoch, ElementRng(stage.key, element_stream(epoch, ref.record()))};
    try {
      stage.fn(sample, ctx);
    } catch (...) {
      rethrow_with_node(std::current_exception(), stage.name);
    }
  }
}

namespace {

/// Releases every record of `refs` once: a padding sample repeats a record that may also be
/// in the batch itself.
void release_records(const RecordStore* store, std::span<const Ref> refs) {
  if (std::none_of(refs.begin(), refs.end(), [](const Ref& r) { return r.is_pad(); })) {
    store->release(refs);
    return;
  }
  std::vector<Ref> records;
  for (const Ref& r : refs) records.push_back(r.record());
  std::sort(records.begin(), records.end());
  records.erase(std::unique(records.begin(), records.end()), records.end());
  store->release(records);
}

}  // namespace

Tensor BatchSlots::tensor(FieldId id, DType dtype, const Shape& shape, std::size_t index) {
  Field* f = nullptr;
  for (auto& g : fields_)
    if (g.id == id) f = &g;
  if (f == nullptr) {
    f = &fields_.emplace_back();
    f->id = id;
    f->dtype = dtype;
    f->shape = shape;
    f->bytes = static_cast<std::size_t>(shape.numel()) * dtype_size(dtype);
    if (f->bytes > 0) f->buffer = pool_->acquire(f->bytes * size_);
    f->handed.assign(size_, false);
  }
  if (f->buffer == nullptr || index >= size_ || f->handed[index] || f->dtype != dtype ||
      !(f->shape == shape))
    return Tensor(dtype, shape);
  f->handed[index] = true;
  return Tensor(f->buffer, index * f->bytes, dtype, shape);
}

Tensor BatchSlots::adopt(FieldId id, const std::vector<Sample>& samples) {
  for (auto& f : fields_) {
    if (f.id != id) continue;
    if (f.adopted || f.buffer == nullptr || samples.size() != size_) return {};
    const auto* base = static_cast<const std::byte*>(f.buffer->data());
    for (std::size_t i = 0; i < samples.size(); ++i) {
      const Tensor* t = samples[i].find(id);
      if (t == nullptr || t->dtype() != f.dtype || !(t->shape() == f.shape) ||
          t->data() != base + i * f.bytes)
        return {};
    }
    f.adopted = true;
    return Tensor(f.buffer, 0, f.dtype, f.shape.prepend(static_cast<std::int64_t>(size_)));
  }
  return {};
}

Tensor output_tensor(MapContext& ctx, FieldId id, DType dtype, Shape shape) {
  if (ctx.slots != nullptr) return ctx.slots->tensor(id, dtype, shape, ctx.index);
  return Tensor(dtype, std::move(shape));
}

std::vector<std::string> BatchAssembler::stage_names(const std::string& batch_name) const {
  std::vector<std::string> names{store_name_};
  for (const auto& st : sample_stages_) names.push_back(st.name);
  names.push_back(batch_name);
  for (const auto& st : batch_stages_) names.push_back(st.name);
  return names;
}

Batch BatchAssembler::assemble(BatchPlan plan, AssemblyTimes* times) const {
  Batch batch;
  try {
    assemble_into(plan, batch, times);
  } catch (...) {
    // The Refs go back to the store whatever happens (it may hold their values); they are
    // in the plan or, once collated, in the batch.
    release_records(store_, plan.info.refs);
    release_records(store_, batch.info.refs);
    throw;
  }
  release_records(store_, batch.info.refs);
  return batch;
}

namespace {

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::uint64_t sample_bytes(const Sample& s) {
  std::uint64_t n = 0;
  for (const auto& [id, t] : s) n += t.nbytes();
  return n;
}

std::uint64_t batch_field_bytes(const Batch& b) {
  std::uint64_t n = 0;
  for (const auto& [id, t] : b.fields) n += t.nbytes();
  return n;
}

}  // namespace

void BatchAssembler::assemble_into(BatchPlan& plan, Batch& batch, AssemblyTimes* times) const {
  // Timing is per stage and chunk of samples: the samples of a chunk are read, then each map
  // runs over the chunk. A chunk of 16 keeps the samples in cache between stages (as sample by
  // sample did) at a few clock reads per chunk instead of per sample. Outputs are the same in
  // any order: each map sees one sample and its own generator.
  constexpr std::size_t kChunk = 16;
  std::int64_t t = times != nullptr ? now_ns() : 0;
  auto mark = [&](std::size_t stage, std::uint64_t items, std::uint64_t bytes) {
    if (times == nullptr) return;
    const std::int64_t end = now_ns();
    AssemblyTimes::Stage& st = times->stages[stage];
    st.ns += static_cast<std::uint64_t>(end - t);
    st.items += items;
    st.bytes += bytes;
    t = end;
  };
  if (times != nullptr) {
    times->begin_ns = t;
    times->stages.assign(stage_count(), AssemblyTimes::Stage{});
  }
  const std::size_t n = plan.info.refs.size();
  // A store that assembles its records from pieces (pack's rows) writes them into the batch.
  auto store_gathered = [&] {
    if (!sample_stages_.empty() || options_.collate != CollateMode::kStack || options_.user_collate)
      return false;
    try {
      if (!store_->gather(plan.info.refs, *pool_, batch.fields)) return false;
    } catch (...) {
      rethrow_with_node(std::current_exception(), store_name_);
    }
    batch.info = std::move(plan.info);
    batch.stamp = std::move(plan.stamp);
    return true;
  };
  if (store_gathered()) {
    mark(0, n, batch_field_bytes(batch));
  } else if (sample_stages_.empty() && store_->record_bytes() > 0 &&
             options_.collate == CollateMode::kStack) {
    try {
      batch = gather(plan);
    } catch (...) {
      rethrow_with_node(std::current_exception(), store_name_);
    }
    mark(0, n, n * store_->record_bytes());
  } else {
    std::vector<Sample> samples(n);
    // Stacked fields' memory, offered to the maps (BatchSlots): collation adopts what they
    // wrote there instead of copying it.
    std::optional<BatchSlots> slots;
    if (options_.collate == CollateMode::kStack) slots.emplace(*pool_, n);
    for (std::size_t c0 = 0; c0 < n; c0 += kChunk) {
      const std::size_t c1 = std::min(n, c0 + kChunk);
      std::uint64_t bytes = 0;
      for (std::size_t i = c0; i < c1; ++i) {
        try {
          store_->read(plan.info.refs[i].record(), samples[i]);  // a padding Ref reads its record
        } catch (...) {
          rethrow_with_node(std::current_exception(), store_name_);
        }
        if (times != nullptr) bytes += sample_bytes(samples[i]);
      }
      mark(0, c1 - c0, bytes);
      for (std::size_t k = 0; k < sample_stages_.size(); ++k) {
        const SampleStage& stage = sample_stages_[k];
        bytes = 0;
        for (std::size_t i = c0; i < c1; ++i) {
          MapContext ctx{
              plan.info.epoch,
              ElementRng(stage.key, element_stream(plan.info.epoch, plan.info.refs[i].record())),
              slots ? &*slots : nullptr, i};
          try {
            stage.fn(samples[i], ctx);
          } catch (...) {
            rethrow_with_node(std::current_exception(), stage.name);
          }
          if (times != nullptr) bytes += sample_bytes(samples[i]);
        }
        mark(1 + k, c1 - c0, bytes);
      }
    }
    try {
      batch = collate(plan, samples, slots ? &*slots : nullptr);
    } catch (...) {
      rethrow_with_node(std::current_exception(), "batch");
    }
    mark(1 + sample_stages_.size(), n, times != nullptr ? batch_field_bytes(batch) : 0);
  }
  for (std::size_t k = 0; k < batch_stages_.size(); ++k) {
    const BatchStage& stage = batch_stages_[k];
    MapContext ctx{batch.info.epoch,
                   ElementRng(stage.key, philox64(batch.info.epoch, batch.info.step, 1))};
    try {
      stage.fn(batch, ctx);
    } catch (...) {
      rethrow_with_node(std::current_exception(), stage.name);
    }
    mark(2 + sample_stages_.size() + k, batch.info.num_samples,
         times != nullptr ? batch_field_bytes(batch) : 0);
  }
  // A data file cut short under the run gave zeros where its bytes were (MappedFile's SIGBUS
  // guard); no batch made after that leaves here. One relaxed load when nothing faulted.
  if (faulted_mappings() != 0) {
    try {
      check_mappings();
    } catch (...) {
      rethrow_with_node(std::current_exception(), store_name_);
    }
  }
}

Batch BatchAssembler::gather(BatchPlan& plan) const {
  const std::size_t rb = store_->record_bytes();
  const auto& refs = plan.info.refs;
  auto buffer = pool_->acquire(refs.size() * rb);
  auto* dst = static_cast<std::byte*>(buffer->data());
  auto copy = [&](std::size_t i) {
    std::memcpy(dst + i * rb, store_->record(refs[i].record()).data(), rb);
  };
  if (store_->stable_records()) {
    // Shuffled records are DRAM misses taken one at a time; asking for the record a few
    // ahead overlaps them (bench/RESULTS.md: about +25% on W1).
    constexpr std::size_t kAhead = 4;
    constexpr std::size_t kLine = 64;
    auto prefetch = [&](std::size_t i) {
      const std::byte* p = store_->record(refs[i].record()).data();
      // Large records stream sequentially; the hardware prefetcher takes it from there.
      for (std::size_t off = 0; off < std::min<std::size_t>(rb, 4096); off += kLine)
        __builtin_prefetch(p + off);
    };
    for (std::size_t i = 0; i < std::min(kAhead, refs.size()); ++i) prefetch(i);
    for (std::size_t i = 0; i < refs.size(); ++i) {
      if (i + kAhead < refs.size()) prefetch(i + kAhead);
      copy(i);
    }
  } else {
    // A read may download its block, and its bytes last until this thread's next read: one
    // read a record, in order. (Reading ahead to prefetch, then again to copy, read each
    // block twice, and let a cache planned for one read evict it between the two.)
    for (std::size_t i = 0; i < refs.size(); ++i) copy(i);
  }
  Batch batch;
  batch.fields.set(store_->record_field(), Tensor(std::move(buffer), 0, DType::kUInt8,
                                                  Shape{static_cast<std::int64_t>(refs.size()),
                                                        static_cast<std::int64_t>(rb)}));
  batch.info = std::move(plan.info);
  batch.stamp = std::move(plan.stamp);
  return batch;
}

CollateMode BatchAssembler::mode_of(FieldId id, const Tensor& proto) const {
  if (options_.collate == CollateMode::kStack || proto.shape().rank() == 0)
    return CollateMode::kStack;
  if (options_.fields.empty()) return options_.collate;
  for (const auto& f : options_.fields)
    if (f == field_name(id)) return options_.collate;
  return CollateMode::kStack;
}

namespace {

/// Writes `value` into n elements of dtype `t` at `dst`.
void fill_value(std::byte* dst, std::size_t n, DType t, double value) {
  visit_dtype(t, [&]<class T>() {
    const T v = static_cast<T>(value);
    for (std::size_t i = 0; i < n; ++i) std::memcpy(dst + i * sizeof(T), &v, sizeof(T));
  });
}

}  // namespace

Batch BatchAssembler::collate(BatchPlan& plan, std::vector<Sample>& samples,
                              BatchSlots* slots) const {
  Batch batch;
  const auto b = static_cast<std::int64_t>(samples.size());
  const std::uint64_t step = plan.info.step;
  if (!samples.empty()) {
    const Sample& first = samples.front();
    for (const auto& [id, proto] : first) {
      const CollateMode mode = mode_of(id, proto);
      // Every sample must have the field, with the first sample's dtype; stacking needs
      // equal shapes, padding and ragged need equal shapes after the first dimension.
      for (std::size_t i = 0; i < samples.size(); ++i) {
        const Tensor* t = samples[i].find(id);
        if (t == nullptr)
          throw DataError("", DataError::kNoOffset,
                          "field '" + std::string(field_name(id)) + "' is missing in sample " +
                              std::to_string(i) + " (record " + samples[i].ref.to_string() +
                              ") of step " + std::to_string(step));
        bool fits = t->dtype() == proto.dtype() && t->shape().rank() == proto.shape().rank();
        if (fits && mode == CollateMode::kStack) fits = t->shape() == proto.shape();
        for (std::size_t d = 1; fits && d < proto.shape().rank(); ++d)
          fits = t->shape()[d] == proto.shape()[d];
        if (!fits)
          throw DataError("", DataError::kNoOffset,
                          "field '" + std::string(field_name(id)) + "' is " +
                              std::string(dtype_name(proto.dtype())) + proto.shape().to_string() +
                              " in sample 0 but " + std::string(dtype_name(t->dtype())) +
                              t->shape().to_string() + " in sample " + std::to_string(i) +
                              " of step " + std::to_string(step) +
                              (mode == CollateMode::kStack
                                   ? ": stacking needs equal shapes"
                                   : ": padding and ragged collation need the same dtype and "
                                     "equal shapes after the first dimension"));
      }
      if (mode == CollateMode::kStack) {
        if (slots != nullptr) {
          Tensor adopted = slots->adopt(id, samples);
          if (adopted.defined()) {
            batch.fields.set(id, std::move(adopted));
            continue;
          }
        }
        std::size_t bytes = proto.nbytes();
        auto buffer = pool_->acquire(bytes * samples.size());
        auto* dst = static_cast<std::byte*>(buffer->data());
        for (std::size_t i = 0; i < samples.size(); ++i)
          if (bytes > 0) std::memcpy(dst + i * bytes, samples[i].find(id)->data(), bytes);
        batch.fields.set(id, Tensor(std::move(buffer), 0, proto.dtype(), proto.shape().prepend(b)));
        continue;
      }
      // One "row" is everything after the first dimension.
      std::int64_t row_elems = 1;
      for (std::size_t d = 1; d < proto.shape().rank(); ++d) row_elems *= proto.shape()[d];
      const std::size_t row_bytes = static_cast<std::size_t>(row_elems) * dtype_size(proto.dtype());
      std::int64_t max_len = 0, total = 0;
      for (const auto& s : samples) {
        max_len = std::max(max_len, s.find(id)->shape()[0]);
        total += s.find(id)->shape()[0];
      }
      const std::string name(field_name(id));
      if (mode == CollateMode::kPad) {
        Shape shape = proto.shape();
        shape[0] = max_len;
        const std::size_t stride = static_cast<std::size_t>(max_len) * row_bytes;
        auto buffer = pool_->acquire(stride * samples.size());
        auto* dst = static_cast<std::byte*>(buffer->data());
        Tensor lengths(DType::kInt64, Shape{b});
        auto len = lengths.values<std::int64_t>();
        for (std::size_t i = 0; i < samples.size(); ++i) {
          const Tensor& t = *samples[i].find(id);
          const std::size_t used = t.nbytes();
          if (used > 0) std::memcpy(dst + i * stride, t.data(), used);
          fill_value(dst + i * stride + used, (stride - used) / dtype_size(proto.dtype()),
                     proto.dtype(), options_.pad_value);
          len[i] = t.shape()[0];
        }
        batch.fields.set(id, Tensor(std::move(buffer), 0, proto.dtype(), shape.prepend(b)));
        batch.fields.set(name + "_length", std::move(lengths));
      } else {
        Shape shape = proto.shape();
        shape[0] = total;
        auto buffer = pool_->acquire(static_cast<std::size_t>(total) * row_bytes);
        auto* dst = static_cast<std::byte*>(buffer->data());
        Tensor offsets(DType::kInt64, Shape{b + 1});
        auto off = offsets.values<std::int64_t>();
        off[0] = 0;
        std::size_t at = 0;
        for (std::size_t i = 0; i < samples.size(); ++i) {
          const Tensor& t = *samples[i].find(id);
          if (t.nbytes() > 0) std::memcpy(dst + at, t.data(), t.nbytes());
          at += t.nbytes();
          off[i + 1] = off[i] + t.shape()[0];
        }
        batch.fields.set(id, Tensor(std::move(buffer), 0, proto.dtype(), shape));
        batch.fields.set(name + "_offsets", std::move(offsets));
      }
    }
    for (std::size_t i = 1; i < samples.size(); ++i) {
      if (samples[i].size() != first.size())
        throw DataError("", DataError::kNoOffset,
                        "sample " + std::to_string(i) + " of step " + std::to_string(step) +
                            " has " + std::to_string(samples[i].size()) + " fields, sample 0 has " +
                            std::to_string(first.size()));
      if (samples[i].user.has_value() != first.user.has_value())
        throw DataError("", DataError::kNoOffset,
                        "sample " + std::to_string(i) + " of step " + std::to_string(step) +
                            (first.user.has_value() ? " has no user value, sample 0 has one"
                                                    : " has a user value, sample 0 has none"));
    }
    if (first.user.has_value()) {
      if (options_.user_collate) {
        options_.user_collate(samples, batch);
      } else {
        std::vector<UserValue> values;
        values.reserve(samples.size());
        for (auto& s : samples) values.push_back(std::move(s.user));
        batch.user = UserValue::make(std::move(values));
      }
    }
  }
  batch.info = std::move(plan.info);
  batch.stamp = std::move(plan.stamp);
  return batch;
}

}  // namespace flowstate
