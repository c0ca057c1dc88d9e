// from_range: any C++ range, container or generator of a user type T as a pipeline source — the
// `iterable` source of DESIGN.md §9. Each element becomes one sample whose Sample::user holds
// its own copy of the element; map_value / filter_value work on it by type; the batch collates
// the values with Collate<T> into Batch::user, and device_copy moves that with ToDevice<C>
// (core/collate.h). Every batch still carries its BatchInfo.
//
// How a checkpoint resumes depends on what the source offers:
// - a random-access sized range (std::vector, std::array, std::deque, std::span, a class of
//   your own whose const begin()/end() are random-access, iota(0, n) | transform(f)) is
//   addressed by index: the state is a cursor, the resume O(1), and shard/shuffle may follow;
// - a producer made per epoch by from_producer(factory, ...), where `factory(epoch)` returns
//   an object with `std::optional<T> next()` (see ValueProducer), that also has
//   `std::string save() const` and `void load(std::string_view)` (ResumableProducer) resumes
//   exactly through them: the state is (epoch, cursor, save());
// - anything else — a std::list, a filtered view, a forward iterable of your own, a producer
//   without save/load — resumes by replaying its epoch from the start and skipping what was
//   consumed: up to one epoch of work. Pipeline::build says so once (Pipeline::warnings()).
// Forward sources run serially on the spine, hold each value until its batch is assembled
// (RecordStore::release), and have size kUnknownSize unless it is known (a sized range, or
// RangeOptions::size); the batch node then looks one batch ahead, so is_last_in_epoch is
// still known before a batch is handed out. They cannot be sharded, and only a `buffer`
// shuffle right after them shuffles them (StreamShuffleNode, nodes/shuffle.h; the others need
// random access).
//
//   struct Doc { std::string text; int label; };
//   std::vector<Doc> docs = load_docs();
//   Pipeline p = Pipeline::Builder()
//                    .source(from_range(docs, {.name = "docs-v3"}))
//                    .shuffle({})
//                    .map(map_value<Doc>([](Doc& d) { lower_case(d.text); }), {.name = "lower"})
//                    .batch({.size = 32})
//                    .build();
//   Loader loader(p);
//   for (const Batch& b : loader)
//     for (const Doc& d : batch_value<Doc>(b)) ...;  // Collate<Doc>::type: std::vector<Doc>
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ranges>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <cereal/types/string.hpp>

#include "flowstate/core/collate.h"
#include "flowstate/core/error.h"
#include "flowstate/core/tensor.h"
#include "flowstate/core/user_value.h"
#include "flowstate/nodes/assembly.h"
#include "flowstate/nodes/definition.h"
#include "flowstate/nodes/device_copy.h"
#include "flowstate/nodes/node.h"

