#include "flowstate/nodes/sources/iterable.h"

#include <cstring>

namespace flowstate {

const NodeDef& iterable_node() {
  static const NodeDef def = [] {
    NodeDef d = source_node();
    d.type = "iterable";
    d.doc = "any C++ range or generator of a user type (from_range, from_producer; C++ only)";
    d.from_params = nullptr;
    d.inspect = [](InArchive& ar, const InspectContext&) {
      IterableState s;
      ar(s);
      return JsonObject()
          .add("epoch", s.epoch)
          .add("cursor", s.cursor)
          .add("producer_state_bytes", std::uint64_t{s.position.size()})
          .str();
    };
    return d;
  }();
  return def;
}

namespace detail {

std::string collate_mismatch(std::size_t index, const Sample& s, const std::type_info& want) {
  const std::string t = type_name(want);
  return "sample " + std::to_string(index) + " (record " + s.ref.to_string() + ") holds " +
         (s.user.has_value() ? "a user value of type " + type_name(s.user.type())
                             : std::string("no user value")) +
         ", but the batch collates " + t + " (Collate<" + t +
         ">); after a map_value that changes the type, give batch .user_collate = "
         "collate_user<NewType>()";
}

IterableNodeBase::IterableNodeBase(std::string name, std::string label, std::uint32_t source_id)
    : StatefulSpineNode(std::move(name)),
      label_(std::move(label)),
      source_id_(source_id),
      field_(field_id("value")) {}

std::span<const std::byte> IterableNodeBase::record(const Ref&) const {
  throw Error("'" + label_ + "' holds user values, not record bytes");
}

StreamNodeBase::StreamNodeBase(std::string name, std::string label, std::uint32_t source_id,
                               std::optional<std::uint64_t> size)
    : IterableNodeBase(std::move(name), std::move(label), source_id), size_(size) {}

void StreamNodeBase::start_epoch(std::uint64_t epoch) {
  state_ = {epoch, 0, {}};
  ended_ = false;
  positioned_ = false;
  try {
    open(epoch);
  } catch (...) {
    rethrow_with_node(std::current_exception(), name());
  }
  positioned_ = true;
}

std::size_t StreamNodeBase::pull(std::span<Ref> out) {
  std::size_t n = 0;
  // A known size cuts the epoch there: a restored cursor at the end needs no pass at all.
  auto at_size = [&] { return size_.has_value() && state_.cursor >= *size_; };
  try {
    if (at_size() || ended_) return 0;
    if (!positioned_) reposition();
    produced_.clear();
    while (n < out.size() && !at_size()) {
      std::optional<UserValue> v = produce();
      if (!v) {
        ended_ = true;
        break;
      }
      out[n++] = Ref{source_id_, static_cast<std::uint32_t>(state_.epoch), state_.cursor};
      produced_.push_back(std::move(*v));
      ++state_.cursor;
    }
    {
      // One lock per pull, not per value: workers read the table concurrently.
      std::lock_guard lock(mu_);
      for (std::size_t j = 0; j < n; ++j)
        held_.insert_or_assign({out[j].shard, out[j].index}, std::move(produced_[j]));
    }
    if (ended_ && size_.has_value() && state_.cursor < *size_)
      throw DataError(label_, DataError::kNoOffset,
                      "'" + label_ + "' ended after " + std::to_string(state_.cursor) +
                          " elements of epoch " + std::to_string(state_.epoch) +
                          ", but its size is " + std::to_string(*size_));
  } catch (...) {
    rethrow_with_node(std::current_exception(), name());
  }
  return n;
}

void StreamNodeBase::read(const Ref& ref, Sample& sample) const {
  UserValue v;
  {
    std::lock_guard lock(mu_);
    auto it = held_.find({ref.shard, ref.index});
    if (it != held_.end()) v = it->second;
  }
  if (!v.has_value())
    throw DataError(label_, DataError::kNoOffset,
                    "'" + label_ + "' holds no value for element " + std::to_string(ref.index) +
                        " of epoch " + std::to_string(ref.shard) +
                        ": it was released (its batch was assembled) or never produced");
  sample.ref = ref;
  sample.user = copy_value(v);  // outside the lock: a copy may be large
}

void StreamNodeBase::release(std::span<const Ref> refs) const {
  std::lock_guard lock(mu_);
  for (const Ref& r : refs) held_.erase({r.shard, r.index});
}

std::size_t StreamNodeBase::held() const {
  std::lock_guard lock(mu_);
  return held_.size();
}

void StreamNodeBase::reposition() {
  open(state_.epoch);
  for (std::uint64_t i = 0; i < state_.cursor; ++i) {
    if (!advance())
      throw CheckpointError(name(), "'" + label_ + "' ended after " + std::to_string(i) +
                                        " elements while replaying epoch " +
                                        std::to_string(state_.epoch) + " to element " +
                                        std::to_string(state_.cursor) +
                                        ": it yields fewer elements than when the state was "
                                        "saved");
  }
  positioned_ = true;
}

void StreamNodeBase::on_restored() {
  positioned_ = false;
  ended_ = false;
  std::lock_guard lock(mu_);
  held_.clear();
}

NodeDescription describe_iterable(const RangeOptions& options, std::string_view resume,
                                  std::optional<std::uint64_t> size) {
  NodeDescription d{"iterable", {{"name", options.name}, {"resume", std::string(resume)}}};
  if (size) d.params.push_back({"size", std::to_string(*size)});
  for (const auto& p : options.params) d.params.push_back(p);
  return d;
}

void require_name(const RangeOptions& options) {
  if (options.name.empty())
    throw ConfigError("iterable.name",
                      "from_range needs options.name: a C++ range cannot be hashed, so its name "
                      "stands for the data in the fingerprint");
}

std::string replay_warning(const RangeOptions& options, std::string_view what) {
  return "'" + options.name + "' is a " + std::string(what) +
         " without save/load: a resume replays up to one epoch from its start";
}

}  // namespace detail
}  // namespace flowstate
