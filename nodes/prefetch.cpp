#include "flowstate/nodes/prefetch.h"

namespace flowstate {

const NodeDef& prefetch_node() {
  static const NodeDef def = define_node<PrefetchOptions>(
      {.type = "prefetch",
       .phase = Phase::kPerBatch,
       .doc = "how many batches may be prepared ahead of the consumer"},
      [](BuildContext& ctx, const PrefetchOptions& o) {
        AssemblyStage stage;
        stage.queue_depth = o.depth;
        ctx.add_stage(std::move(stage));
      });
  return def;
}

}  // namespace flowstate
