#include "examples/plugin/batch_stages.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "flowstate/core/error.h"
#include "flowstate/nodes/assembly.h"

namespace flowstate::examples {

// ---- slice ----

std::pair<Phase, Placement> SliceOptions::placement() const {
  return {Phase::kPerBatch,
          {.directly_after_batch = true,
           .in_mix_input = false,
           .why = "it chooses which samples each batch reads"}};
}

void SliceOptions::check(std::span<const NodeSpec> nodes, std::size_t index) const {
  const auto* batch = nodes[index - 1].options_as<BatchOptions>();
  if (batch != nullptr && count > batch->size)
    throw ConfigError(nodes[index].name + ".count",
                      "'" + nodes[index].name + "' keeps " + std::to_string(count) +
                          " samples of every batch, but batches have " +
                          std::to_string(batch->size) + " (batch.size)");
}

const NodeDef& slice_node() {
  static const NodeDef def = define_node<SliceOptions>(
      {.type = "slice",
       .phase = Phase::kPerBatch,
       .doc = "keeps the first `count` samples of every batch (the rest are never read)"},
      [](BuildContext& ctx, const SliceOptions& o) {
        AssemblyStage stage;
        stage.plan = [count = o.count](BatchInfo& info, const PlanStage::Context& c) {
          if (info.refs.size() <= count) return;
          // The Refs left out are released: a store holding values for Refs in flight (pack,
          // a Python source) drops them now.
          c.release(std::span<const Ref>(info.refs).subspan(count));
          info.refs.resize(count);
          info.num_samples = static_cast<std::uint32_t>(count);
          info.remainder = 0;
        };
        ctx.add_stage(std::move(stage));
      });
  return def;
}

// ---- checksum ----

namespace {

/// Adds the batch's digest as a field: a deliver stage (serial, in step order).
class ChecksumStage final : public DeliverStage {
 public:
  explicit ChecksumStage(std::string field) : field_(std::move(field)) {}
  Batch deliver(Batch batch) override {
    const std::uint64_t digest = batch.digest();
    Tensor t(DType::kUInt64, Shape{1});
    std::memcpy(t.data(), &digest, sizeof(digest));
    batch.fields.set(field_, std::move(t));
    return batch;
  }

 private:
  std::string field_;
};

}  // namespace

const NodeDef& checksum_node() {
  static const NodeDef def = define_node<ChecksumOptions>(
      {.type = "checksum",
       .phase = Phase::kPerBatch,
       .doc = "adds a uint64 field holding every batch's digest, as the batch is handed out"},
      [](BuildContext& ctx, const ChecksumOptions& o) {
        AssemblyStage stage;
        stage.deliver = std::make_shared<ChecksumStage>(o.field);
        ctx.add_stage(std::move(stage));
      });
  return def;
}

}  // namespace flowstate::examples
