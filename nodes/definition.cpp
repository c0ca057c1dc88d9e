#include "flowstate/nodes/definition.h"

#include <cstdio>

namespace flowstate {
namespace {

/// The length of the well-formed UTF-8 sequence at s[i], or 0 when the byte there starts none.
std::size_t utf8_length(const std::string& s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  std::size_t n = c < 0x80           ? 1
                  : (c >> 5) == 0x6  ? 2
                  : (c >> 4) == 0xE  ? 3
                  : (c >> 3) == 0x1E ? 4
                                     : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k)
    if ((b(k) & 0xC0) != 0x80) return 0;
  // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8.
  if ((n == 2 && c < 0xC2) || (n == 3 && c == 0xE0 && b(1) < 0xA0) ||
      (n == 3 && c == 0xED && b(1) >= 0xA0) || (n == 4 && c == 0xF0 && b(1) < 0x90) ||
      (n == 4 && (c > 0xF4 || (c == 0xF4 && b(1) >= 0x90))))
    return 0;
  return n;
}

/// `s` as a JSON string. A byte that is not part of well-formed UTF-8 (a file name in another
/// encoding) becomes U+FFFD, the replacement character, as nlohmann::json's dump does with
/// error_handler_t::replace: the text stays valid JSON.
std::string quote(const std::string& s) {
  std::string out = "\"";
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (static_cast<unsigned char>(c) >= 0x80) {
      const std::size_t n = utf8_length(s, i);
      if (n == 0) {
        out += "\\ufffd";
      } else {
        out.append(s, i, n);
        i += n - 1;
      }
      continue;
    }
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
  if (text_.size() > 1) text_ += ',';
  text_ += quote(key);
  text_ += ':';
  text_ += json;
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
