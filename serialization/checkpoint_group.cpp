// Checkpoints of many ranks (see checkpoint.h): write_group_checkpoint commits every rank's
// part as one step-N through the same StepCommit as a single process's write, and
// find_group_checkpoint agrees on the newest step that every rank verifies.
#include "flowstate/serialization/checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <set>

#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"
#include "flowstate/serialization/atomic_file.h"
#include "flowstate/serialization/checkpoint_internal.h"
#include "flowstate/serialization/pipeline_state.h"

namespace flowstate {

namespace fs = std::filesystem;
using namespace checkpoint_detail;

void agree(Coordinator& coordinator, const std::optional<std::string>& error,
           const std::string& where) {
  // "1<message>" from a rank that failed, "0" from one that did not.
  const std::vector<std::string> all = coordinator.all_gather(error ? "1" + *error : "0");
  for (std::size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty() && all[r][0] == '1')
      throw CheckpointError(where, "rank " + std::to_string(r) + ": " + all[r].substr(1));
}

std::optional<RunLock> hold_checkpoint_directory(const std::string& dir, Coordinator* coordinator) {
  const std::string path = join(dir, kRunLockFile);
  std::optional<RunLock> lock;
  auto take = [&] {
    create_directories_durably(dir);
    lock.emplace(path, "checkpoint directory " + quote(dir));
  };
  if (coordinator == nullptr) {
    take();
    return lock;
  }
  std::optional<std::string> error;
  if (coordinator->rank() == 0) {
    try {
      take();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree(*coordinator, error, path);
  return lock;
}

namespace {

/// Runs `fn` and returns its error's message instead of throwing it.
template <class Fn>
std::optional<std::string> outcome(Fn&& fn) {
  try {
    fn();
    return std::nullopt;
  } catch (const std::exception& e) {
    return std::string(e.what());
  }
}

}  // namespace

std::string write_group_checkpoint(const std::string& dir, std::uint64_t step,
                                   std::string_view state, Coordinator& coordinator,
                                   const CheckpointWriteOptions& options) {
  const std::uint64_t rank = coordinator.rank(), world = coordinator.world();
  auto phase = [&](std::string_view name) {
    if (options.hook) options.hook(name);
  };
  StepCommit commit(dir, step, phase);
  const std::string& final_dir = commit.final_dir();
  const std::string& tmp = commit.tmp();
  const std::string part = join(tmp, part_name(rank));

  // 1. Rank 0 prepares step-N.tmp under the writers' lock, which it holds until the commit;
  // every rank checks that its state can be restored, and that all write the same step.
  std::optional<DirectoryLock> lock;
  bool created = false;
  const std::optional<std::string> prepared = outcome([&] {
    PipelineState::decode(state, "state");
    if (rank != 0) return;
    create_directories_durably(dir);
    lock.emplace(join(dir, kLockFile));
    clean_up(dir);
    if (!options.overwrite) refuse_if_behind(dir, step);
    if (::mkdir(tmp.c_str(), 0755) != 0)
      throw CheckpointError(tmp,
                            "cannot create directory " + quote(tmp) + ": " + std::strerror(errno));
    created = true;
    phase("tmp-created");
  });
  const std::vector<std::string> ready =
      coordinator.all_gather(prepared ? "1" + *prepared : "0" + std::to_string(step));
  std::optional<std::string> refused;
  std::string steps;
  for (std::size_t r = 0; r < ready.size(); ++r) {
    if (!refused && ready[r][0] == '1')
      refused = "rank " + std::to_string(r) + ": " + ready[r].substr(1);
    steps += (r ? ", " : "") + std::string("rank ") + std::to_string(r) + " at step " +
             ready[r].substr(1);
  }
  if (!refused)
    for (const auto& m : ready)
      if (m != ready[0])
        refused = "the ranks checkpoint different steps (" + steps +
                  "): every rank must take the same number of steps (shard's uneven: pad or drop)";
  if (refused) {
    if (created) remove_tree(tmp);
    throw CheckpointError(final_dir, "checkpoint " + quote(final_dir) + " failed: " + *refused);
  }

  // 2. Every rank writes and fsyncs its part, and tells rank 0 its size and checksum.
  std::uint64_t part_size = 0, part_sum = 0;
  std::optional<std::string> error = outcome([&] {
    std::error_code ec;
    if (!fs::is_directory(tmp, ec))
      throw CheckpointError(tmp, "rank " + std::to_string(rank) + " cannot see " + quote(tmp) +
                                     ", which rank 0 created: the checkpoint directory must be "
                                     "one directory shared by every rank (not node-local)");
    // Large blobs once per directory (every rank may store the same one), before the part.
    const StoredState stored = externalize_blobs(state);
    write_blobs(dir, stored);
    write_file_durably(part, stored.bytes);
    phase("part-written");
    part_size = stored.bytes.size();
    part_sum = hash64(stored.bytes);
  });
  const std::vector<std::string> parts = coordinator.all_gather(
      error ? "1" + *error : "0" + std::to_string(part_size) + " " + hex64(part_sum));

  // 3. Rank 0 commits: every part visible with its size, the manifest, the rename.
  error.reset();
  for (std::size_t r = 0; r < parts.size() && !error; ++r)
    if (!parts[r].empty() && parts[r][0] == '1')
      error = "rank " + std::to_string(r) + ": " + parts[r].substr(1);
  if (rank == 0) {
    if (!error) {
      error = outcome([&] {
        Manifest manifest{step, 0, world, {}};
        for (std::uint64_t r = 0; r < world; ++r) {
          ManifestEntry e{part_name(r), 0, 0};
          const std::string& msg = parts[r];
          const auto space = msg.find(' ');
          e.size = std::stoull(msg.substr(1, space - 1));
          e.checksum = *parse_hex64(msg.substr(space + 1));
          const std::string path = join(tmp, e.name);
          struct stat st {};
          if (::stat(path.c_str(), &st) != 0 || static_cast<std::uint64_t>(st.st_size) != e.size)
            throw CheckpointError(path, "rank " + std::to_string(r) + "'s part " + quote(path) +
                                            " is not visible from rank 0 as it was written: the "
                                            "checkpoint directory must be one directory shared "
                                            "by every rank (not node-local)");
          manifest.files.push_back(std::move(e));
        }
        commit.commit(manifest);  // the commit, for every rank at once
      });
    }
    if (error)
      commit.roll_back();
    else
      commit.finish(step, options.keep);
  }
  // 4. Rank 0 says whether it committed; every rank returns or throws the same.
  const std::vector<std::string> committed =
      coordinator.all_gather(rank == 0 ? (error ? "1" + *error : "0") : "");
  if (committed[0].size() > 0 && committed[0][0] == '1')
    throw CheckpointError(final_dir,
                          "checkpoint " + quote(final_dir) + " failed: " + committed[0].substr(1));
  return final_dir;
}

std::optional<CheckpointFound> find_group_checkpoint(const std::string& dir,
                                                     Coordinator& coordinator) {
  const std::uint64_t rank = coordinator.rank();
  // Each rank: the steps whose part it verifies, newest first, and whether it sees evidence.
  std::vector<CheckpointFound> verified;
  std::vector<std::string> reasons;
  bool evidence = false;
  std::optional<std::string> error = outcome([&] {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return;
    if (auto problem = latest_problem(dir)) reasons.push_back(*problem);
    for (const auto& c : list_candidates(dir)) {
      if (!verified.empty() && verified.back().step == c.name.step) continue;  // its .old
      try {
        verified.push_back(read_checkpoint(c.path, rank));
      } catch (const CheckpointError& e) {
        reasons.push_back(c.path + ": " + e.what());
      }
    }
    evidence = !verified.empty() || !find_checkpoint_evidence(dir).empty();
  });
  // "0e 10 5" (evidence, the steps verified), then a line per reason a candidate failed.
  std::string mine = error ? "1" + *error : std::string(evidence ? "0e" : "0n");
  if (!error) {
    for (const auto& f : verified) mine += " " + std::to_string(f.step);
    for (std::string reason : reasons) {
      std::replace(reason.begin(), reason.end(), '\n', ' ');
      mine += "\n" + reason;
    }
  }
  const std::vector<std::string> all = coordinator.all_gather(mine);

  std::optional<std::set<std::uint64_t>> common;
  bool any_evidence = false, blind = false;
  std::string summary;
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty() || all[r][0] == '1')
      throw CheckpointError(dir, "rank " + std::to_string(r) + ": " + all[r].substr(1));
    any_evidence |= all[r][1] == 'e';
    blind |= all[r][1] == 'n';
    const std::size_t eol = std::min(all[r].find('\n'), all[r].size());
    const std::string head = all[r].substr(0, eol);
    std::set<std::uint64_t> steps;
    std::string list;
    for (std::size_t at = 2; at < head.size();) {
      const std::size_t next = std::min(head.find(' ', at + 1), head.size());
      const std::uint64_t s = std::stoull(head.substr(at + 1, next - at - 1));
      steps.insert(s);
      list += (list.empty() ? "" : ", ") + std::to_string(s);
      at = next;
    }
    summary += "\n  rank " + std::to_string(r) + " verifies " +
               (list.empty() ? std::string("no step") : "steps " + list);
    // Why this rank refused the others: its reasons, one per line below it.
    if (eol < all[r].size()) {
      summary += "; it refuses:";
      for (std::size_t at = eol; at < all[r].size();) {
        const std::size_t next = std::min(all[r].find('\n', at + 1), all[r].size());
        summary += "\n    " + all[r].substr(at + 1, next - at - 1);
        at = next;
      }
    }
    if (!common) {
      common = std::move(steps);
    } else {
      std::set<std::uint64_t> both;
      std::set_intersection(common->begin(), common->end(), steps.begin(), steps.end(),
                            std::inserter(both, both.begin()));
      common = std::move(both);
    }
  }
  if (!common || common->empty()) {
    if (!any_evidence) return std::nullopt;
    // The hint fits when a rank sees no checkpoint at all where another does (a node-local
    // directory); parts that fail their checks are said by the ranks' reasons.
    throw CheckpointError(dir, "no checkpoint under '" + dir + "' verifies on every rank" +
                                   (blind ? " (the directory must be one directory shared by "
                                            "every rank)"
                                          : "") +
                                   ":" + summary);
  }
  const std::uint64_t step = *common->rbegin();
  for (auto& f : verified) {
    if (f.step != step) {
      if (f.step > step)
        reasons.push_back(f.path + ": not every rank verifies its part of step " +
                          std::to_string(f.step));
      continue;
    }
    f.skipped = std::move(reasons);
    return std::move(f);
  }
  throw CheckpointError(dir, "internal: step " + std::to_string(step) + " vanished");
}

}  // namespace flowstate
