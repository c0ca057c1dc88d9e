#include "flowstate/nodes/node.h"

#include <charconv>
#include <sstream>
#include <stdexcept>

#include <cereal/types/string.hpp>

#include "flowstate/core/error.h"

namespace flowstate {

std::string format_double(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

std::string join_list(const std::vector<std::string>& items) {
  std::string joined;
  for (const auto& item : items) joined += (joined.empty() ? "" : ",") + item;
  return joined;
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

namespace {

/// Fills `s` with the names and snapshots of `nodes`.
void fill_stamp(StampData& s, const std::vector<std::unique_ptr<SpineNode>>& nodes) {
  s.node_names.resize(nodes.size());
  s.snapshots.clear();
  s.snapshots.reserve(nodes.size());
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    s.node_names[i] = nodes[i]->name();
    s.snapshots.push_back(nodes[i]->snapshot());
  }
}

/// Refills `s`, a stamp of `nodes` given back, in place: its names stay, and each snapshot only
/// it holds takes the node's state in place (SpineNode::refill); one that a reader kept (a
/// snapshot is a shared_ptr anyone may copy out of a stamp) keeps its state, and the slot gets
/// a new snapshot.
void refill_stamp(StampData& s, const std::vector<std::unique_ptr<SpineNode>>& nodes) {
  if (s.snapshots.size() != nodes.size()) {
    fill_stamp(s, nodes);
    return;
  }
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    std::shared_ptr<const NodeSnapshot>& slot = s.snapshots[i];
    // Only this stamp holds it, and the stamp is this thread's: no one can take it meanwhile.
    if (slot.use_count() == 1 && nodes[i]->refill(const_cast<NodeSnapshot&>(*slot))) continue;
    slot = nodes[i]->snapshot();
  }
}

}  // namespace

Stamp snapshot_nodes(const std::vector<std::unique_ptr<SpineNode>>& nodes,
                     Recycler<StampData>* stamps) {
  if (stamps == nullptr) {
    auto s = std::make_shared<StampData>();
    fill_stamp(*s, nodes);
    return s;
  }
  return stamps->get(
      [&] {
        auto s = std::make_unique<StampData>();
        fill_stamp(*s, nodes);
        return s;
      },
      [&](StampData& s) { refill_stamp(s, nodes); });
}

namespace {

void check_count(std::size_t saved, std::size_t now, const std::string& where) {
  if (saved != now)
    throw CheckpointError(where, "the state holds " + std::to_string(saved) +
                                     " stateful nodes, this pipeline has " + std::to_string(now));
}

void check_name(const std::string& saved, const SpineNode& n, const std::string& where) {
  if (saved != n.name())
    throw CheckpointError(
        where, "the state holds node '" + saved + "' where this pipeline has '" + n.name() + "'");
}

/// Restores one node: bytes that end early or carry an impossible length (cereal::Exception,
/// std::length_error) are a corrupt state of that node; anything else the node throws, of any
/// type, is reported as its restore failing (rethrow_restore_with_node), never an abort.
void restore_one(SpineNode& n, InArchive& ar, const std::string& where, bool legacy,
                 const DataChange* change = nullptr) {
  try {
    if (legacy)
      n.restore_legacy(ar);
    else if (change != nullptr && change->touches(n.name()))
      n.restore_changed(ar, *change);
    else
      n.restore(ar);
  } catch (const cereal::Exception& e) {
    throw CheckpointError(
        where, "node '" + n.name() + "': its state is truncated or corrupt: " + e.what());
  } catch (const std::length_error& e) {
    throw CheckpointError(
        where, "node '" + n.name() + "': its state is truncated or corrupt: " + e.what());
  } catch (const ConfigError&) {
    // A data parameter set while running (DataChange::set) that the node refuses: the
    // caller's value, not the state, is wrong.
    if (change == nullptr || change->set.empty())
      rethrow_restore_with_node(std::current_exception(), n.name(), where);
    throw;
  } catch (...) {
    rethrow_restore_with_node(std::current_exception(), n.name(), where);
  }
}

}  // namespace

namespace {
thread_local const DataChange* current_change = nullptr;
}  // namespace

const DataChange* DataChange::current() { return current_change; }

DataChange::Scope::Scope(const DataChange* change) : previous_(current_change) {
  current_change = change;
}

DataChange::Scope::~Scope() { current_change = previous_; }

void restore_nodes(const std::vector<std::unique_ptr<SpineNode>>& nodes,
                   const std::vector<StampEntry>& entries, const std::string& where,
                   const DataChange* change) {
  // A nested restore (a mix's inputs) keeps the change of the restore around it.
  DataChange::Scope scope(change != nullptr ? change : DataChange::current());
  check_count(entries.size(), nodes.size(), where);
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const StampEntry& e = entries[i];
    check_name(e.name, *nodes[i], where);
    std::istringstream is{e.bytes, std::ios::binary};
    InArchive ar(is);
    StateReadLimit node_limit(e.bytes.size());
    restore_one(*nodes[i], ar, where, false, change);
  }
}

void restore_nodes(const std::vector<std::unique_ptr<SpineNode>>& nodes, std::string_view bytes,
                   const std::string& where, const DataChange* change) {
  try {
    StateReadLimit limit(bytes.size());
    if (auto entries = parse_stamp(bytes)) {
      restore_nodes(nodes, *entries, where, change);
      return;
    }
    // (Files are not compared there: a first-format stamp holds no data identity.)
    if (change != nullptr && !change->nodes.empty())
      throw CheckpointError(where,
                            "a state of the first stamp format cannot continue on changed "
                            "data; resume it unchanged and save a checkpoint first");
    // The first format: one archive, each node reading its state in turn.
    std::istringstream is{std::string(bytes), std::ios::binary};
    InArchive ar(is);
    std::uint32_t count = 0;
    ar(count);
    check_count(count, nodes.size(), where);
    for (const auto& n : nodes) {
      std::string name;
      load_bounded(ar, name);
      check_name(name, *n, where);
      restore_one(*n, ar, where, true);
    }
  } catch (const CheckpointError&) {
    throw;
  } catch (const ConfigError& e) {
    if (change == nullptr || change->set.empty())
      throw CheckpointError(where,
                            std::string("node states are truncated or corrupt: ") + e.what());
    throw;  // a value set while running that a node refuses (restore_one)
  } catch (const std::exception& e) {
    throw CheckpointError(where, std::string("node states are truncated or corrupt: ") + e.what());
  }
}

}  // namespace flowstate
