#include "core/state.h"

#include <sstream>

#include <cereal/types/string.hpp>

namespace flowstate {

std::string serialize_stamp(const StampData& stamp) {
  std::ostringstream os(std::ios::binary);
  {
    OutArchive ar(os);
    ar(static_cast<std::uint32_t>(stamp.snapshots.size()));
    for (std::size_t i = 0; i < stamp.snapshots.size(); ++i) {
      ar(stamp.node_names[i]);
      stamp.snapshots[i]->save(ar);
    }
  }
  return std::move(os).str();
}

}  // namespace flowstate