namespace flowstate {

/// The definition behind the stamp entries of from_range sources (type "iterable"): made in
/// C++ only, so it has no YAML form; `flowstate inspect` reads their state through it.
const NodeDef& iterable_node();

/// Options of a from_range() / from_producer() source.
struct RangeOptions {
  /// Required. Names the data in the fingerprint, in messages and in warnings: a C++ range
  /// cannot be hashed, so give different data (or a changed version of it) a different name.
  std::string name;
  /// Elements per epoch of a producer or an unsized range, when known: each epoch is cut
  /// there (so an endless generator or iota(0) needs it), and an epoch that ends sooner is a
  /// DataError. Unset: unknown (the batch node looks one batch ahead). A sized range's own
  /// size is used; giving another one is a ConfigError.
  std::optional<std::uint64_t> size;
  /// Extra canonical parameters (a data path, a version) that belong in the fingerprint.
  std::vector<DescribedParam> params;
};

/// The checkpoint state of a from_range source.
struct IterableState {
  std::uint64_t epoch = 0;
  std::uint64_t cursor = 0;  ///< elements emitted in this epoch
  std::string position;      ///< a ResumableProducer's save() after `cursor` elements
  template <class Archive>
  void save(Archive& ar, std::uint32_t) const {
    ar(epoch, cursor, position);
  }
  template <class Archive>
  void load(Archive& ar, std::uint32_t version) {
    require_state_version("IterableState", version, 1);
    ar(epoch, cursor);
    load_bounded(ar, position);
  }
};

namespace detail {

template <class O>
concept Optional = IsOptional<std::remove_cvref_t<O>>::value;

}  // namespace detail

/// A producer of user values: `next()` returns the next value of the epoch, or nullopt at
/// its end (after which it is not called again in that epoch).
template <class P>
concept ValueProducer = std::movable<P> && requires(P& p) {
  { p.next() } -> detail::Optional;
};

/// A producer that can resume exactly: `save()` describes its position (called on the spine
/// once per planned batch, so keep it small: it is stored in every batch's stamp) and `load`
/// moves a fresh producer of the same epoch to a position save() described.
template <class P>
concept ResumableProducer = ValueProducer<P> && requires(const P& cp, P& p, std::string_view s) {
  { cp.save() } -> std::convertible_to<std::string>;
  p.load(s);
};

/// The value type of a producer: T of its `std::optional<T> next()`.
template <ValueProducer P>
using produced_t = typename std::remove_cvref_t<decltype(std::declval<P&>().next())>::value_type;

/// The UserCollateFn of Collate<T>: moves the samples' values (which must hold T) into a
/// std::vector<T>, stores Collate<T>::collate(...) in Batch::user, and sets
/// Batch::user_to_device to ToDevice<Collate<T>::type>. from_range() installs it for the
/// element type; after a map_value<T, U>, give it to batch: `.user_collate = collate_user<U>()`.
/// A sample holding another type is a DataError naming the sample, its record and both types.
template <class T>
UserCollateFn collate_user();

/// The collated user value of a batch whose samples held T: `const Collate<T>::type&`
/// (a std::vector<T>, or a Tensor for arithmetic T). Throws Error naming both types when the
/// batch holds something else, or nothing.
template <class T>
const typename Collate<T>::type& batch_value(const Batch& batch);

/// A source of the elements of `range` (see the file comment for the three ways it resumes).
/// An lvalue container is used by reference: it must outlive every Loader of the pipeline,
/// must not change while they run, and must allow concurrent const reads (workers read
/// elements in parallel). An rvalue is moved into the pipeline. A view is copied (a view of a
/// container still refers to that container). The element type must be copy-constructible:
/// every read hands a map its own copy. A single-pass range (an input range, a generator)
/// cannot be read twice: wrap it in from_producer(). Throws ConfigError (key `iterable.name`
/// / `iterable.size`) for a missing name or a size that contradicts the range's.
template <std::ranges::range R>
SourceSpec from_range(R&& range, RangeOptions options);

/// A source of the values `factory(epoch)`'s producer yields, one producer per epoch (see
/// ValueProducer, ResumableProducer). `factory` is called on the spine thread of each Loader,
/// so it must be safe to call from several threads when several Loaders run at once.
template <class F>
requires ValueProducer<std::invoke_result_t<F&, std::uint64_t>> SourceSpec
from_producer(F factory, RangeOptions options);

/// A per-sample map on the user value: `fn(T&)` or `fn(T&, MapContext&)`. Returning void, it
/// changes the value in place; returning a value, that value (converted to U) replaces it —
/// `map_value<Doc, Tokens>(tokenize)` changes the samples' type, and the batch then needs
/// `.user_collate = collate_user<Tokens>()`. A sample holding another type is an Error naming
/// the record and both types. `fn` runs on the parallel workers.
template <class T, class U = T, class Fn>
SampleFn map_value(Fn fn);

/// A filter predicate on the user value: `pred(const T&)` or `pred(const T&, MapContext&)`,
/// for Builder::filter. Same type check as map_value.
template <class T, class Pred>
std::function<bool(const Sample&, MapContext&)> filter_value(Pred pred);

// ---- implementation ----

namespace detail {

/// The user value of `s` as T, or an Error from `who` naming the record and both types.
template <class T, class S>
auto& user_as(S& s, const char* who) {
  if (!s.user.template holds<T>())
    throw Error(std::string(who) + "<" + type_name(typeid(T)) + ">: record " + s.ref.to_string() +
                " holds " +
                (s.user.has_value() ? "a user value of type " + type_name(s.user.type())
                                    : std::string("no user value")) +
                ", not " + type_name(typeid(T)));
  return s.user.template get<T>();
}

/// The message of a sample whose user value is not the collated type.
std::string collate_mismatch(std::size_t index, const Sample& s, const std::type_info& want);

/// Everything from_range's nodes share: the spine state and a RecordStore without bytes.
class IterableNodeBase : public StatefulSpineNode<IterableState>, public RecordStore {
 public:
  IterableNodeBase(std::string name, std::string label, std::uint32_t source_id);
  std::size_t record_bytes() const override { return 0; }
  /// Throws Error: the source holds user values, not bytes.
  std::span<const std::byte> record(const Ref& ref) const override;
  FieldId record_field() const override { return field_; }
  const std::string& label() const { return label_; }

