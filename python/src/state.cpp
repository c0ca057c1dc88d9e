// What the package says about itself and about saved states: `__version__` (the project's one
// version, core/version.h), what a saved state holds (config/inspect.h's describe_state, the
// description `flowstate inspect` shows) and the parameters' machine-readable kinds, which the
// Python builder's signatures and the typed stubs (python/gen_stubs.py) are made from.
#include "binding.h"
#include "flowstate/config/inspect.h"
#include "flowstate/core/version.h"

using namespace flowstate;

namespace {

const char* kind_name(ParamType t) {
  switch (t) {
    case ParamType::kBool:
      return "bool";
    case ParamType::kUInt:
      return "uint";
    case ParamType::kInt:
      return "int";
    case ParamType::kFloat:
      return "float";
    case ParamType::kString:
      return "string";
    case ParamType::kStringList:
      return "string_list";
    case ParamType::kIntList:
      return "int_list";
    case ParamType::kMap:
      return "map";
  }
  return "unknown";
}

}  // namespace

namespace flowstate::python {

void bind_state(py::module_& m) {
  m.attr("__version__") = version();

  m.def(
      "describe_state",
      [](const py::bytes& state, const std::string& fields_json) {
        const std::string bytes = state;
        return describe_state(bytes,
                              {.kind = StateSource::Kind::kBytes, .fields_json = fields_json});
      },
      py::arg("state"), py::arg("fields_json") = "",
      "What `flowstate inspect` shows of a saved state (the bytes of Loader.state()), as JSON "
      "text; `fields_json`: a JSON object of a state_dict's other fields, shown as they are.");
  m.def(
      "render_state_description",
      [](const std::string& description) { return render_state_description(description); },
      py::arg("description"), "describe_state's JSON as the text `flowstate inspect` prints.");

  m.def(
      "param_kinds",
      [] {
        py::dict out;
        for (const NodeSchema& s : Registry::global().nodes()) {
          py::dict params;
          for (const ParamSchema& p : s.params) {
            py::dict d;
            d["kind"] = kind_name(p.type);
            d["auto"] = p.auto_value;
            d["inline"] = p.inline_value;
            if (p.type == ParamType::kMap) {
              py::dict fields;
              for (const ParamSchema& f : p.fields) fields[py::str(f.name)] = kind_name(f.type);
              d["fields"] = fields;
            }
            params[py::str(p.name)] = d;
          }
          out[py::str(s.type)] = params;
        }
        return out;
      },
      "Every node type's parameters: name -> {kind: bool|uint|int|float|string|string_list|"
      "int_list|map, auto: whether the word `auto` is accepted; a map's fields: name -> kind}.");
}

}  // namespace flowstate::python
