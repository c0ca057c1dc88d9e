// Loader's on-disk checkpoints: save_checkpoint, save_checkpoint_async and restore. The file
// format and its crash safety live in serialization/checkpoint.{h,cpp}; this file decides
// what is saved (the consumer's cut, DESIGN.md §6) and in which order writes commit.
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <mutex>

#include "core/error.h"
#include "graph/loader.h"

namespace flowstate {
namespace {

/// `step-N` holds the state after N batches of the schedule: the next step to deliver.
std::uint64_t checkpoint_step(const std::optional<std::uint64_t>& last_step) {
  return last_step ? *last_step + 1 : 0;
}

/// Commits this process's checkpoint writes to one directory in the order they were asked
/// for, so that two saves in flight never leave LATEST on the older one. (Other processes are
/// kept apart by the directory lock in write_checkpoint; their order is theirs.)
class WriteOrder {
 public:
  /// A place in a directory's queue: wait for the previous write, then finish this one.
  struct Turn {
    std::shared_future<void> previous;
    std::promise<void> done;
  };

  static Turn take(const std::string& dir) {
    static std::mutex mu;
    static std::map<std::string, std::shared_future<void>> last;  // one entry per directory
    std::string key;
    try {
      key = std::filesystem::absolute(dir).lexically_normal().string();
    } catch (const std::filesystem::filesystem_error&) {
      key = dir;
    }
    Turn t;
    std::lock_guard lock(mu);
    std::shared_future<void>& slot = last[key];
    t.previous = slot;
    slot = t.done.get_future().share();
    return t;
  }

  /// Runs `write` in `turn`'s order; the next write may start when this one ends, however it
  /// ends.
  static std::string run(Turn turn, const std::function<std::string()>& write) {
    struct Done {
      std::promise<void>& p;
      ~Done() { p.set_value(); }
    } done{turn.done};
    if (turn.previous.valid()) turn.previous.wait();
    return write();
  }
};

}  // namespace

std::string Loader::save_checkpoint(const std::string& dir,
                                    const CheckpointWriteOptions& options) const {
  const std::uint64_t step = checkpoint_step(last_step_);
  const std::string bytes = state();
  return WriteOrder::run(WriteOrder::take(dir),
                         [&] { return write_checkpoint(dir, step, bytes, options); });
}

std::future<std::string> Loader::save_checkpoint_async(const std::string& dir,
                                                       CheckpointWriteOptions options) const {
  // The cut is taken now, on the consumer's thread: the last batch's stamp, immutable and
  // shared. Encoding it moves with the file I/O.
  const std::uint64_t step = checkpoint_step(last_step_);
  PipelineState s = state_struct_without_spine();
  WriteOrder::Turn turn = WriteOrder::take(dir);
  return std::async(
      std::launch::async, [dir, step, s = std::move(s), stamp = last_stamp_,
                           options = std::move(options), turn = std::move(turn)]() mutable {
        s.spine = serialize_stamp(*stamp);
        const std::string bytes = s.encode();
        return WriteOrder::run(std::move(turn),
                               [&] { return write_checkpoint(dir, step, bytes, options); });
      });
}

std::optional<CheckpointFound> Loader::restore(const std::string& dir) {
  std::optional<CheckpointFound> found = find_latest_checkpoint(dir);
  if (!found) {
    // None verifies. An empty (or missing) directory is a fresh start; checkpoints that all
    // fail to verify are an error: silently starting over at step 0 would retrain on data.
    std::string reasons;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("step-", 0) != 0 || name.ends_with(".tmp")) continue;
      try {
        read_checkpoint(entry.path().string());
      } catch (const CheckpointError& e) {
        reasons += "\n  " + entry.path().string() + ": " + e.what();
      }
    }
    if (!reasons.empty())
      throw CheckpointError(dir, "no checkpoint under '" + dir + "' verifies:" + reasons);
    return std::nullopt;
  }
  const std::string file = (std::filesystem::path(found->path) / "state.bin").string();
  try {
    // Checks the fingerprint (naming what differs) and loads every node, or changes nothing.
    load_state(found->state);
  } catch (const CheckpointError& e) {
    throw CheckpointError(file, "cannot restore " + found->path + ": " + e.what());
  }
  return found;
}

}  // namespace flowstate
