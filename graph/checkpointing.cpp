// Loader's on-disk checkpoints: save_checkpoint, save_checkpoint_async and restore. The file
// format and its crash safety live in serialization/checkpoint.{h,cpp}; this file decides
// what is saved (the consumer's cut, DESIGN.md §6) and in which order writes commit.
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <utility>

#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "flowstate/graph/loader_observer.h"
#include "flowstate/nodes/sources/remote_listing.h"

namespace flowstate {
namespace {

/// `step-N` holds the state after N batches of the schedule: the next step to deliver.
std::uint64_t checkpoint_step(const std::optional<std::uint64_t>& last_step) {
  return last_step ? *last_step + 1 : 0;
}

std::string step_dir_name(std::uint64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%012llu", static_cast<unsigned long long>(step));
  return buf;
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

/// The async saves of one Loader: at most one in flight (a new one waits for it: saves asked
/// for faster than the disk commits them block the consumer, none is dropped), and the error
/// of one that failed, for the consumer's next call.
class Loader::AsyncSaves {
 public:
  /// Waits for the save in flight, if any.
  void wait() {
    std::shared_future<void> last;
    {
      std::lock_guard lock(mu_);
      last = last_;
    }
    if (last.valid()) last.wait();
  }
  void started(std::shared_future<void> done) {
    std::lock_guard lock(mu_);
    last_ = std::move(done);
  }
  void failed(std::exception_ptr e) {
    std::lock_guard lock(mu_);
    error_ = std::move(e);
    has_error_.store(true, std::memory_order_release);
  }
  /// Throws (once) the error of a save that failed.
  void rethrow_failure() {
    if (!has_error_.load(std::memory_order_acquire)) return;
    std::exception_ptr e;
    {
      std::lock_guard lock(mu_);
      e = std::exchange(error_, nullptr);
      has_error_.store(false, std::memory_order_relaxed);
    }
    if (e) std::rethrow_exception(e);
  }

 private:
  std::mutex mu_;
  std::shared_future<void> last_;
  std::exception_ptr error_;
  std::atomic<bool> has_error_{false};
};

void Loader::rethrow_failed_save() {
  if (saves_) saves_->rethrow_failure();
}

namespace {

/// Times a checkpoint's phases for the trace and the metrics: cut (the state taken, on the
/// consumer's thread), encode, write (state.bin and MANIFEST.json, each fsynced) and commit
/// (the renames and the directory's fsync), using write_checkpoint's phase hook.
class CheckpointTiming {
 public:
  CheckpointTiming(std::shared_ptr<detail::LoaderObserver> observer, std::uint64_t step,
                   std::int64_t cut_begin)
      : o_(std::move(observer)), step_(step), cut_begin_(cut_begin) {}
  void cut_done() { cut_end_ = stats_now_ns(); }
  void encode_begin() { encode_begin_ = stats_now_ns(); }
  void encode_done() { encode_end_ = stats_now_ns(); }
  /// Chains the timing into `options.hook`.
  void hook(CheckpointWriteOptions& options) {
    options.hook = [this, user = std::move(options.hook)](std::string_view phase) {
      if (phase == "manifest-written") written_ = stats_now_ns();
      if (user) user(phase);
    };
  }
  /// The checkpoint committed (now); `track`: where its encode and write ran.
  void committed(std::uint32_t track) {
    const std::int64_t end = stats_now_ns();
    if (written_ == 0) written_ = end;
    const auto s = [](std::int64_t a, std::int64_t b) { return static_cast<double>(b - a) * 1e-9; };
    o_->committed({step_, o_->seconds_at(end), s(cut_begin_, cut_end_),
                   s(encode_begin_, encode_end_), s(encode_end_, written_), s(written_, end)});
    if (Tracer* t = o_->tracer.get()) {
      const auto step = static_cast<std::int64_t>(step_);
      t->span(Tracer::kConsumer, o_->ck_cut, cut_begin_, cut_end_, step);
      t->span(track, o_->ck_encode, encode_begin_, encode_end_, step);
      t->span(track, o_->ck_write, encode_end_, written_, step);
      t->span(track, o_->ck_commit, written_, end, step);
    }
  }

 private:
  std::shared_ptr<detail::LoaderObserver> o_;
  std::uint64_t step_;
  std::int64_t cut_begin_, cut_end_ = 0, encode_begin_ = 0, encode_end_ = 0, written_ = 0;
};

}  // namespace

std::string Loader::save_checkpoint(const std::string& dir,
                                    const CheckpointWriteOptions& options) const {
  const std::uint64_t step = checkpoint_step(last_step_);
  CheckpointTiming timing(observer_, step, stats_now_ns());
  timing.cut_done();
  timing.encode_begin();
  const std::string bytes = state();
  timing.encode_done();
  CheckpointWriteOptions o = options;
  timing.hook(o);
  // A collective write is ordered by the collective itself (and the ranks may be threads of
  // this process, which the per-process queue would deadlock).
  std::string path = options_.coordinator
                         ? write_group_checkpoint(dir, step, bytes, *options_.coordinator, o)
                         : WriteOrder::run(WriteOrder::take(dir),
                                           [&] { return write_checkpoint(dir, step, bytes, o); });
  timing.committed(Tracer::kConsumer);
  return path;
}

std::future<std::string> Loader::save_checkpoint_async(const std::string& dir,
                                                       CheckpointWriteOptions options) const {
  if (!saves_) saves_ = std::make_shared<AsyncSaves>();
  // Back-pressure: the previous save commits first. Its failure, if it failed, is reported
  // here (or by next(), whichever comes first).
  saves_->wait();
  saves_->rethrow_failure();
  // The cut is taken now, on the consumer's thread: the last batch's stamp, immutable and
  // shared. Encoding it moves with the file I/O.
  const std::uint64_t step = checkpoint_step(last_step_);
  auto timing = std::make_unique<CheckpointTiming>(observer_, step, stats_now_ns());
  PipelineState s = state_struct_without_spine();
  std::optional<WriteOrder::Turn> turn;
  if (!options_.coordinator) turn = WriteOrder::take(dir);
  std::promise<void> done;
  saves_->started(done.get_future().share());
  timing->cut_done();
  return std::async(
      std::launch::async,
      [dir, step, s = std::move(s), stamp = last_stamp_, coordinator = options_.coordinator,
       options = std::move(options), turn = std::move(turn), saves = saves_, done = std::move(done),
       timing = std::move(timing)]() mutable {
        struct Done {
          std::promise<void>& p;
          ~Done() { p.set_value(); }
        } signal{done};
        try {
          timing->encode_begin();
          s.spine = serialize_stamp(*stamp);
          const std::string bytes = s.encode();
          timing->encode_done();
          timing->hook(options);
          std::string path = coordinator
                                 ? write_group_checkpoint(dir, step, bytes, *coordinator, options)
                                 : WriteOrder::run(std::move(*turn), [&] {
                                     return write_checkpoint(dir, step, bytes, options);
                                   });
          timing->committed(Tracer::kCheckpoint);
          return path;
        } catch (const CheckpointError& e) {
          // Named for the checkpoint, with the system's reason from the step that failed.
          const std::string path = (std::filesystem::path(dir) / step_dir_name(step)).string();
          CheckpointError error(path, "checkpoint '" + path + "' failed: " + e.what());
          saves->failed(std::make_exception_ptr(error));
          throw error;
        } catch (...) {
          saves->failed(std::current_exception());
          throw;
        }
      });
}

std::optional<CheckpointFound> Loader::restore(const std::string& dir) {
  if (options_.coordinator) {
    Coordinator& coordinator = *options_.coordinator;
    std::optional<CheckpointFound> found = find_group_checkpoint(dir, coordinator);
    if (!found) {
      save_pending_listings(*listings_);  // a fresh start keeps what it listed
      return std::nullopt;
    }
    const std::string file = found->path;
    // Every rank loads its part; all go on, or all fail with the first failure.
    std::optional<std::string> error;
    try {
      load_state(found->state);
    } catch (const CheckpointError& e) {
      error = "cannot restore " + found->path + ": " + e.what();
    }
    agree(coordinator, error, file);
    return found;
  }
  std::optional<CheckpointFound> found = find_latest_checkpoint(dir);
  if (!found) {
    // None verifies. An empty (or missing) directory is a fresh start; any evidence of
    // checkpoints (a LATEST, a step directory, an unfinished write of one) is an error:
    // silently starting over at step 0 would retrain on consumed data.
    const CheckpointEvidence evidence = find_checkpoint_evidence(dir);
    if (evidence.empty()) {
      save_pending_listings(*listings_);  // a fresh start keeps what it listed
      return std::nullopt;
    }
    std::string reasons;
    for (const auto& e : evidence.entries) reasons += "\n  " + e;
    throw CheckpointError(dir, "no checkpoint under '" + dir + "' verifies:" + reasons);
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
