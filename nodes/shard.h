// `shard`: splits a source across ranks (DESIGN.md §7). Every record goes to exactly one rank
// per epoch. `interleave` gives rank r the positions r, r+world, r+2·world, ...; `contiguous`
// gives it the r-th of `world` near-equal ranges. Ranks may differ by one record when the
// count does not divide evenly.
#pragma once

#include <optional>

#include "flowstate/nodes/definition.h"
#include "flowstate/nodes/node.h"
#include "flowstate/nodes/sources/file_source.h"

namespace flowstate {

enum class ShardMode : std::uint8_t { kInterleave, kContiguous };
template <>
struct EnumNames<ShardMode> {
  static constexpr std::array<std::pair<ShardMode, const char*>, 2> values{
      {{ShardMode::kInterleave, "interleave"}, {ShardMode::kContiguous, "contiguous"}}};
};

/// Options of the `shard` node.
struct ShardOptions {
  /// This process's rank; default: RANK, OMPI_COMM_WORLD_RANK or SLURM_PROCID, else 0.
  std::optional<std::uint64_t> rank;
  /// Number of ranks; default: WORLD_SIZE, OMPI_COMM_WORLD_SIZE or SLURM_NTASKS, else 1.
  std::optional<std::uint64_t> world;
  ShardMode mode = ShardMode::kInterleave;  ///< interleave or contiguous
  /// Fills rank and world from the launcher's environment where unset; validates.
  ShardOptions resolved() const;
  /// Checks rank < world, reading the launcher's environment for what is unset.
  void validate() const { (void)resolved(); }

  static constexpr auto table() {
    using O = ShardOptions;
    return std::tuple{
        param("rank", &O::rank,
              {.min = 0,
               .doc = "this process's rank, < world",
               .default_doc = "RANK, OMPI_COMM_WORLD_RANK or SLURM_PROCID, else 0",
               .text = [](const O& o) { return std::to_string(*o.resolved().rank); }}),
        param("world", &O::world,
              {.min = 1,
               .doc = "number of ranks",
               .default_doc = "WORLD_SIZE, OMPI_COMM_WORLD_SIZE or SLURM_NTASKS, else 1",
               .text = [](const O& o) { return std::to_string(*o.resolved().world); }}),
        param("mode", &O::mode,
              {.doc = "interleave (rank r gets r, r+world, ...) or contiguous (the r-th range)"}),
    };
  }
};

/// The `shard` node's definition.
const NodeDef& shard_node();

ShardMode parse_shard_mode(std::string_view s);

/// The `shard` node. Needs a random-access upstream (a source).
class ShardNode final : public StatefulSpineNode<CursorState> {
 public:
  ShardNode(std::string name, ShardOptions options);
  void connect(SpineNode* upstream) override;

  std::uint64_t size(std::uint64_t epoch) const override;
  bool indexed() const override { return true; }
  Ref at(std::uint64_t epoch, std::uint64_t i) const override;
  void start_epoch(std::uint64_t epoch) override { state_ = {epoch, 0}; }
  std::size_t pull(std::span<Ref> out) override;

 protected:
  void validate(const CursorState& s) const override;

 private:
  std::uint64_t rank_;
  std::uint64_t world_;
  ShardMode mode_;
};

}  // namespace flowstate