 protected:
  std::string label_;  ///< RangeOptions::name
  std::uint32_t source_id_;
  FieldId field_;
};

/// A random-access sized range, addressed by index. `Held` is the range's type as held
/// (const when it came as a const lvalue).
template <class Held>
class IndexedRangeNode final : public IterableNodeBase {
 public:
  using T = std::ranges::range_value_t<const Held>;
  IndexedRangeNode(std::string name, std::string label, std::uint32_t source_id,
                   std::shared_ptr<Held> range, std::uint64_t described_size)
      : IterableNodeBase(std::move(name), std::move(label), source_id),
        range_(std::move(range)),
        size_(static_cast<std::uint64_t>(std::ranges::size(std::as_const(*range_)))) {
    if (size_ != described_size)
      throw ConfigError("iterable.size", "'" + label_ + "' held " + std::to_string(described_size) +
                                             " elements when the pipeline was built and holds " +
                                             std::to_string(size_) +
                                             " now: a range must not change while its pipeline "
                                             "is in use");
  }
  std::uint64_t size(std::uint64_t) const override { return size_; }
  bool indexed() const override { return true; }
  Ref at(std::uint64_t, std::uint64_t i) const override { return Ref{source_id_, 0, i}; }
  void start_epoch(std::uint64_t epoch) override { state_ = {epoch, 0, {}}; }
  std::size_t pull(std::span<Ref> out) override {
    const auto n =
        static_cast<std::size_t>(std::min<std::uint64_t>(out.size(), size_ - state_.cursor));
    for (std::size_t j = 0; j < n; ++j) out[j] = Ref{source_id_, 0, state_.cursor + j};
    state_.cursor += n;
    return n;
  }
  void read(const Ref& ref, Sample& sample) const override {
    if (ref.index >= size_)
      throw DataError(label_, DataError::kNoOffset,
                      "record " + std::to_string(ref.index) + " is out of range: '" + label_ +
                          "' holds " + std::to_string(size_) + " elements");
    const auto& range = std::as_const(*range_);
    auto i = static_cast<std::ranges::range_difference_t<const Held>>(ref.index);
    sample.ref = ref;
    sample.user = UserValue::make(T(std::ranges::begin(range)[i]));
  }

 protected:
  void validate(const IterableState& s) const override {
    if (s.cursor > size_)
      throw CheckpointError(name(), "'" + label_ + "' cursor " + std::to_string(s.cursor) +
                                        " is past its " + std::to_string(size_) + " elements");
  }

 private:
  std::shared_ptr<Held> range_;
  std::uint64_t size_;
};

/// A forward source: values are produced serially in pull() and held, keyed by (epoch, index),
/// until the pipeline releases their Refs. A Ref's shard is the epoch (its low 32 bits), so
/// the look-ahead into the next epoch never collides with values still in flight.
class StreamNodeBase : public IterableNodeBase {
 public:
  StreamNodeBase(std::string name, std::string label, std::uint32_t source_id,
                 std::optional<std::uint64_t> size);
  std::uint64_t size(std::uint64_t) const override { return size_.value_or(kUnknownSize); }
  void start_epoch(std::uint64_t epoch) override;
  std::size_t pull(std::span<Ref> out) override;
  /// Copies the held value (throws DataError when it was released, or was never produced).
  void read(const Ref& ref, Sample& sample) const override;
  void release(std::span<const Ref> refs) const override;
  bool rereadable() const override { return false; }
  /// Values held now (produced and not yet released).
  std::size_t held() const;

