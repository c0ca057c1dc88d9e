// The plugin's entry point: what `flowstate --plugin libflowstate_example_nodes.so` and a YAML
// pipeline's `plugins: [libflowstate_example_nodes.so]` call once the library is loaded
// (config/plugins.h). Every node, transform and predicate the library brings is registered here,
// explicitly.
#include "examples/plugin/batch_stages.h"
#include "examples/plugin/functions.h"
#include "examples/plugin/take.h"
#include "flowstate/config/plugins.h"

extern "C" void flowstate_register_plugin(flowstate::PluginRegistry& r) {
  r.add(flowstate::examples::take_node());
  r.add(flowstate::examples::slice_node());
  r.add(flowstate::examples::checksum_node());
  r.add(flowstate::examples::xor_bytes_transform());
  r.add(flowstate::examples::byte_below_predicate());
}
