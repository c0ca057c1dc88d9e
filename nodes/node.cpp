#include "nodes/node.h"

#include <charconv>

#include "core/error.h"

namespace flowstate {

std::string format_double(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

std::string NodeDescription::to_string(bool with_free) const {
  std::string s = type + "(";
  bool first = true;
  for (const auto& p : params) {
    if (p.free && !with_free) continue;
    s += (first ? "" : ", ") + p.key + "=" + p.value;
    first = false;
  }
  return s + ")";
}

Ref SpineNode::at(std::uint64_t, std::uint64_t) const {
  throw Error("node '" + name_ + "' does not support random access");
}

void require_indexed(const SpineNode& self, const SpineNode* upstream) {
  if (upstream == nullptr)
    throw ConfigError(self.name(), "'" + self.name() + "' needs a source before it");
  if (!upstream->indexed())
    throw ConfigError(self.name(), "'" + self.name() + "' needs a random-access upstream, but '" +
                                       upstream->name() +
                                       "' is not one; place it directly after the source, "
                                       "shard or a global shuffle");
}

}  // namespace flowstate