 protected:
  /// Starts a fresh pass over `epoch`'s values.
  virtual void open(std::uint64_t epoch) = 0;
  /// The next value of the pass, or nullopt at its end.
  virtual std::optional<UserValue> produce() = 0;
  /// Moves past one value without keeping it; false at the end.
  virtual bool advance() = 0;
  /// A copy of a held value for one reader.
  virtual UserValue copy_value(const UserValue& v) const = 0;
  /// After a restore: positions a pass at state_ (epoch, cursor). The default replays: opens
  /// the epoch and advances `cursor` values.
  virtual void reposition();
  void on_restored() override;
  /// A pass is open and at state_.cursor.
  bool positioned_ = false;

 private:
  std::optional<std::uint64_t> size_;
  bool ended_ = false;  ///< the pass returned nullopt
  mutable std::mutex mu_;
  mutable std::map<std::pair<std::uint32_t, std::uint64_t>, UserValue> held_;
  std::vector<UserValue> produced_;  ///< pull()'s scratch (spine thread only)
};

/// A forward range, replayed on resume. `Held` as for IndexedRangeNode.
template <class Held>
class ReplayRangeNode final : public StreamNodeBase {
  // Iterated as const where the range allows it (containers), else as is (views that cache).
  using Iterated = std::conditional_t<std::ranges::forward_range<const Held>, const Held, Held>;
  using T = std::ranges::range_value_t<Iterated>;

 public:
  ReplayRangeNode(std::string name, std::string label, std::uint32_t source_id,
                  std::shared_ptr<Held> range, std::optional<std::uint64_t> size)
      : StreamNodeBase(std::move(name), std::move(label), source_id, size),
        range_(std::move(range)) {}

 protected:
  void open(std::uint64_t) override {
    Iterated& r = *range_;
    it_.emplace(std::ranges::begin(r));
    end_.emplace(std::ranges::end(r));
  }
  std::optional<UserValue> produce() override {
    if (*it_ == *end_) return std::nullopt;
    UserValue v = UserValue::make(T(**it_));
    ++*it_;
    return v;
  }
  bool advance() override {
    if (*it_ == *end_) return false;
    ++*it_;
    return true;
  }
  UserValue copy_value(const UserValue& v) const override { return UserValue::make(T(v.get<T>())); }

 private:
  std::shared_ptr<Held> range_;
  std::optional<std::ranges::iterator_t<Iterated>> it_;
  std::optional<std::ranges::sentinel_t<Iterated>> end_;
};

/// A producer made per epoch by a factory; resumes through save/load when it has them.
template <class F>
class ProducerNode final : public StreamNodeBase {
  using P = std::remove_cvref_t<std::invoke_result_t<F&, std::uint64_t>>;
  using T = produced_t<P>;

 public:
  ProducerNode(std::string name, std::string label, std::uint32_t source_id,
               std::shared_ptr<F> factory, std::optional<std::uint64_t> size)
      : StreamNodeBase(std::move(name), std::move(label), source_id, size),
        factory_(std::move(factory)) {}

 protected:
  void complete_snapshot(IterableState& s) const override {
    if constexpr (ResumableProducer<P>) {
      if (producer_ && positioned_) s.position = std::string(producer_->save());
    }
  }
  void open(std::uint64_t epoch) override {
    producer_.reset();
    producer_.emplace(std::invoke(*factory_, epoch));
  }
  std::optional<UserValue> produce() override {
    auto v = producer_->next();
    if (!v) return std::nullopt;
    return UserValue::make(T(std::move(*v)));
  }
  bool advance() override { return producer_->next().has_value(); }
  UserValue copy_value(const UserValue& v) const override { return UserValue::make(T(v.get<T>())); }
  void reposition() override {
    if constexpr (ResumableProducer<P>) {
      open(state_.epoch);
      // At the epoch's start a fresh producer is the position (a state cut before the first
      // pull holds none).
      if (state_.cursor > 0) producer_->load(std::string_view(state_.position));
      positioned_ = true;
    } else {
      StreamNodeBase::reposition();
    }
  }
  void on_restored() override {
    StreamNodeBase::on_restored();
    // load() is cheap, so a bad position shows up now, in load_state/restore, rather than
    // at the first batch; a replay waits until a batch needs it (an epoch boundary needs
    // none).
    if constexpr (ResumableProducer<P>) {
      try {
        reposition();
      } catch (const Error&) {
        throw;
      } catch (const std::exception& e) {
        throw CheckpointError(name(),
                              "'" + label_ + "' could not load its saved position: " + e.what());
      }
    }
  }

