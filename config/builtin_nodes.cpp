// The registration list: every built-in node type, by its definition. A node's YAML form, if
// it has one of its own (map, filter, mix), is part of its definition (NodeDef::yaml), in its
// file pair under nodes/.
#include "flowstate/config/registry.h"
#include "flowstate/nodes/builtin.h"

namespace flowstate {

void register_builtin_nodes(Registry& registry) {
  registry.add(records_node());
  registry.add(lines_node());
  registry.add(tar_node());
  registry.add(indexed_node());
  registry.add(shard_node());
  registry.add(shuffle_node());
  registry.add(mix_node());
  registry.add(map_node());
  registry.add(filter_node());
  registry.add(tokenize_node());
  registry.add(decode_image_node());
  registry.add(pack_node());
  registry.add(batch_node());
  registry.add(prefetch_node());
  registry.add(device_copy_node());
  registry.add(iterable_node());
}

}  // namespace flowstate
