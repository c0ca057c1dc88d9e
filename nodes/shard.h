// `shard`: splits the data across ranks (DESIGN.md §7), in one of two layouts.
//
// Per rank (shard before batch): every rank draws its own records from the source.
// `interleave` gives rank r the positions r, r+world, r+2·world, ...; `contiguous` gives it the
// r-th of `world` equal ranges. `uneven` decides what happens when the count does not divide
// by world: `pad` (default) repeats records from the start of the epoch's order so that every
// rank takes the same number of steps (the repeats are marked, Ref::is_pad), `drop` leaves out
// the epoch's last records, `allow` lets ranks differ by one record (and so, maybe, by a step).
// A shuffle after it is keyed by the rank, so ranks shuffle independently.
//
// Elastic (shard after batch): the pipeline makes one global stream of batches of `size`, the
// same on every rank, and rank r takes the r-th of `world` contiguous slices of each. The state
// then does not depend on rank or world (both are free): a checkpoint of 4 ranks resumes on 2.
#pragma once

#include <optional>

#include "flowstate/nodes/definition.h"
#include "flowstate/nodes/node.h"

namespace flowstate {

enum class ShardMode : std::uint8_t { kInterleave, kContiguous };
template <>
struct EnumNames<ShardMode> {
  static constexpr std::array<std::pair<ShardMode, const char*>, 2> values{
      {{ShardMode::kInterleave, "interleave"}, {ShardMode::kContiguous, "contiguous"}}};
};

/// What `shard` does when the data does not divide by world.
enum class ShardUneven : std::uint8_t { kPad, kDrop, kAllow };
template <>
struct EnumNames<ShardUneven> {
  static constexpr std::array<std::pair<ShardUneven, const char*>, 3> values{
      {{ShardUneven::kPad, "pad"}, {ShardUneven::kDrop, "drop"}, {ShardUneven::kAllow, "allow"}}};
};

/// How the elastic layout cuts a global batch: rank `rank` of `world` takes a contiguous slice.
struct BatchSlice {
  std::uint64_t rank = 0;
  std::uint64_t world = 1;
  ShardUneven uneven = ShardUneven::kPad;
  /// Rank's share of a global batch `refs` (a full one, or the epoch's short last one):
  /// size / world contiguous samples. A short batch that does not divide by world is padded
  /// with its own first samples (pad, marked) or split into near-equal slices (allow).
  std::vector<Ref> cut(std::span<const Ref> refs) const;
  /// Cuts a planned global batch to this rank's slice and releases the Refs only other ranks
  /// read: the elastic layout's plan stage (nodes/assembly.h).
  void apply(BatchInfo& info, const PlanStage::Context& ctx) const;
};

/// Options of the `shard` node.
struct ShardOptions {
  /// This process's rank; default: the launcher's (core/launcher.h), else 0.
  std::optional<std::uint64_t> rank;
  /// Number of ranks; default: the launcher's (core/launcher.h), else 1.
  std::optional<std::uint64_t> world;
  ShardMode mode = ShardMode::kInterleave;  ///< interleave or contiguous
  ShardUneven uneven = ShardUneven::kPad;   ///< pad, drop or allow
  /// Not a parameter: set when the node is added after `batch` (the elastic layout, see
  /// resolved(Position)), which makes rank and world free.
  bool after_batch = false;

  /// Fills rank and world from the launcher's environment where unset; validates.
  ShardOptions resolved() const;
  /// resolved(), in the elastic layout when added after batch.
  ShardOptions resolved(const Position& where) const;
  /// Before batch: a spine node, before any map; after it: right after batch.
  std::pair<Phase, Placement> placement() const;
  /// After batch: world divides the batch size, and uneven: drop needs batch.drop_last.
  void check(std::span<const NodeSpec> nodes, std::size_t index) const;
  /// The per-rank layout's rank and world are the launcher's.
  void check_launch(const std::string& node, std::uint64_t rank, std::uint64_t world) const;
  /// Checks rank < world, reading the launcher's environment for what is unset.
  void validate() const { (void)resolved(); }
  /// The table's description, with rank and world free in the elastic layout.
  NodeDescription describe() const;
  /// `uneven: allow` in the per-rank layout: ranks may take different numbers of steps.
  std::vector<std::string> warnings() const;

  static constexpr auto table() {
    using O = ShardOptions;
    return std::tuple{
        param("rank", &O::rank,
              {.min = 0,
               .doc = "this process's rank, < world",
               .default_doc = "RANK, OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID, else 0",
               .text = [](const O& o) { return std::to_string(*o.resolved().rank); }}),
        param("world", &O::world,
              {.min = 1,
               .doc = "number of ranks",
               .default_doc = "WORLD_SIZE, OMPI_COMM_WORLD_SIZE, PMI_SIZE or SLURM_NTASKS, else 1",
               .text = [](const O& o) { return std::to_string(*o.resolved().world); }}),
        param("mode", &O::mode,
              {.doc = "interleave (rank r gets r, r+world, ...) or contiguous (the r-th range)"}),
        param("uneven", &O::uneven,
              {.doc = "when the records (or a short last global batch) do not divide by world: "
                      "pad (repeat records, marked :pad, so every rank takes the same steps), "
                      "drop (leave the remainder out) or allow (ranks may differ by a step)"}),
    };
  }
};

/// The `shard` node's definition.
const NodeDef& shard_node();

ShardMode parse_shard_mode(std::string_view s);

/// The records one rank takes per epoch out of `n` (the per-rank layout).
std::uint64_t shard_size(std::uint64_t n, std::uint64_t rank, std::uint64_t world, ShardMode mode,
                         ShardUneven uneven);

/// The `shard` node. Needs a random-access upstream (a source).
class ShardNode final : public StatefulSpineNode<CursorState> {
 public:
  /// `options` resolved (rank and world set).
  ShardNode(std::string name, ShardOptions options);
  void connect(SpineNode* upstream) override;

  /// This rank's records; kUnknownSize in an epoch with gone positions (see positions()).
  std::uint64_t size(std::uint64_t epoch) const override;
  std::uint64_t positions(std::uint64_t epoch) const override;
  bool indexed() const override { return true; }
  Ref at(std::uint64_t epoch, std::uint64_t i) const override;
  void start_epoch(std::uint64_t epoch) override;
  std::size_t pull(std::span<Ref> out) override;

 protected:
  void validate(const CursorState& s) const override;

 private:
  std::uint64_t rank_;
  std::uint64_t world_;
  ShardMode mode_;
  ShardUneven uneven_;
};

}  // namespace flowstate