 private:
  std::shared_ptr<F> factory_;
  std::optional<P> producer_;
};

/// The canonical description of an iterable source.
NodeDescription describe_iterable(const RangeOptions& options, std::string_view resume,
                                  std::optional<std::uint64_t> size);
/// Throws ConfigError when the options name no source.
void require_name(const RangeOptions& options);
/// The warning of a source that resumes by replaying ("range" or "producer").
std::string replay_warning(const RangeOptions& options, std::string_view what);

template <class Node, class Held, class... Args>
SourceFactory node_factory(std::string label, std::shared_ptr<Held> held, bool copy_per_loader,
                           Args... args) {
  return [label = std::move(label), held = std::move(held), copy_per_loader, args...](
             const std::string& name, std::uint32_t source_id) {
    // A view may cache (filter_view) or hold iterators: each Loader iterates its own copy.
    std::shared_ptr<Held> mine = held;
    if constexpr (std::copy_constructible<Held>) {
      if (copy_per_loader) mine = std::make_shared<Held>(*held);
    }
    auto node = std::make_unique<Node>(name, label, source_id, std::move(mine), args...);
    const RecordStore* store = node.get();
    return SourceParts{std::move(node), store};
  };
}

}  // namespace detail

template <class T>
UserCollateFn collate_user() {
  return [](std::vector<Sample>& samples, Batch& batch) {
    using C = typename Collate<T>::type;
    std::vector<T> values;
    values.reserve(samples.size());
    for (std::size_t i = 0; i < samples.size(); ++i) {
      if (!samples[i].user.template holds<T>())
        throw DataError("", DataError::kNoOffset,
                        detail::collate_mismatch(i, samples[i], typeid(T)));
      values.push_back(std::move(samples[i].user.template get<T>()));
    }
    batch.user = UserValue::make<C>(Collate<T>::collate(std::move(values)));
    batch.user_to_device = [](UserValue& v, DeviceCopy& copy) {
      ToDevice<C>::to_device(v.template get<C>(), copy);
    };
  };
}

template <class T>
const typename Collate<T>::type& batch_value(const Batch& batch) {
  using C = typename Collate<T>::type;
  if (!batch.user.holds<C>())
    throw Error("batch_value<" + type_name(typeid(T)) + ">: the batch holds " +
                (batch.user.has_value() ? type_name(batch.user.type()) : std::string("nothing")) +
                ", not " + type_name(typeid(C)) + " (Collate<" + type_name(typeid(T)) + ">::type)");
  return batch.user.get<C>();
}

template <std::ranges::range R>
SourceSpec from_range(R&& range, RangeOptions options) {
  using Range = std::remove_cvref_t<R>;
  // A const lvalue stays const; anything moved in is the pipeline's own.
  using Held = std::conditional_t<std::is_lvalue_reference_v<R> &&
                                      std::is_const_v<std::remove_reference_t<R>>,
                                  const Range, Range>;
  constexpr bool kIndexed =
      std::ranges::random_access_range<const Held> && std::ranges::sized_range<const Held>;
  static_assert(kIndexed || std::ranges::forward_range<Held>,
                "from_range needs a forward (multi-pass) range to resume; wrap a single-pass "
                "range or generator in from_producer(factory, options)");
  using T = std::ranges::range_value_t<
      std::conditional_t<std::ranges::forward_range<const Held>, const Held, Held>>;
  static_assert(std::copy_constructible<T>,
                "from_range: the element type must be copy-constructible (each read hands a "
                "map its own copy)");
  detail::require_name(options);

  constexpr bool kView = std::ranges::view<Range> && std::copy_constructible<Range>;
  std::shared_ptr<Held> held;
  if constexpr (std::is_lvalue_reference_v<R> && !kView) {
    held = std::shared_ptr<Held>(std::shared_ptr<Held>{}, &range);  // borrowed, not owned
  } else {
    held = std::make_shared<Held>(std::forward<R>(range));
  }

  SourceSpec spec;
  spec.user_collate = collate_user<T>();
  if constexpr (kIndexed) {
    const auto n = static_cast<std::uint64_t>(std::ranges::size(std::as_const(*held)));
    if (options.size && *options.size != n)
      throw ConfigError("iterable.size", "'" + options.name + "' holds " + std::to_string(n) +
                                             " elements, but options.size says " +
                                             std::to_string(*options.size));
    spec.description = detail::describe_iterable(options, "index", n);
    spec.factory = detail::node_factory<detail::IndexedRangeNode<Held>>(options.name,
                                                                        std::move(held), kView, n);
  } else {
    std::optional<std::uint64_t> size = options.size;
    if constexpr (std::ranges::sized_range<const Held>) {
      const auto n = static_cast<std::uint64_t>(std::ranges::size(std::as_const(*held)));
      if (options.size && *options.size != n)
        throw ConfigError("iterable.size", "'" + options.name + "' holds " + std::to_string(n) +
                                               " elements, but options.size says " +
                                               std::to_string(*options.size));
      size = n;
    }
    spec.description = detail::describe_iterable(options, "replay", size);
    spec.warnings.push_back(detail::replay_warning(options, "forward-only range"));
    spec.factory = detail::node_factory<detail::ReplayRangeNode<Held>>(
        options.name, std::move(held), kView, size);
  }
  return spec;
}

template <class F>
requires ValueProducer<std::invoke_result_t<F&, std::uint64_t>> SourceSpec
from_producer(F factory, RangeOptions options) {
  using P = std::remove_cvref_t<std::invoke_result_t<F&, std::uint64_t>>;
  using T = produced_t<P>;
  static_assert(std::copy_constructible<T>,
                "from_producer: the value type must be copy-constructible (each read hands a "
                "map its own copy)");
  detail::require_name(options);
  SourceSpec spec;
  spec.user_collate = collate_user<T>();
  const bool resumable = ResumableProducer<P>;
  spec.description =
      detail::describe_iterable(options, resumable ? "save_load" : "replay", options.size);
  if (!resumable) spec.warnings.push_back(detail::replay_warning(options, "producer"));
  spec.factory = detail::node_factory<detail::ProducerNode<F>>(
      options.name, std::make_shared<F>(std::move(factory)), false, options.size);
  return spec;
}

template <class T, class U, class Fn>
SampleFn map_value(Fn fn) {
  constexpr bool kWithContext = std::is_invocable_v<const Fn&, T&, MapContext&>;
  static_assert(kWithContext || std::is_invocable_v<const Fn&, T&>,
                "map_value<T>(fn): fn must be callable as fn(T&) or fn(T&, MapContext&)");
  using Result =
      typename std::conditional_t<kWithContext, std::invoke_result<const Fn&, T&, MapContext&>,
                                  std::invoke_result<const Fn&, T&>>::type;
  static_assert(!std::is_void_v<Result> || std::is_same_v<T, U>,
                "map_value<T, U>(fn): fn returns void (an in-place change), so U must be T");
  static_assert(std::is_void_v<Result> || std::is_convertible_v<Result, U>,
                "map_value<T>(fn): fn returns a value that is not a T; name the new type: "
                "map_value<T, NewType>(fn)");
  return [fn = std::move(fn)](Sample& s, MapContext& ctx) {
    T& value = detail::user_as<T>(s, "map_value");
    auto call = [&]() -> decltype(auto) {
      if constexpr (kWithContext) {
        return fn(value, ctx);
      } else {
        return fn(value);
      }
    };
    if constexpr (std::is_void_v<Result>) {
      call();
    } else {
      s.user = UserValue::make<U>(U(call()));
    }
  };
}

template <class T, class Pred>
std::function<bool(const Sample&, MapContext&)> filter_value(Pred pred) {
  constexpr bool kWithContext = std::is_invocable_r_v<bool, const Pred&, const T&, MapContext&>;
  static_assert(kWithContext || std::is_invocable_r_v<bool, const Pred&, const T&>,
                "filter_value<T>(pred): pred must be callable as bool(const T&) or "
                "bool(const T&, MapContext&)");
  return [pred = std::move(pred)](const Sample& s, MapContext& ctx) -> bool {
    const T& value = detail::user_as<T>(s, "filter_value");
    if constexpr (kWithContext) {
      return pred(value, ctx);
    } else {
      return pred(value);
    }
  };
}

}  // namespace flowstate

CEREAL_CLASS_VERSION(flowstate::IterableState, 1);
