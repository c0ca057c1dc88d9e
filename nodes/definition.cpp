#include "flowstate/nodes/definition.h"

#include <cstdio>

namespace flowstate {
namespace {

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned char>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

}  // namespace

JsonObject& JsonObject::add_raw(const std::string& key, const std::string& json) {
  text_ += (text_.size() > 1 ? "," : "") + quote(key) + ":" + json;
  return *this;
}
JsonObject& JsonObject::add(const std::string& key, std::uint64_t v) {
  return add_raw(key, std::to_string(v));
}
JsonObject& JsonObject::add(const std::string& key, bool v) {
  return add_raw(key, v ? "true" : "false");
}
JsonObject& JsonObject::add(const std::string& key, const std::string& v) {
  return add_raw(key, quote(v));
}

void SourceSpec::validate() const {
  if (!factory) throw ConfigError("", "a source needs a factory");
}

const NodeDef& source_node() {
  static const NodeDef def = define_node<SourceSpec>(
      {.type = "source", .phase = Phase::kSource, .doc = "a source made in C++"},
      [](BuildContext& ctx, const SourceSpec& spec) {
        SourceParts parts = spec.factory(ctx.name(), ctx.source_id());
        ctx.add_store(std::move(parts.node), parts.store);
        if (spec.user_collate) ctx.set_user_collate(spec.user_collate);
      });
  return def;
}

}  // namespace flowstate
