#include "flowstate/nodes/shard.h"

#include <charconv>
#include <cstdlib>
#include <cstring>

#include "flowstate/core/error.h"
#include "flowstate/core/rng.h"

namespace flowstate {
namespace {

std::optional<std::uint64_t> env_uint(std::initializer_list<const char*> names) {
  for (const char* n : names) {
    const char* v = std::getenv(n);
    if (v == nullptr || *v == '\0') continue;
    std::uint64_t x = 0;
    auto [p, ec] = std::from_chars(v, v + std::strlen(v), x);
    if (ec != std::errc() || *p != '\0')
      throw ConfigError(
          std::string("shard (environment ") + n + ")",
          std::string("environment variable ") + n + "='" + v + "' is not a non-negative integer");
    return x;
  }
  return std::nullopt;
}

}  // namespace

ShardMode parse_shard_mode(std::string_view s) {
  return parse_enum<ShardMode>(s, "shard.mode", "shard mode");
}

const NodeDef& shard_node() {
  static const NodeDef def = define_node<ShardOptions>(
      {.type = "shard",
       .phase = Phase::kSpine,
       .doc = "splits the records across ranks; every record goes to exactly one rank per epoch"},
      [](BuildContext& ctx, const ShardOptions& o) {
        ctx.add(std::make_unique<ShardNode>(ctx.name(), o));
      },
      inspect_fields<CursorState>);
  return def;
}

ShardOptions ShardOptions::resolved() const {
  ShardOptions r = *this;
  if (!r.rank) r.rank = env_uint({"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}).value_or(0);
  if (!r.world)
    r.world = env_uint({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"}).value_or(1);
  if (*r.world == 0) throw ConfigError("shard.world", "world must be greater than zero");
  if (*r.rank >= *r.world)
    throw ConfigError("shard.rank", "rank " + std::to_string(*r.rank) +
                                        " is out of range for world " + std::to_string(*r.world));
  return r;
}

ShardNode::ShardNode(std::string name, ShardOptions options) : StatefulSpineNode(std::move(name)) {
  ShardOptions r = options.resolved();
  rank_ = *r.rank;
  world_ = *r.world;
  mode_ = r.mode;
}

void ShardNode::connect(SpineNode* upstream) {
  require_indexed(*this, upstream);
  upstream_ = upstream;
}

std::uint64_t ShardNode::size(std::uint64_t epoch) const {
  std::uint64_t n = upstream_->size(epoch);
  if (mode_ == ShardMode::kInterleave) return n > rank_ ? (n - rank_ + world_ - 1) / world_ : 0;
  // contiguous: [n·r/w, n·(r+1)/w), computed without overflow.
  auto bound = [&](std::uint64_t r) {
    return static_cast<std::uint64_t>(static_cast<Uint128>(n) * r / world_);
  };
  return bound(rank_ + 1) - bound(rank_);
}

Ref ShardNode::at(std::uint64_t epoch, std::uint64_t i) const {
  if (mode_ == ShardMode::kInterleave) return upstream_->at(epoch, rank_ + i * world_);
  std::uint64_t n = upstream_->size(epoch);
  auto begin = static_cast<std::uint64_t>(static_cast<Uint128>(n) * rank_ / world_);
  return upstream_->at(epoch, begin + i);
}

std::size_t ShardNode::pull(std::span<Ref> out) {
  std::uint64_t n = size(state_.epoch);
  std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(out.size(), n - state_.cursor));
  for (std::size_t j = 0; j < k; ++j) out[j] = at(state_.epoch, state_.cursor + j);
  state_.cursor += k;
  return k;
}

void ShardNode::validate(const CursorState& s) const {
  if (s.cursor > size(s.epoch))
    throw CheckpointError(name(), "shard cursor " + std::to_string(s.cursor) +
                                      " is past this rank's " + std::to_string(size(s.epoch)) +
                                      " records");
}

}  // namespace flowstate
