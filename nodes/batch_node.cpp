// The definition of `batch`. Apart from batch.cpp because nodes/definition.h (BuildContext)
// needs batch.h's types, as device_copy_node.cpp is apart from device_copy.h.
#include "flowstate/nodes/batch.h"
#include "flowstate/nodes/definition.h"

namespace flowstate {

const NodeDef& batch_node() {
  static const NodeDef def = define_node<BatchOptions>(
      {.type = "batch",
       .phase = Phase::kBatch,
       .doc = "groups samples into batches, one contiguous [B, ...] tensor per field"},
      [](BuildContext& ctx, const BatchOptions& o) { ctx.set_batch(o); },
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
