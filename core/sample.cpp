#include "flowstate/core/sample.h"

#include <deque>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace flowstate {
namespace {

struct Interner {
  std::shared_mutex mu;
  std::unordered_map<std::string, FieldId> ids;
  std::deque<std::string> names;  // deque: references stay valid as it grows
};

Interner& interner() {
  static Interner in;
  return in;
}

}  // namespace

FieldId field_id(std::string_view name) {
  Interner& in = interner();
  std::string key(name);
  {
    std::shared_lock lock(in.mu);
    auto it = in.ids.find(key);
    if (it != in.ids.end()) return it->second;
  }
  std::unique_lock lock(in.mu);
  auto [it, inserted] = in.ids.try_emplace(key, static_cast<FieldId>(in.names.size()));
  if (inserted) in.names.push_back(key);
  return it->second;
}

std::string_view field_name(FieldId id) {
  Interner& in = interner();
  std::shared_lock lock(in.mu);
  return in.names.at(id);
}

void Fields::set(FieldId id, Tensor t) {
  for (auto& [fid, tensor] : fields_) {
    if (fid == id) {
      tensor = std::move(t);
      return;
    }
  }
  fields_.emplace_back(id, std::move(t));
}

const Tensor* Fields::find(FieldId id) const {
  for (const auto& [fid, tensor] : fields_)
    if (fid == id) return &tensor;
  return nullptr;
}

const Tensor& Fields::at(FieldId id) const {
  if (const Tensor* t = find(id)) return *t;
  throw std::out_of_range("no field '" + std::string(field_name(id)) + "'");
}

const Tensor& Fields::at(std::string_view name) const { return at(field_id(name)); }

bool Fields::erase(std::string_view name) {
  FieldId id = field_id(name);
  for (auto it = fields_.begin(); it != fields_.end(); ++it) {
    if (it->first == id) {
      fields_.erase(it);
      return true;
    }
  }
  return false;
}

}  // namespace flowstate
