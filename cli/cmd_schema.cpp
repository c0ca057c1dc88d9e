// `flowstate schema`: the registered node types, map transforms and filter predicates with their
// parameters —
// documentation derived from the same schemas the YAML loader validates against.
#include "cli/command.h"
#include "flowstate/config/registry.h"
#include "flowstate/config/transforms.h"

namespace flowstate::cli {
namespace {

constexpr const char* kUsage =
    "usage: flowstate schema [NAME]   (flowstate --plugin PATH.so schema: with a plugin)\n\n"
    "Lists the top-level keys, every node type, every map transform and every filter\n"
    "predicate with its parameters (type, default, range, whether it is free or a data\n"
    "parameter, which a resume may continue over with --data-changed continue). With NAME,\n"
    "only that node type, transform or predicate. Nodes a plugin added (--plugin) are marked\n"
    "with the plugin's path.\n";

}  // namespace

int cmd_schema(std::span<const std::string> argv) {
  Args args(argv, {});
  if (args.help()) {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  if (args.positional().size() > 1) throw UsageError("expected at most one name");
  const std::string only = args.positional().empty() ? "" : args.positional()[0];
  const Registry& nodes = Registry::global();  // the built-ins and every loaded plugin's
  const TransformRegistry& transforms = TransformRegistry::global();
  std::string out;
  bool found = false;
  if (only.empty()) {
    out += "pipeline (top-level keys; also source, nodes):\n" +
           describe_params(pipeline_params(), "  ") + "\ncheckpoint:\n" +
           describe_params(checkpoint_params(), "  ") + "\n";
  }
  for (const auto& n : nodes.nodes()) {
    if (!only.empty() && n.type != only) continue;
    if (!n.add && only.empty()) continue;  // made in C++ only (from_range): not for YAML
    found = true;
    out += n.type + (n.source ? " (a source: `source: {type: " + n.type + ", ...}`)" : "") +
           (n.origin.empty() ? "" : " [plugin " + n.origin + "]") + ": " + n.doc + "\n" +
           describe_params(n.params, "  ") + "\n";
  }
  for (const auto& t : transforms.transforms()) {
    if (!only.empty() && t.name != only) continue;
    found = true;
    out += "map fn: " + t.name + (t.make_batch ? "" : " (before batch only)") + ": " + t.doc +
           "\n" + describe_params(t.params, "  ") + "\n";
  }
  for (const auto& p : transforms.predicates()) {
    if (!only.empty() && p.name != only) continue;
    found = true;
    out += "filter fn: " + p.name + ": " + p.doc + "\n" + describe_params(p.params, "  ") + "\n";
  }
  if (!only.empty() && !found)
    throw UsageError("no node type, transform or predicate named '" + only + "'");
  std::fputs(out.c_str(), stdout);
  return kExitOk;
}

}  // namespace flowstate::cli
