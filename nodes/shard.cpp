#include "flowstate/nodes/shard.h"

#include <algorithm>

#include "flowstate/core/error.h"
#include "flowstate/core/launcher.h"
#include "flowstate/core/rng.h"

namespace flowstate {

ShardMode parse_shard_mode(std::string_view s) {
  return parse_enum<ShardMode>(s, "shard.mode", "shard mode");
}

const NodeDef& shard_node() {
  static const NodeDef def = define_node<ShardOptions>(
      {.type = "shard",
       .phase = Phase::kSpine,
       .doc = "splits the records (before batch) or each global batch (after batch) across "
              "ranks; every record goes to one rank per epoch",
       .splits_ranks = true,
       // Each rank's positions are cut from the epoch's positions (SpineNode::positions).
       .holds_upstream = UpstreamHold::kPositions},
      [](BuildContext& ctx, const ShardOptions& o) {
        if (o.after_batch) {
          const BatchSlice slice{.rank = *o.rank, .world = *o.world, .uneven = o.uneven};
          AssemblyStage stage;
          stage.plan = [slice](BatchInfo& info, const PlanStage::Context& c) {
            slice.apply(info, c);
          };
          ctx.add_stage(std::move(stage));
        } else {
          ctx.add(std::make_unique<ShardNode>(ctx.name(), o));
          // A shuffle after a per-rank shard is keyed by the rank (nodes/shuffle.cpp).
          ctx.set_attribute("rank", *o.rank);
        }
      },
      inspect_fields<CursorState>);
  return def;
}

std::vector<Ref> BatchSlice::cut(std::span<const Ref> refs) const {
  const std::uint64_t c = refs.size();
  std::uint64_t begin = 0, count = 0;
  std::vector<Ref> out;
  if (c % world == 0 || uneven != ShardUneven::kPad) {
    // Equal slices, or (allow) near-equal ones: [c·r/w, c·(r+1)/w). `drop` never sees a
    // short batch that does not divide (the pipeline refuses it without drop_last).
    begin = static_cast<std::uint64_t>(static_cast<Uint128>(c) * rank / world);
    count = static_cast<std::uint64_t>(static_cast<Uint128>(c) * (rank + 1) / world) - begin;
    out.assign(refs.begin() + static_cast<std::ptrdiff_t>(begin),
               refs.begin() + static_cast<std::ptrdiff_t>(begin + count));
    return out;
  }
  // pad: the batch continues with its own first samples up to a multiple of world.
  const std::uint64_t m = c / world + 1;
  out.reserve(m);
  for (std::uint64_t j = rank * m; j < (rank + 1) * m; ++j)
    out.push_back(j < c ? refs[j] : refs[(j - c) % c].as_pad());
  return out;
}

void BatchSlice::apply(BatchInfo& info, const PlanStage::Context& ctx) const {
  const bool short_batch = info.refs.size() < ctx.batch_size;
  std::vector<Ref> mine = cut(info.refs);
  // The records only other ranks read: a store that holds values for Refs in flight drops
  // them now; the assembler releases this rank's.
  std::vector<Ref> kept;
  for (const Ref& r : mine) kept.push_back(r.record());
  std::sort(kept.begin(), kept.end());
  std::vector<Ref> others;
  for (const Ref& r : info.refs)
    if (!std::binary_search(kept.begin(), kept.end(), r)) others.push_back(r);
  if (!others.empty()) ctx.release(others);
  info.refs = std::move(mine);
  info.num_samples = static_cast<std::uint32_t>(info.refs.size());
  info.remainder = short_batch ? info.num_samples : 0;
}

ShardOptions ShardOptions::resolved(const Position& where) const {
  ShardOptions r = *this;
  r.after_batch = where.after_batch;
  return r.resolved();
}

std::pair<Phase, Placement> ShardOptions::placement() const {
  // The elastic layout cuts what batch makes, before any batch map.
  if (after_batch)
    return {Phase::kPerBatch,
            {.directly_after_batch = true,
             .in_mix_input = false,
             .why = "it cuts each global batch into world slices"}};
  return {Phase::kSpine, {}};
}

void ShardOptions::check(std::span<const NodeSpec> nodes, std::size_t index) const {
  if (!after_batch) return;
  const auto* batch = nodes[index - 1].options_as<BatchOptions>();
  if (batch == nullptr) return;  // a batch node of one's own: it knows its sizes
  const std::string& name = nodes[index].name;
  if (batch->size % *world != 0)
    throw ConfigError(name + ".world", "'" + name + "' after batch cuts each global batch of " +
                                           std::to_string(batch->size) +
                                           " samples into world slices, but world " +
                                           std::to_string(*world) + " does not divide " +
                                           std::to_string(batch->size) + " (batch.size)");
  if (uneven == ShardUneven::kDrop && !batch->drop_last)
    throw ConfigError(name + ".uneven",
                      "'" + name +
                          "' after batch with uneven: drop needs batch.drop_last: true (a "
                          "short last global batch cannot be cut equally without repeating "
                          "samples; use uneven: pad to repeat them)");
}

void ShardOptions::check_launch(const std::string& node, std::uint64_t r, std::uint64_t w) const {
  if (*world != w || *rank != r)
    throw ConfigError(node, "'" + node + "' is rank " + std::to_string(*rank) + " of " +
                                std::to_string(*world) + ", but the launcher started rank " +
                                std::to_string(r) + " of " + std::to_string(w));
}

ShardOptions ShardOptions::resolved() const {
  ShardOptions r = *this;
  if (!r.rank || !r.world) {
    const LaunchEnv env = launch_env("shard");
    if (!r.rank) r.rank = env.rank.value_or(0);
    if (!r.world) r.world = env.world.value_or(1);
  }
  if (*r.world == 0) throw ConfigError("shard.world", "world must be greater than zero");
  if (*r.rank >= *r.world)
    throw ConfigError("shard.rank", "rank " + std::to_string(*r.rank) +
                                        " is out of range for world " + std::to_string(*r.world));
  return r;
}

NodeDescription ShardOptions::describe() const {
  NodeDescription d{"shard", describe_fields(*this)};
  // The elastic layout's state is the global stream's: any rank of any world may resume it.
  if (after_batch)
    for (auto& p : d.params)
      if (p.key == "rank" || p.key == "world") p.free = true;
  return d;
}

std::vector<std::string> ShardOptions::warnings() const {
  if (after_batch || uneven != ShardUneven::kAllow) return {};
  return {
      "uneven: allow lets ranks take different numbers of steps when the records do not "
      "divide by world; a data-parallel job then waits forever in its next collective "
      "(use pad or drop)"};
}

std::uint64_t shard_size(std::uint64_t n, std::uint64_t rank, std::uint64_t world, ShardMode mode,
                         ShardUneven uneven) {
  switch (uneven) {
    case ShardUneven::kPad:
      return n / world + (n % world != 0 ? 1 : 0);
    case ShardUneven::kDrop:
      return n / world;
    case ShardUneven::kAllow:
      break;
  }
  if (mode == ShardMode::kInterleave) return n > rank ? (n - rank + world - 1) / world : 0;
  // contiguous: [n·r/w, n·(r+1)/w), computed without overflow.
  auto bound = [&](std::uint64_t r) {
    return static_cast<std::uint64_t>(static_cast<Uint128>(n) * r / world);
  };
  return bound(rank + 1) - bound(rank);
}

ShardNode::ShardNode(std::string name, ShardOptions options) : StatefulSpineNode(std::move(name)) {
  ShardOptions r = options.resolved();
  rank_ = *r.rank;
  world_ = *r.world;
  mode_ = r.mode;
  uneven_ = r.uneven;
}

void ShardNode::connect(SpineNode* upstream) {
  require_indexed(*this, upstream);
  upstream_ = upstream;
}

std::uint64_t ShardNode::size(std::uint64_t epoch) const {
  const std::uint64_t n = upstream_->positions(epoch);
  // Gone positions (files removed mid-epoch) are skipped: how many of this rank's lie ahead is
  // not counted.
  if (n != upstream_->size(epoch)) return kUnknownSize;
  return shard_size(n, rank_, world_, mode_, uneven_);
}

std::uint64_t ShardNode::positions(std::uint64_t epoch) const {
  // Each rank's positions are the same function of the upstream's in every case: ranks stay
  // disjoint when some of them are gone.
  return shard_size(upstream_->positions(epoch), rank_, world_, mode_, uneven_);
}

void ShardNode::start_epoch(std::uint64_t epoch) {
  upstream_->start_epoch(epoch);  // as GlobalShuffleNode::start_epoch
  state_ = {epoch, 0};
}

Ref ShardNode::at(std::uint64_t epoch, std::uint64_t i) const {
  const std::uint64_t n = upstream_->positions(epoch);
  if (uneven_ == ShardUneven::kAllow && mode_ == ShardMode::kContiguous) {
    auto begin = static_cast<std::uint64_t>(static_cast<Uint128>(n) * rank_ / world_);
    return upstream_->at(epoch, begin + i);
  }
  // Position j of the epoch's order, extended past its end (pad) by the order's start again:
  // what DistributedSampler and accelerate's even_batches do.
  const std::uint64_t per_rank = shard_size(n, rank_, world_, mode_, uneven_);
  const std::uint64_t j =
      mode_ == ShardMode::kInterleave ? rank_ + i * world_ : rank_ * per_rank + i;
  if (j < n) return upstream_->at(epoch, j);
  return upstream_->at(epoch, (j - n) % n).as_pad();
}

std::size_t ShardNode::pull(std::span<Ref> out) {
  const bool gaps = upstream_->positions(state_.epoch) != upstream_->size(state_.epoch);
  return pull_positions(out, state_.cursor, positions(state_.epoch), gaps,
                        [&](std::uint64_t first, std::span<Ref> refs) {
                          for (std::size_t j = 0; j < refs.size(); ++j)
                            refs[j] = at(state_.epoch, first + j);
                        });
}

void ShardNode::validate(const CursorState& s) const {
  if (s.cursor > positions(s.epoch))
    throw CheckpointError(name(), "shard cursor " + std::to_string(s.cursor) +
                                      " is past this rank's " + std::to_string(positions(s.epoch)) +
                                      " records");
}

}  // namespace flowstate
