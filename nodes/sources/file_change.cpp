// Files added to or removed from a file source's glob between a checkpoint and its resume
// (issue 25, docs/DECISIONS.md "Changing the data mid-run"): with the opt-in
// (DataChange::files), the epoch in progress finishes over the files it started with — less
// the unread records of files removed — and the next epoch reads the files opened now. Records
// are numbered as the files opened number them; the epoch's own positions (what a shuffle or
// a shard address) are kept — a removed file's answer Ref::gone(), which they pass over — and
// pack renumbers the Refs it holds (DataChange::renumber), so the nodes after the source
// continue exactly, within the rules below.
#include <algorithm>
#include <map>

#include "flowstate/nodes/sources/file_source.h"

namespace flowstate {

namespace {

constexpr const char* kGoneSuffix = " was in the checkpoint and is gone";
constexpr const char* kNewSuffix = " is new (not in the checkpoint)";

bool is_added_or_removed(const std::string& diff) {
  return diff.ends_with(kGoneSuffix) || diff.ends_with(kNewSuffix);
}

std::string plural(std::uint64_t n, const std::string& unit) {
  return std::to_string(n) + " " +
         (n == 1 && unit.ends_with('s') ? unit.substr(0, unit.size() - 1) : unit);
}

}  // namespace

FileSourceState FileSource::continue_over_files(FileSourceState s,
                                                const std::vector<std::string>& diffs) const {
  const DataChange* change = DataChange::current();
  const bool only_files = std::all_of(diffs.begin(), diffs.end(), is_added_or_removed);
  std::string reason;
  for (const auto& d : diffs) reason += (reason.empty() ? "" : "\n") + name() + ": " + d;
  if (change == nullptr || !change->files) {
    if (only_files)
      reason +=
          "\n(only files were added or removed: to continue over them, opt in with `flowstate "
          "run --data-changed continue`, LoaderOptions::on_data_change or "
          "load_state_dict(state, data_changed=\"continue\"))";
    throw CheckpointError(name(), reason);
  }
  if (!only_files) {
    std::string refused;
    for (const auto& d : diffs)
      if (!is_added_or_removed(d)) refused += (refused.empty() ? "" : "\n") + name() + ": " + d;
    throw CheckpointError(name(), refused +
                                      "\n(only files added to or removed from the glob continue "
                                      "on changed data; a file whose contents changed cannot)");
  }

  const DataIdentity& now = *identity_;
  const DataIdentity& was = *s.identity;  // the files when the state was saved
  const DataIdentity& epoch = s.epoch_files ? *s.epoch_files : was;  // the epoch's files
  std::map<std::string, std::size_t> number_now;
  for (std::size_t k = 0; k < now.files.size(); ++k) number_now[now.files[k].name] = k;
  std::map<std::string, std::size_t> number_was;
  for (std::size_t k = 0; k < was.files.size(); ++k) number_was[was.files[k].name] = k;

  // The files kept keep their order (a glob's matches are sorted: names added or removed
  // cannot reorder the others, but a rename can).
  std::vector<std::string> removed;  // removed now, of the files the state was saved with
  std::size_t last = 0;
  bool ordered = true, first_kept = true;
  for (const auto& f : was.files) {
    auto it = number_now.find(f.name);
    if (it == number_now.end()) {
      removed.push_back(f.name);
      continue;
    }
    if (!first_kept && it->second <= last) ordered = false;
    last = it->second;
    first_kept = false;
  }
  if (!ordered)
    throw CheckpointError(name(), name() +
                                      ": the files kept are in another order now; records "
                                      "would be numbered otherwise");

  // The epoch's positions: before the cursor as they were; from it on, the records not yet read
  // of the files kept. Records of the epoch's files are numbered as now.
  const bool removes = !removed.empty();
  if (removes && s.epoch_files && s.changed_at != s.cursor)
    throw CheckpointError(name(),
                          name() + ": files removed in epoch " + std::to_string(s.epoch) +
                              ", which already continues over a change of its files at position " +
                              std::to_string(s.changed_at) +
                              "; resume with the files of the checkpoint until the epoch ends");
  // What the nodes after this one hold, and whether they continue through the change.
  auto after = change->holds_after.find(name());
  const bool known = after != change->holds_after.end();
  if (!known) {
    // A mix's input: what the mix holds of its Refs is not carried over.
    bool moved = false;  // a kept file of the epoch numbered otherwise now
    std::uint64_t first_was = 0;
    for (const auto& f : epoch.files) {
      auto it = number_now.find(f.name);
      if (it != number_now.end()) {
        std::uint64_t first_now = 0;
        for (std::size_t k = 0; k < it->second; ++k) first_now += now.files[k].items;
        if (first_now != first_was) moved = true;
      }
      first_was += f.items;
    }
    const std::string why = name() + ": the nodes after it are not known (a mix's input): ";
    if (removes)
      throw CheckpointError(name(), why +
                                        "files removed mid-epoch cannot continue exactly through "
                                        "it (" +
                                        removed.front() + " removed)");
    if (moved)
      throw CheckpointError(name(), why +
                                        "the files kept are numbered otherwise now (files added "
                                        "before them in sorted order); only files added after "
                                        "the last one continue through it");
  }
  // Otherwise a removal continues: a shuffle or shard addresses the epoch's positions, which
  // keep their numbering (a removed file's are gone, and passed over), and pack carries its
  // Refs over (DataChange::renumber). A buffer shuffle replays positions, never records.
  // Carry the state over, noting what changed.
  if (!s.epoch_files) {
    s.epoch_files = s.identity;
    s.changed_at = s.cursor;
  }
  FileSourceState next = s;
  next.identity = identity_;
  const auto view = epoch_view(next);
  const std::string prefix = name() + ": ";
  const std::uint64_t epoch_size = [&] {
    std::uint64_t n = 0;
    for (const auto& f : epoch.files) n += f.items;
    return n;
  }();
  for (const auto& f : now.files)
    if (!number_was.contains(f.name))
      change->notes.push_back(prefix + f.name + " added (" + plural(f.items, unit_) + "): epoch " +
                              std::to_string(s.epoch) + " finishes over the " +
                              std::to_string(epoch.files.size()) +
                              " files it started with, epoch " + std::to_string(s.epoch + 1) +
                              " reads " + std::to_string(now.files.size()));
  // Whether the source is read in order (its cursor moves) or addressed by position by a
  // shuffle or shard after it (which skip the removed files' positions they have not passed).
  const bool by_position =
      known && !after->second.empty() && after->second.front().first != UpstreamHold::kRefs;
  for (const auto& gone : removed) {
    std::uint64_t first = 0, items = 0;
    for (const auto& f : epoch.files) {
      if (f.name == gone) {
        items = f.items;
        break;
      }
      first += f.items;
    }
    if (by_position) {
      // The epoch keeps its positions; the node after the source passes over a gone one.
      change->notes.push_back(prefix + gone + " removed: its " + plural(items, unit_) +
                              " are skipped where '" + after->second.front().second +
                              "' has not yet delivered them in epoch " + std::to_string(s.epoch) +
                              " (the epoch keeps its " + std::to_string(epoch_size) +
                              " positions; the removed file's are gone)");
      continue;
    }
    // Its records at or after the cursor (positions before it are the epoch's own) are skipped.
    const std::uint64_t end = first + items;
    const std::uint64_t unread =
        end <= s.cursor ? 0 : end - std::max(first, std::min(s.cursor, end));
    change->notes.push_back(
        prefix + gone + " removed: " + plural(unread, unit_) + " of its " + std::to_string(items) +
        " not yet read in epoch " + std::to_string(s.epoch) + " are skipped (the epoch has " +
        std::to_string(view->size) + " of " + std::to_string(epoch_size) + " left to its end)");
  }

  // The Refs the checkpoint named (numbered as the files it was saved with number them), as
  // the files opened now number them: what a pack after the source holds (DataChange::renumber).
  {
    std::vector<std::uint64_t> first_was{0};
    std::vector<std::uint32_t> to_now;
    for (const auto& f : was.files) {
      first_was.push_back(first_was.back() + f.items);
      auto it = number_now.find(f.name);
      to_now.push_back(it == number_now.end() ? FileEpochView::kGone
                                              : static_cast<std::uint32_t>(it->second));
    }
    std::vector<std::uint64_t> first_now{0};
    for (const auto& f : now.files) first_now.push_back(first_now.back() + f.items);
    change->renumber[source_id_] = [first_was = std::move(first_was), to_now = std::move(to_now),
                                    first_now = std::move(first_now),
                                    id = source_id_](const Ref& ref) {
      const Ref r = ref.record();
      if (r.shard >= to_now.size() || r.index < first_was[r.shard] ||
          r.index >= first_was[r.shard + 1])
        return ref;  // not one of this source's as the checkpoint numbered them: left as is
      const std::uint32_t n = to_now[r.shard];
      if (n == FileEpochView::kGone) return Ref::gone(id);
      const Ref moved{r.source, n, first_now[n] + (r.index - first_was[r.shard])};
      return ref.is_pad() ? moved.as_pad() : moved;
    };
  }
  return next;
}

std::shared_ptr<const FileEpochView> FileSource::epoch_view(const FileSourceState& s) const {
  auto v = std::make_shared<FileEpochView>();
  v->epoch = s.epoch;
  std::map<std::string, std::uint32_t> number_now;
  for (std::size_t k = 0; k < identity_->files.size(); ++k)
    number_now[identity_->files[k].name] = static_cast<std::uint32_t>(k);
  v->first.push_back(0);
  for (const auto& f : s.epoch_files->files) {
    auto it = number_now.find(f.name);
    v->now.push_back(it == number_now.end() ? FileEpochView::kGone : it->second);
    v->first.push_back(v->first.back() + f.items);
  }
  const std::uint64_t total = v->first.back();
  const std::uint64_t cut = std::min(s.changed_at, total);
  auto add = [&](std::uint64_t from, std::uint64_t count) {
    if (count == 0) return;
    if (!v->spans.empty() && v->spans.back().from + v->spans.back().count == from) {
      v->spans.back().count += count;
    } else {
      v->spans.push_back({v->size, from, count});
    }
    v->size += count;
  };
  add(0, cut);  // read before the change: the epoch's own positions
  for (std::size_t k = 0; k < v->now.size(); ++k) {
    if (v->now[k] == FileEpochView::kGone) continue;
    const std::uint64_t begin = std::max(v->first[k], cut);
    if (begin < v->first[k + 1]) add(begin, v->first[k + 1] - begin);
  }
  return v;
}

Ref FileSource::view_at(std::uint64_t i) const {
  const FileEpochView& v = *view_;
  auto span =
      std::upper_bound(v.spans.begin(), v.spans.end(), i,
                       [](std::uint64_t x, const FileEpochView::Span& s) { return x < s.at; });
  const std::uint64_t record = i < v.size && span != v.spans.begin()
                                   ? std::prev(span)->from + (i - std::prev(span)->at)
                                   : v.first.back();
  return position_at(record);
}

Ref FileSource::position_at(std::uint64_t i) const {
  const FileEpochView& v = *view_;
  const auto k = static_cast<std::size_t>(std::upper_bound(v.first.begin(), v.first.end(), i) -
                                          v.first.begin() - 1);
  // A removed file's record: gone (a position the nodes after the source skip). The cursor's
  // own order (view_at) reaches one only before the change, where it is never asked again.
  if (k >= v.now.size() || v.now[k] == FileEpochView::kGone) return Ref::gone(source_id_);
  const std::uint32_t n = v.now[k];
  return Ref{source_id_, n, first_[n] + (i - v.first[k])};
}

}  // namespace flowstate
