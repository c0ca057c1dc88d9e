// Plugins: shared libraries that add node types, map transforms and filter predicates to a
// running flowstate — what `flowstate --plugin PATH.so` and a YAML pipeline's top-level
// `plugins: [path, ...]` load. A plugin exports one C function that registers what it brings:
//
//   #include "flowstate/config/plugins.h"
//   extern "C" void flowstate_register_plugin(flowstate::PluginRegistry& r) {
//     r.add(take_node());                                 // a NodeDef (nodes/definition.h)
//     r.add(define_transform<ClipOptions>("clip", ...));  // a transform (nodes/transform.h)
//     r.add(define_predicate<EvenOptions>("even", ...));  // a predicate (nodes/transform.h)
//   }
//
// A plugin is built against the same flowstate as the program that loads it and resolves
// flowstate's symbols from that program (the `flowstate` command exports them), so its nodes
// share the program's field names, buffers and registries. Loaded libraries stay loaded.
#pragma once

#include <string>
#include <vector>

#include "flowstate/config/registry.h"
#include "flowstate/config/transforms.h"

namespace flowstate {

/// What a plugin's flowstate_register_plugin registers into.
struct PluginRegistry {
  Registry& nodes;
  TransformRegistry& transforms;
  std::string origin;  ///< the library's path, recorded with every node it adds

  /// Registers a node type by its definition (the definition must outlive the program: return
  /// a function-local static).
  void add(const NodeDef& def) { nodes.add(def, origin); }
  /// Registers a map transform (`- map: {fn: NAME}`).
  void add(TransformSchema t) { transforms.add(std::move(t)); }
  /// Registers a filter predicate (`- filter: {fn: NAME}`).
  void add(PredicateSchema p) { transforms.add(std::move(p)); }
};

/// The name of the function a plugin exports.
inline constexpr const char* kPluginEntryPoint = "flowstate_register_plugin";

/// Loads the plugin at `path` into Registry::global() and TransformRegistry::global(), once
/// per library (a second load of the same file does nothing). Throws ConfigError (key
/// `plugins`) naming the path when the library cannot be opened, exports no entry point, or
/// registers a node or transform whose name is taken.
void load_plugin(const std::string& path);

/// The libraries loaded so far, in load order.
std::vector<std::string> loaded_plugins();

}  // namespace flowstate
