#include "flowstate/nodes/filter.h"

#include <cmath>
#include <cstring>

#include "flowstate/core/error.h"

namespace flowstate {
namespace {

/// A 1-D view of a field's values as doubles (the first element of a scalar).
double first_value(const Tensor& t, const std::string& field) {
  if (t.numel() == 0) throw DataError("", DataError::kNoOffset, "field '" + field + "' is empty");
  return visit_dtype(t.dtype(), [&]<class T>() {
    T v;
    std::memcpy(&v, t.data(), sizeof(T));
    return static_cast<double>(v);
  });
}

/// `length` and `value`: a field's first dimension (or first element) in [min, max].
struct RangeOptions {
  std::optional<std::string> field;
  std::optional<double> min;
  std::optional<double> max;
  static constexpr auto table() {
    return std::tuple{param("field", &RangeOptions::field, {.doc = "the field"}),
                      param("min", &RangeOptions::min, {.doc = "inclusive lower bound"}),
                      param("max", &RangeOptions::max, {.doc = "inclusive upper bound"})};
  }
};

/// `keep_fraction`: a seeded coin per sample and epoch.
struct KeepFractionOptions {
  std::optional<double> fraction;
  static constexpr auto table() {
    return std::tuple{param("fraction", &KeepFractionOptions::fraction,
                            {.min = 0, .max = 1, .doc = "the share of samples kept"})};
  }
  void validate() const {
    if (!fraction) throw ConfigError("fraction", "keep_fraction needs a fraction");
  }
};

/// The predicate `fn` (length or value) with range options `o`.
Predicate range_predicate(const std::string& fn, const RangeOptions& o) {
  if (!o.field) throw ConfigError("field", fn + " needs a field");
  if (!o.min && !o.max) throw ConfigError("min", fn + " needs min or max");
  const std::string field = *o.field;
  const double lo = o.min.value_or(-HUGE_VAL);
  const double hi = o.max.value_or(HUGE_VAL);
  const FieldId id = field_id(field);
  const bool length = fn == "length";
  Predicate out;
  if (length) out.by_length = LengthRule{.field = id, .min = lo, .max = hi};
  out.fn = [=](const Sample& s, MapContext&) {
    const Tensor* t = s.find(id);
    if (t == nullptr)
      throw DataError("", DataError::kNoOffset,
                      "record " + s.ref.to_string() + " has no field '" + field + "'");
    const double v = length ? (t->shape().rank() == 0 ? 1.0 : static_cast<double>(t->shape()[0]))
                            : first_value(*t, field);
    return v >= lo && v <= hi;
  };
  return out;
}

/// `- filter: {fn: NAME, ...}`: `fn` names a predicate of the caller's registry, whose
/// parameters go beside it.
std::shared_ptr<const YamlForm> filter_yaml() {
  auto f = std::make_shared<YamlForm>();
  f->doc = "drops samples a named predicate rejects; batches stay full and resume stays exact";
  f->params = {{.name = "fn",
                .type = ParamType::kString,
                .doc = "the predicate (see the predicates below); its parameters go beside fn",
                .required = true}};
  f->dispatch = "fn";
  f->dispatch_what = "predicate";
  f->extra_params = [](const YamlContext& ctx,
                       const std::string& fn) -> const std::vector<ParamSchema>* {
    const PredicateSchema* s = ctx.predicate(fn);
    return s != nullptr ? &s->params : nullptr;
  };
  f->dispatch_choices = [](const YamlContext& ctx) { return ctx.predicate_names(); };
  f->read = [](YamlContext& ctx) {
    const Params& p = ctx.params();
    const std::string& fn = p.string("fn");
    const PredicateSchema* s = ctx.predicate(fn);
    if (s == nullptr) throw ConfigError("fn", "unknown predicate '" + fn + "'");
    Predicate made = s->make(p);
    ctx.add(filter_node(), FilterOptions{.name = fn,
                                         .params = p.describe(s->params),
                                         .fn = std::move(made.fn),
                                         .by_length = made.by_length});
  };
  return f;
}

}  // namespace

void FilterOptions::validate() const {
  if (!fn) throw ConfigError("", "filter needs a predicate");
}

const NodeDef& filter_node() {
  static const NodeDef def = [] {
    NodeDef d = define_node<FilterOptions>(
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
    d.yaml = filter_yaml();
    return d;
  }();
  return def;
}

std::vector<PredicateSchema> builtin_predicates() {
  return {define_predicate<RangeOptions>(
              "length", "the field's first dimension in [min, max] (decided from an index alone)",
              [](const RangeOptions& o, const Params&) { return range_predicate("length", o); }),
          define_predicate<RangeOptions>(
              "value", "the field's first element in [min, max]",
              [](const RangeOptions& o, const Params&) { return range_predicate("value", o); }),
          define_predicate<KeepFractionOptions>(
              "keep_fraction", "a seeded coin per sample and epoch: keeps a fraction of them",
              [](const KeepFractionOptions& o, const Params&) {
                const double f = *o.fraction;
                return Predicate{.fn = [f](const Sample&, MapContext& c) {
                  return static_cast<double>(c.rng() >> 11) * 0x1p-53 < f;
                }};
              })};
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

namespace {
/// The largest window of decisions made ahead (the first ones after a start are 16).
constexpr std::size_t kFilterReadAhead = 256;
/// Fewer reads than this are not worth a parallel loop.
constexpr std::size_t kParallelMin = 16;

/// Runs `one(i)` for every i < n: in parallel, unless there are few or each is `cheap` (a
/// length from a view costs a few loads: not worth a parallel loop).
void for_each_decision(const ParallelFor& parallel, bool cheap, std::size_t n,
                       const std::function<void(std::size_t)>& one) {
  if (n < kParallelMin || !parallel || cheap) {
    for (std::size_t i = 0; i < n; ++i) one(i);
  } else {
    parallel(n, one);
  }
}
}  // namespace

void FilterNode::start_epoch(std::uint64_t epoch) {
  upstream_->start_epoch(epoch);
  state_ = FilterState{.epoch = epoch};
  clear_window();
}

void FilterNode::clear_window() {
  window_.clear();
  window_size_ = 0;
}

bool FilterNode::decide(const Ref& ref) {
  if (by_length_) {
    if (auto v = store_->view(ref, by_length_->field)) {
      const auto n = static_cast<double>(v->bytes.size() / dtype_size(v->dtype));
      return n >= by_length_->min && n <= by_length_->max;
    }
  }
  Sample s;
  try {
    reader_->read(ref, state_.epoch, s);
  } catch (...) {
    rethrow_with_node(std::current_exception(), name());
  }
  MapContext ctx{state_.epoch, ElementRng(key_, element_stream(state_.epoch, ref.record()))};
  bool keep = false;
  try {
    keep = fn_(s, ctx);
  } catch (...) {
    rethrow_with_node(std::current_exception(), name());
  }
  // What it keeps, a filter or pack after it reads next: they start from this sample.
  if (keep) reader_->pass_on(ref, state_.epoch, std::move(s));
  return keep;
}

bool FilterNode::windowed() {
  return !window_off_ && parallel_ && state_.consumed != kUnknownSize && upstream_->indexed();
}

bool FilterNode::extend_window(std::size_t max) {
  const std::uint64_t begin = state_.consumed + window_.size();
  const std::uint64_t size = upstream_->size(state_.epoch);
  if (begin >= size) return false;
  window_size_ = std::min(std::max<std::size_t>(window_size_ * 2, kParallelMin), max);
  const std::size_t n =
      static_cast<std::size_t>(std::min<std::uint64_t>(window_size_, size - begin));
  const std::size_t first = window_.size();
  window_.resize(first + n);
  for (std::size_t i = 0; i < n; ++i)
    window_[first + i].ref = upstream_->at(state_.epoch, begin + i);
  auto one = [&](std::size_t i) {
    Decided& d = window_[first + i];
    try {
      d.keep = decide(d.ref) ? 1 : 0;
    } catch (...) {
      d.error = std::current_exception();  // thrown if and when the filter pulls this Ref
    }
  };
  // (A gone position — a file removed mid-epoch, SpineNode::positions — has no view: it is
  // decided as an error the filter never pulls.)
  for_each_decision(parallel_,
                    by_length_ && !window_[first].ref.is_gone() &&
                        store_->view(window_[first].ref, by_length_->field).has_value(),
                    n, one);
  return true;
}

std::size_t FilterNode::upcoming(std::span<Ref> out) {
  if (!windowed()) return 0;
  std::size_t n = 0, i = 0;
  while (n < out.size()) {
    if (i == window_.size() && !extend_window(kFilterReadAhead)) break;
    const Decided& d = window_[i++];
    if (d.error) break;  // nothing is known past an error
    if (d.keep != 0) out[n++] = d.ref;
  }
  return n;
}

std::size_t FilterNode::pull_windowed(std::span<Ref> out) {
  // Take decisions from the window until `out` is full (the Ref that fills it is the last one
  // consumed, as when deciding what is pulled), then pull exactly those from the upstream.
  std::size_t n = 0, used = 0;
  while (n < out.size()) {
    if (used == window_.size() && !extend_window(kFilterReadAhead)) break;
    const Decided& d = window_[used++];
    if (d.keep != 0 || d.error) ++n;  // an error stops here: it is thrown below, in order
    if (d.error) break;
  }
  if (used == 0) return 0;  // the upstream's epoch has ended
  chunk_.resize(used);
  const std::size_t got = upstream_->pull(chunk_);
  n = 0;
  dropped_.clear();
  for (std::size_t i = 0; i < got; ++i) {
    const Decided& d = window_[i];
    // A Ref other than the window's: the upstream's at() and pull() disagree; decide what is
    // pulled from here on.
    if (!(d.ref == chunk_[i])) window_off_ = true;
    bool keep = false;
    if (window_off_) {
      keep = decide(chunk_[i]);
    } else {
      if (d.error) std::rethrow_exception(d.error);
      keep = d.keep != 0;
    }
    if (keep)
      out[n++] = chunk_[i];
    else
      dropped_.push_back(chunk_[i]);
  }
  window_.erase(window_.begin(), window_.begin() + static_cast<std::ptrdiff_t>(used));
  if (window_off_) clear_window();
  state_.consumed += got;
  state_.dropped += dropped_.size();
  if (store_ != nullptr && !dropped_.empty()) store_->release(dropped_);
  return n;
}

std::size_t FilterNode::pull(std::span<Ref> out) {
  if (windowed()) return pull_windowed(out);
  std::size_t n = 0;
  while (n < out.size()) {
    // Exactly the shortfall: every Ref pulled is decided now, none waits in this node.
    const std::size_t want = out.size() - n;
    chunk_.resize(want);
    const std::size_t got = upstream_->pull(chunk_);
    keep_.assign(got, 0);
    auto one = [&](std::size_t i) { keep_[i] = decide(chunk_[i]) ? 1 : 0; };
    for_each_decision(
        parallel_, by_length_ && got > 0 && store_->view(chunk_[0], by_length_->field).has_value(),
        got, one);
    dropped_.clear();
    for (std::size_t i = 0; i < got; ++i) {
      if (keep_[i] != 0)
        out[n++] = chunk_[i];
      else
        dropped_.push_back(chunk_[i]);
    }
    if (state_.consumed != kUnknownSize) state_.consumed += got;
    state_.dropped += dropped_.size();
    if (store_ != nullptr && !dropped_.empty()) store_->release(dropped_);
    if (got < want) break;  // the upstream's epoch ended
  }
  return n;
}

}  // namespace flowstate
