#include "flowstate/nodes/batch.h"

namespace flowstate {

void BatchOptions::validate() const {
  if (collate == CollateMode::kStack && (!fields.empty() || pad_value != 0))
    throw ConfigError(!fields.empty() ? "fields" : "pad_value",
                      "fields and pad_value apply to collate: pad or ragged");
}

const NodeDef& batch_node() {
  static const NodeDef def = define_node<BatchOptions>(
      {.type = "batch",
       .phase = Phase::kBatch,
       .doc = "groups samples into batches, one contiguous [B, ...] tensor per field",
       // The pipeline's one node of Phase::kBatch: the spine's last stateful node.
       .placement = {.in_mix_input = false},
       .yaml_example = "- batch: {size: 256}"},
      [](BuildContext& ctx, const BatchOptions& o) {
        ctx.add_stage({.planner = std::make_unique<BatchPlanner>(ctx.name(), o)});
      },
      [](InArchive& ar, const InspectContext&) {
        BatchState s;
        ar(s);
        return JsonObject()
            .add("epoch", s.epoch)
            .add("next_step", s.step)
            .add("next_index_in_epoch", s.index_in_epoch)
            .add("epoch_started", s.started)
            .str();
      });
  return def;
}

}  // namespace flowstate
