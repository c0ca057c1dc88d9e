#include "core/state.h"

#include <sstream>
#include <stdexcept>

#include <cereal/types/string.hpp>

#include "core/error.h"

namespace flowstate {

namespace {
thread_local std::uint64_t read_limit = std::uint64_t{1} << 30;
}

StateReadLimit::StateReadLimit(std::uint64_t limit) : previous_(read_limit) { read_limit = limit; }
StateReadLimit::~StateReadLimit() { read_limit = previous_; }
std::uint64_t StateReadLimit::current() { return read_limit; }

std::uint64_t load_bounded_size(InArchive& ar) {
  cereal::size_type n = 0;
  ar(cereal::make_size_tag(n));
  if (n > read_limit)
    throw std::length_error("a length field says " + std::to_string(n) +
                            " but the input holds only " + std::to_string(read_limit) + " bytes");
  return n;
}

void load_bounded(InArchive& ar, std::string& s) {
  s.resize(static_cast<std::size_t>(load_bounded_size(ar)));
  ar(cereal::binary_data(s.data(), s.size()));
}

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

void require_state_version(std::string_view type, std::uint32_t version, std::uint32_t supported,
                           const std::string& where) {
  if (version > supported)
    throw CheckpointError(where, std::string(type) + " version " + std::to_string(version) +
                                     " is newer than this build's " + std::to_string(supported) +
                                     "; upgrade flowstate");
}

}  // namespace flowstate
