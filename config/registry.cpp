#include "flowstate/config/registry.h"

#include <mutex>
#include <stdexcept>

#include "flowstate/config/transforms.h"
#include "flowstate/config/yaml.h"
#include "flowstate/core/error.h"

namespace flowstate {
namespace {

/// A node's YAML form's view of the loader: the caller's registries and the node's context.
class FormContext final : public YamlContext {
 public:
  FormContext(const TransformRegistry& transforms, NodeContext* node = nullptr)
      : transforms_(transforms), node_(node) {}

  const Params& params() const override { return node().params; }
  const std::filesystem::path& base_dir() const override { return node().base_dir; }
  bool after_batch() const override { return node().after_batch; }
  const TransformSchema* transform(const std::string& name) const override {
    return transforms_.find(name);
  }
  std::vector<std::string> transform_names() const override { return transforms_.names(); }
  const PredicateSchema* predicate(const std::string& name) const override {
    return transforms_.find_predicate(name);
  }
  std::vector<std::string> predicate_names() const override {
    return transforms_.predicate_names();
  }
  std::vector<std::string> read_inputs(const std::vector<std::filesystem::path>& files) override {
    for (const auto& f : files)
      inputs_.push_back(from_yaml_file(
          f.string(),
          {.registry = node().registry, .transforms = &transforms_, .mix_input = true}));
    return Pipeline::Builder::describe_inputs(inputs_);
  }
  void add(const NodeDef& def, std::any options) override {
    node().builder.add(def, std::move(options), std::move(inputs_));
    inputs_.clear();
  }

 private:
  NodeContext& node() const {
    if (node_ == nullptr) throw Error("a YAML form asked for its node outside of reading one");
    return *node_;
  }
  const TransformRegistry& transforms_;
  NodeContext* node_;
  std::vector<Pipeline> inputs_;
};

}  // namespace

// ---- Registry ----

void Registry::add(NodeSchema schema) {
  if (schema.type.empty()) throw std::invalid_argument("Registry::add: a node type needs a name");
  if (find(schema.type) != nullptr)
    throw std::invalid_argument("Registry::add: node type '" + schema.type +
                                "' is already registered");
  if (!schema.add && schema.def == nullptr)
    throw std::invalid_argument("Registry::add: node type '" + schema.type +
                                "' has no build function");
  nodes_.push_back(std::move(schema));
}

const NodeSchema* Registry::find(std::string_view type) const {
  for (const auto& n : nodes_)
    if (n.type == type) return &n;
  return nullptr;
}

std::vector<std::string> Registry::names(bool sources) const {
  std::vector<std::string> out;
  for (const auto& n : nodes_)
    if (n.source == sources && n.add) out.push_back(n.type);
  return out;
}

Registry Registry::with_builtins() {
  Registry r;
  register_builtin_nodes(r);
  return r;
}

const Registry& Registry::builtin() {
  static const Registry r = with_builtins();
  return r;
}

void Registry::add(const NodeDef& def, std::string origin) {
  NodeSchema n;
  n.type = def.type;
  n.doc = def.doc;
  n.source = def.phase == Phase::kSource;
  n.params = def.params;
  n.def = &def;
  n.origin = std::move(origin);
  if (def.yaml) {
    const YamlForm& form = *def.yaml;
    if (!form.doc.empty()) n.doc = form.doc;
    n.params = form.params;
    n.dispatch = form.dispatch;
    n.dispatch_what = form.dispatch_what;
    if (form.extra_params)
      n.extra_params = [&form](const TransformRegistry& t, const std::string& v) {
        return form.extra_params(FormContext(t), v);
      };
    if (form.dispatch_choices)
      n.dispatch_choices = [&form](const TransformRegistry& t) {
        return form.dispatch_choices(FormContext(t));
      };
    n.add = [&form](NodeContext& ctx) {
      FormContext c(ctx.transforms, &ctx);
      form.read(c);
    };
  } else if (def.from_params) {
    n.add = [&def](NodeContext& ctx) {
      ctx.builder.add(def, def.from_params(ctx.params, ctx.base_dir));
    };
  }
  add(std::move(n));
}

Registry& Registry::global() {
  static Registry r = with_builtins();
  return r;
}

const std::vector<ParamSchema>& pipeline_params() {
  static const std::vector<ParamSchema> params = {
      {.name = "seed",
       .type = ParamType::kUInt,
       .default_value = std::uint64_t{0},
       .doc = "the pipeline seed; shuffles and map generators derive from it"},
      {.name = "workers",
       .type = ParamType::kUInt,
       .default_value = std::uint64_t{2},
       .doc = "parallel workers reading, mapping and collating batches; auto: tuned while "
              "running; inline: no thread, batches made on the consumer's thread when it asks "
              "(cheap ones up to 8 at a time; no hand-off between threads)",
       .min = 1,
       .max = 1024,
       .free = true,
       .auto_value = true,
       .inline_value = true},
      {.name = "epochs",
       .type = ParamType::kUInt,
       .default_value = std::uint64_t{1},
       .doc = "epochs to run; 0 runs until stopped"},
  };
  return params;
}

const std::vector<ParamSchema>& checkpoint_params() {
  static const std::vector<ParamSchema> params = {
      {.name = "dir",
       .type = ParamType::kString,
       .doc = "directory of the step-N checkpoints; relative to the YAML file",
       .required = true,
       .check = [](const ParamValue& v) -> std::string {
         return std::get<std::string>(v).empty() ? "must not be empty" : "";
       }},
      {.name = "every_steps",
       .type = ParamType::kUInt,
       .default_value = std::uint64_t{0},
       .doc = "write a checkpoint after each batch whose (step + 1) is a multiple; 0: only at "
              "the end of a run and on SIGTERM/SIGINT"},
      {.name = "keep",
       .type = ParamType::kUInt,
       .default_value = std::uint64_t{0},
       .doc = "newest checkpoints to keep; 0 keeps all"},
  };
  return params;
}

}  // namespace flowstate
