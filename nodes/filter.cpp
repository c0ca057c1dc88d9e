#include "flowstate/nodes/filter.h"

#include "flowstate/core/error.h"

namespace flowstate {

void FilterOptions::validate() const {
  if (!fn) throw ConfigError("", "filter needs a predicate");
}

const NodeDef& filter_node() {
  static const NodeDef def = define_node<FilterOptions>(
      {.type = "filter",
       .phase = Phase::kPerSample,
       .doc = "drops samples a predicate rejects; batches stay full and resume stays exact"},
      [](BuildContext& ctx, const FilterOptions& o) {
        const SampleReader* reader = ctx.reader();
        // Without maps before it, the filter sees the store's records: a view is the sample.
        const bool direct = reads_store_unmapped(reader, ctx.store());
        ctx.add(std::make_unique<FilterNode>(ctx.name(), o.fn, ctx.key(), reader, ctx.store(),
                                             ctx.parallel_for(),
                                             direct ? o.by_length : std::nullopt));
      },
      inspect_fields<FilterState>);
  return def;
}

NodeDescription FilterOptions::describe() const {
  NodeDescription d{"filter", {{"fn", name}}};
  for (const auto& p : params) d.params.push_back(p);
  return d;
}

FilterNode::FilterNode(std::string name, FilterFn fn, std::uint64_t key, const SampleReader* reader,
                       const RecordStore* store, ParallelFor parallel,
                       std::optional<LengthRule> by_length)
    : StatefulSpineNode(std::move(name)),
      fn_(std::move(fn)),
      parallel_(std::move(parallel)),
      key_(key),
      reader_(reader),
      store_(store),
      by_length_(by_length) {
  if (!fn_) throw ConfigError(this->name(), "filter needs a predicate");
}

std::uint64_t FilterNode::size(std::uint64_t epoch) const {
  // An empty epoch stays empty; otherwise nobody knows before the predicate ran.
  return upstream_->size(epoch) == 0 ? 0 : kUnknownSize;
}

void FilterNode::start_epoch(std::uint64_t epoch) {
  upstream_->start_epoch(epoch);
  state_.epoch = epoch;
  state_.dropped = 0;
}

std::size_t FilterNode::pull(std::span<Ref> out) {
  std::size_t n = 0;
  while (n < out.size()) {
    // Exactly the shortfall: every Ref pulled is decided now, none waits in this node.
    const std::size_t want = out.size() - n;
    chunk_.resize(want);
    const std::size_t got = upstream_->pull(chunk_);
    keep_.assign(got, 0);
    auto decide = [&](std::size_t i) {
      if (by_length_) {
        if (auto v = store_->view(chunk_[i], by_length_->field)) {
          const auto n = static_cast<double>(v->bytes.size() / dtype_size(v->dtype));
          keep_[i] = n >= by_length_->min && n <= by_length_->max ? 1 : 0;
          return;
        }
      }
      Sample s;
      try {
        reader_->read(chunk_[i], state_.epoch, s);
      } catch (...) {
        rethrow_with_node(std::current_exception(), name());
      }
      MapContext ctx{state_.epoch,
                     ElementRng(key_, element_stream(state_.epoch, chunk_[i].record()))};
      try {
        keep_[i] = fn_(s, ctx) ? 1 : 0;
      } catch (...) {
        rethrow_with_node(std::current_exception(), name());
      }
    };
    // Lengths from views cost a few loads each: not worth a parallel loop.
    const bool cheap =
        by_length_ && got > 0 && store_->view(chunk_[0], by_length_->field).has_value();
    if (got < 16 || !parallel_ || cheap) {
      for (std::size_t i = 0; i < got; ++i) decide(i);
    } else {
      parallel_(got, decide);
    }
    dropped_.clear();
    for (std::size_t i = 0; i < got; ++i) {
      if (keep_[i] != 0)
        out[n++] = chunk_[i];
      else
        dropped_.push_back(chunk_[i]);
    }
    state_.dropped += dropped_.size();
    if (store_ != nullptr && !dropped_.empty()) store_->release(dropped_);
    if (got < want) break;  // the upstream's epoch ended
  }
  return n;
}

}  // namespace flowstate
