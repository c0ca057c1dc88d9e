#include "nodes/map.h"

namespace flowstate {

NodeDescription MapOptions::describe() const {
  NodeDescription d{"map", {{"fn", name}}};
  for (const auto& p : params) d.params.push_back(p);
  if (workers) d.params.push_back({"workers", std::to_string(*workers), true});
  return d;
}

NodeDescription PrefetchOptions::describe() const {
  return {"prefetch", {{"depth", std::to_string(depth), true}}};
}

}  // namespace flowstate
