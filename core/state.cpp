#include "flowstate/core/state.h"

#include <sstream>
#include <stdexcept>

#include <cereal/types/string.hpp>

#include "flowstate/core/error.h"

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

namespace {

/// First word of a stamp of the entry format. A stamp of the first format starts with its
/// node count, which is never this large.
constexpr std::uint32_t kStampEntries = 0x46535432;  // "FST2"

void put_bytes(OutArchive& ar, std::string_view s) {
  ar(static_cast<std::uint32_t>(s.size()));
  ar(cereal::binary_data(s.data(), s.size()));
}

void get_bytes(InArchive& ar, std::string& s) {
  std::uint32_t n = 0;
  ar(n);
  if (n > read_limit)
    throw std::length_error("a length field says " + std::to_string(n) +
                            " but the input holds only " + std::to_string(read_limit) + " bytes");
  s.resize(n);
  ar(cereal::binary_data(s.data(), s.size()));
}

}  // namespace

void save_entries(OutArchive& ar, const StampData& stamp) {
  ar(static_cast<std::uint32_t>(stamp.snapshots.size()));
  for (std::size_t i = 0; i < stamp.snapshots.size(); ++i) {
    std::ostringstream node(std::ios::binary);
    {
      OutArchive nar(node);
      stamp.snapshots[i]->save(nar);
    }
    put_bytes(ar, stamp.node_names[i]);
    put_bytes(ar, std::move(node).str());
  }
}

std::vector<StampEntry> load_entries(InArchive& ar) {
  std::uint32_t count = 0;
  ar(count);
  if (count > read_limit) throw std::length_error("the stamp's node count exceeds its size");
  std::vector<StampEntry> out(count);
  for (auto& e : out) {
    get_bytes(ar, e.name);
    get_bytes(ar, e.bytes);
  }
  return out;
}

std::string serialize_stamp(const StampData& stamp) {
  std::ostringstream os(std::ios::binary);
  {
    OutArchive ar(os);
    ar(kStampEntries);
    save_entries(ar, stamp);
  }
  return std::move(os).str();
}

std::optional<std::vector<StampEntry>> parse_stamp(std::string_view bytes) {
  std::istringstream is{std::string(bytes), std::ios::binary};
  InArchive ar(is);
  std::uint32_t marker = 0;
  ar(marker);
  if (marker != kStampEntries) return std::nullopt;
  return load_entries(ar);
}

void require_state_version(std::string_view type, std::uint32_t version, std::uint32_t supported,
                           const std::string& where) {
  if (version > supported)
    throw CheckpointError(where, std::string(type) + " version " + std::to_string(version) +
                                     " is newer than this build's " + std::to_string(supported) +
                                     "; upgrade flowstate");
}

}  // namespace flowstate
