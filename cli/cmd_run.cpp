// `flowstate run`: consumes a YAML pipeline as a trainer would — with periodic checkpoints,
// resume, skipped ranges, digests and provenance — and reports its throughput.
// What the run shows and keeps on the way (signals, line files, progress) is
// cli/run_output.h. One file (just over 600 lines): the run loop, its ranks and its MPI
// hand-off share the loop's local state; splitting would pass that state through headers.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <optional>

#include "cli/command.h"
#include "cli/run_output.h"
#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"
#include "flowstate/core/launcher.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/sources/mapped_file.h"
#include "flowstate/nodes/sources/object_cache.h"
#include "flowstate/serialization/checkpoint.h"
#ifdef FLOWSTATE_HAVE_MPI
#include "cli/mpi_module.h"
#endif

namespace flowstate::cli {
namespace {

constexpr const char* kUsage =
    "usage: flowstate run PIPELINE.yaml [options]\n\n"
    "Consumes the pipeline as a trainer would and reports progress (a live line on a\n"
    "terminal, a line every --progress-interval seconds otherwise) and a summary.\n\n"
    "  --steps N               stop after the batch of step N-1 (a global target: a resumed\n"
    "                          run stops at the same place)\n"
    "  --epochs E              epochs to run (default: the pipeline's; 0 runs until stopped)\n"
    "  --workers N|auto|inline batch-assembly workers (free: never changes the batches);\n"
    "                          auto: tuned while running; inline: no thread, batches\n"
    "                          made on the consumer's thread when it asks\n"
    "  --checkpoint-dir D      checkpoint directory, relative to the current directory\n"
    "                          (default: the pipeline's checkpoint.dir, relative to its file)\n"
    "  --checkpoint-every K    checkpoint after each batch whose (step+1) % K == 0 (the\n"
    "                          pipeline's checkpoint.every_steps; 0: only at the end)\n"
    "  --keep N                keep the N newest checkpoints (0: all)\n"
    "  --resume                continue from the newest step-N directory that verifies;\n"
    "                          LATEST is only a hint. An empty or missing directory starts\n"
    "                          from the beginning; checkpoints there of which none verifies\n"
    "                          (a LATEST, a step-N, an unfinished step-N.tmp) are an error\n"
    "  --overwrite             discard the directory's checkpoints (durably) before running;\n"
    "                          without --resume or --overwrite, a directory that holds\n"
    "                          checkpoints is refused\n"
    "  --cache-dir DIR         default cache directory of remote objects (s3://, http(s)://)\n"
    "                          for the sources that set no cache.dir (over\n"
    "                          FLOWSTATE_CACHE_DIR; free: never changes the batches)\n"
    "  --cache-limit SIZE      default cache limit (20GiB, 500MB, 1048576) for the sources\n"
    "                          that set no cache.limit (over FLOWSTATE_CACHE_LIMIT)\n"
    "  --skip A:B              drop the batches of steps A..B (inclusive; repeatable)\n"
    "  --set KEY=VALUE         override a pipeline value (nodes[1].shuffle.size=1024; repeatable)\n"
    "  --data-changed continue with --resume: continue over a checkpoint whose pipeline differs\n"
    "                          only in data parameters (a mix's weights or inputs) or in the\n"
    "                          files a source's glob matches (added: from the next epoch;\n"
    "                          removed: their unread records of this epoch skipped), by each\n"
    "                          node's rule, recorded in the state's history of data changes;\n"
    "                          without it (or with 'refuse') such a checkpoint is refused\n"
    "  --mix-weights S:NODE=W,W  from step S on, mix NODE draws with weights W,W (repeatable;\n"
    "                          the weights in force are part of the state, so a resume with\n"
    "                          the same schedule continues exactly)\n"
    "  --weights-schedule FILE lines 'S:NODE=W,W' (as --mix-weights; '#' starts a comment)\n"
    "  --digests FILE|-        append '<step> <epoch> <index_in_epoch> <digest>' per batch\n"
    "  --provenance FILE|-     append '<step> <epoch> <index_in_epoch> <source>:<index>...'\n"
    "                          (a padding sample: <source>:<index>:pad). In the paths of\n"
    "                          --digests, --provenance and --checkpoint-dir, {rank} is\n"
    "                          replaced by this process's rank. A last line that a killed\n"
    "                          run left cut short is dropped before appending\n"
    "  --trace FILE.json       write a timeline of the run (Chrome trace-event JSON: open it in\n"
    "                          Perfetto UI or chrome://tracing): a track per thread, a span per\n"
    "                          node per batch, the consumer's waits, checkpoint phases;\n"
    "                          after the first 10 s (or 64 MB) sampled: at most 5 whole\n"
    "                          steps a second, and the file says so\n"
    "  --metrics FILE.jsonl    append a JSON line of metrics every --metrics-interval seconds\n"
    "                          (default 1): step, samples/s, MB/s, batches in flight, each\n"
    "                          node's busy share, RSS, checkpoint durations; `flowstate report`\n"
    "                          turns it into an HTML page\n"
    "  --progress-interval S   seconds between progress lines when not on a terminal\n"
    "                          (default 10; 0: a line per batch). A line shows the percent\n"
    "                          done and an ETA when the number of steps is known (--steps,\n"
    "                          or epochs x batches per epoch)\n\n"
    "A run holds its checkpoint directory while it runs (a lock on DIR/.run.lock, which the\n"
    "kernel releases when the process ends, however it ends): a second run on it, with or\n"
    "without --resume, is refused at once (exit status 4) naming the holder's pid. Ranks\n"
    "sharing one directory hold it as one job.\n\n"
    "With a checkpoint directory, the run also checkpoints its last batch when it ends, and\n"
    "SIGTERM or SIGINT stop it cleanly after checkpointing the last delivered batch; a second\n"
    "signal kills it.\n\n"
    "Many ranks: under mpirun (or another MPI launcher) every rank runs this command with the\n"
    "same arguments; rank and world come from the launcher. Built with MPI, the ranks share\n"
    "one checkpoint directory (it must be visible to all of them): each step-N holds every\n"
    "rank's part and is committed once all are durable, and --resume takes the newest step\n"
    "every rank verifies. Without MPI (torchrun's RANK/WORLD_SIZE), give each rank its own\n"
    "directory: --checkpoint-dir 'ck/{rank}'. The ranks agree every 32 batches whether to\n"
    "stop, so a signal stops them all at one step within 32 batches.\n\n"
    "exit status: 0 the run ended (end of data or --steps); 143 stopped by SIGTERM, 130 by\n"
    "SIGINT (128 + the signal, as a shell reports it), once the final checkpoint is durable,\n"
    "so a scheduler can tell a preempted run from a finished one; 2 usage or configuration\n"
    "error, 3 data error (a node's, named), 4 checkpoint error (also: the directory is held by\n"
    "another run); 1 anything else; killed by signal N (a second SIGTERM or SIGINT, SIGKILL):\n"
    "128 + N, as a shell reports it.\n";

std::pair<std::uint64_t, std::uint64_t> parse_skip(const std::string& s) {
  auto colon = s.find(':');
  if (colon == std::string::npos) throw UsageError("--skip expects A:B, got '" + s + "'");
  std::uint64_t a = parse_uint(s.substr(0, colon), "--skip");
  std::uint64_t b = parse_uint(s.substr(colon + 1), "--skip");
  if (a > b) throw UsageError("--skip " + s + " is reversed (A > B)");
  return {a, b};
}

/// The first step at or after `step` that `skips` (sorted, merged) does not drop.
std::uint64_t next_delivered(std::uint64_t step,
                             const std::vector<std::pair<std::uint64_t, std::uint64_t>>& skips) {
  for (const auto& [first, last] : skips)
    if (first <= step && step <= last) step = last == UINT64_MAX ? last : last + 1;
  return step;
}

/// Steps between the ranks' agreements on whether to stop (see RunLoop::run): the most batches a
/// signal waits for.
constexpr std::uint64_t kAgreeEvery = 32;

/// `path` with every "{rank}" replaced by `rank`.
std::string with_rank(std::string path, std::uint64_t rank) {
  const std::string r = std::to_string(rank);
  for (std::size_t at = path.find("{rank}"); at != std::string::npos;
       at = path.find("{rank}", at + r.size()))
    path.replace(at, 6, r);
  return path;
}

std::optional<std::string> with_rank(const std::optional<std::string>& path, std::uint64_t rank) {
  if (!path) return path;
  return with_rank(*path, rank);
}

std::uint64_t batch_bytes(const Batch& b) {
  std::uint64_t n = 0;
  for (const auto& [id, t] : b.fields) n += t.nbytes();
  return n;
}

using Skips = std::vector<std::pair<std::uint64_t, std::uint64_t>>;

/// The flags of `flowstate run` that need no pipeline.
struct RunArgs {
  std::string path;                      ///< the pipeline file
  std::optional<std::uint64_t> steps;    ///< --steps
  std::optional<std::uint64_t> workers;  ///< --workers (kAuto: auto, kInline: inline)
  double progress_interval = 10;         ///< --progress-interval
  Skips skips;                           ///< --skip, as given
  MixWeightsSchedule weights;            ///< --mix-weights, --weights-schedule
};

/// Reads and checks the pipeline file's name and the flags that need no pipeline.
RunArgs parse_run_args(const Args& args) {
  if (args.positional().size() != 1)
    throw UsageError("expected one pipeline file, got " + std::to_string(args.positional().size()) +
                     " arguments");
  RunArgs run;
  run.path = args.positional()[0];
  run.steps = args.uint("--steps");
  run.workers = parse_workers(args);
  if (auto p = args.value("--progress-interval"))
    run.progress_interval = parse_seconds(*p, "--progress-interval", /*allow_zero=*/true);
  for (const auto& s : args.values("--skip")) run.skips.push_back(parse_skip(s));
  run.weights = MixWeightsSchedule(mix_weights_flags(args));
  return run;
}

/// The pipeline of `path` with the --set overrides; with --digests, kept in host memory.
PipelineConfig load_run_pipeline(const Args& args, const std::string& path) {
  bool moved = false;
  PipelineConfig config = args.has("--digests")
                              ? load_pipeline_on_host(path, args.values("--set"), &moved)
                              : load_pipeline(path, args.values("--set"));
  if (moved) note("--digests hashes host memory: device_copy delivers to the cpu in this run");
  return config;
}

/// Refuses a pipeline a node of which does not fit the launcher's rank and world (a shard
/// resolved for another rank: NodeDef::check_launch).
void check_ranks_match_launcher(const PipelineConfig& config, std::uint64_t rank,
                                std::uint64_t world) {
  config.pipeline.check_launch(rank, world);
}

/// Where and how often a run checkpoints.
struct CheckpointPlan {
  std::string dir;            ///< {rank} replaced; empty: the run does not checkpoint
  bool per_rank_dir = false;  ///< the directory was named with {rank}: each rank's own
  std::uint64_t every = 0;    ///< checkpoint after each step whose (step+1) % every == 0
  std::size_t keep = 0;       ///< the newest checkpoints kept (0: all)
};

/// The checkpoint flags over the pipeline's `checkpoint:`; refuses ranks that would share a
/// directory without a coordinator, and checkpoint flags without a directory.
CheckpointPlan plan_checkpoints(const Args& args, const PipelineConfig& config, std::uint64_t rank,
                                std::uint64_t world,
                                const std::shared_ptr<Coordinator>& coordinator) {
  std::string ckpt_dir = config.checkpoint ? config.checkpoint->dir : "";
  if (auto d = args.value("--checkpoint-dir")) ckpt_dir = *d;
  const bool per_rank_dir = ckpt_dir.find("{rank}") != std::string::npos;
  ckpt_dir = with_rank(ckpt_dir, rank);
  if (!ckpt_dir.empty() && world > 1 && !coordinator && !per_rank_dir)
    throw ConfigError(ckpt_dir, std::to_string(world) +
                                    " ranks would share the checkpoint directory '" + ckpt_dir +
                                    "' without a coordinator (this flowstate was built without "
                                    "MPI, or was not started by an MPI launcher); give each rank "
                                    "its own with --checkpoint-dir '" +
                                    ckpt_dir + "/{rank}'");
  std::uint64_t every = config.checkpoint ? config.checkpoint->every_steps : 0;
  if (auto k = args.uint("--checkpoint-every")) every = *k;
  std::size_t keep = config.checkpoint ? config.checkpoint->keep : 0;
  if (auto k = args.uint("--keep")) keep = static_cast<std::size_t>(*k);
  if (ckpt_dir.empty() &&
      (args.has("--resume") || args.has("--checkpoint-every") || args.has("--overwrite")))
    throw UsageError(std::string(args.has("--resume")      ? "--resume"
                                 : args.has("--overwrite") ? "--overwrite"
                                                           : "--checkpoint-every") +
                     " needs a checkpoint directory (--checkpoint-dir, or checkpoint.dir in "
                     "the pipeline)");
  if (args.has("--resume") && args.has("--overwrite"))
    throw UsageError("--resume and --overwrite exclude each other");
  return {ckpt_dir, per_rank_dir, every, keep};
}

/// Without --resume, refuses a checkpoint directory that holds checkpoints, or with
/// --overwrite discards them.
void refuse_or_discard_checkpoints(const Args& args, const std::string& ckpt_dir) {
  if (ckpt_dir.empty() || args.has("--resume")) return;
  // A fresh run must not write its step-10 among another run's checkpoints: a resume would
  // take theirs (or, pruned by `keep`, lose them).
  const CheckpointEvidence evidence = find_checkpoint_evidence(ckpt_dir);
  if (!evidence.empty() && !args.has("--overwrite"))
    throw ConfigError(ckpt_dir, ckpt_dir + " holds checkpoints" +
                                    (evidence.highest_step
                                         ? " up to step " + std::to_string(*evidence.highest_step)
                                         : std::string()) +
                                    "; pass --resume to continue or --overwrite to discard them");
  if (!evidence.empty()) {
    remove_checkpoints(ckpt_dir);
    note("discarded the checkpoints in '" + ckpt_dir + "' (--overwrite)");
  }
}

/// The Loader's options: the pipeline's, with the flags over them.
LoaderOptions run_loader_options(const Args& args, const PipelineConfig& config, const RunArgs& run,
                                 const CheckpointPlan& plan,
                                 const std::shared_ptr<Coordinator>& coordinator) {
  LoaderOptions options;
  options.epochs = args.uint("--epochs").value_or(config.epochs);
  if (run.workers) options.workers = static_cast<int>(*run.workers);
  if (!plan.per_rank_dir) options.coordinator = coordinator;
  // Remote sources list once per job: saved here, read again by a resume (on rank 0).
  options.checkpoint_dir = plan.dir;
  // The job's cache defaults (a source's cache option is over them, the environment under).
  if (auto d = args.value("--cache-dir")) {
    if (d->empty()) throw UsageError("--cache-dir expects a directory");
    options.cache_dir = std::filesystem::absolute(*d).string();
  }
  if (auto l = args.value("--cache-limit")) {
    try {
      options.cache_limit = parse_byte_size(*l, "--cache-limit");
    } catch (const ConfigError& e) {
      throw UsageError(std::string("--cache-limit: ") + e.what());
    }
    if (options.cache_limit == 0) throw UsageError("--cache-limit must be more than 0 bytes");
  }
  options.trace = args.value("--trace").value_or("");
  options.metrics = args.value("--metrics").value_or("");
  if (auto d = args.value("--data-changed")) {
    if (*d != "continue" && *d != "refuse")
      throw UsageError("--data-changed expects 'continue' or 'refuse', got '" + *d + "'");
    if (!args.has("--resume")) throw UsageError("--data-changed needs --resume");
    options.on_data_change = *d == "continue" ? OnDataChange::kContinue : OnDataChange::kRefuse;
  }
  if (auto m = args.value("--metrics-interval")) {
    options.metrics_interval_s = parse_seconds(*m, "--metrics-interval");
    if (options.metrics.empty()) throw UsageError("--metrics-interval needs --metrics FILE");
  }
  return options;
}

/// --resume: restores the newest checkpoint under `ckpt_dir` that verifies. Returns the steps
/// it had consumed; nullopt for a fresh start.
std::optional<std::uint64_t> resume(Loader& loader, const std::string& ckpt_dir) {
  std::optional<CheckpointFound> found = loader.restore(ckpt_dir);
  if (!found) {
    // (Checkpoints that all fail to verify are a CheckpointError, not a fresh start.)
    note("no checkpoint in '" + ckpt_dir + "'; starting from the beginning");
    return std::nullopt;
  }
  for (const auto& s : found->skipped) note("skipped checkpoint " + s);
  note("resumed from " + found->path + ": continuing with step " + std::to_string(found->step));
  return found->step;
}

/// Skips the --skip ranges that the loader's state does not hold yet; returns every range the
/// loader skips.
Skips add_skips(Loader& loader, const Skips& new_skips) {
  Skips skips = loader.state_struct().skips;
  for (const auto& [a, b] : new_skips) {
    const bool known = std::any_of(skips.begin(), skips.end(), [&, a = a, b = b](const auto& r) {
      return r.first <= a && b <= r.second;
    });
    if (known) continue;  // already in the state (a resumed run given the same --skip)
    loader.skip(a, b);
    skips = loader.state_struct().skips;
  }
  return skips;
}

/// Consumes a run's batches — digests, provenance, progress and the periodic checkpoints of
/// each — until the end of data, --steps or a signal, then writes the last checkpoint and
/// reports.
class RunLoop {
 public:
  RunLoop(Loader& loader, const LoaderOptions& options, const CheckpointPlan& plan,
          const RunArgs& run, std::optional<std::uint64_t> checkpointed, Skips skips,
          LineOutput& digests, LineOutput& provenance, Progress& progress)
      : loader_(loader),
        options_(options),
        plan_(plan),
        steps_(run.steps),
        checkpointed_(checkpointed),
        skips_(std::move(skips)),
        digests_(digests),
        provenance_(provenance),
        progress_(progress),
        last_(loader.last_step()),
        weights_(run.weights) {
    // The data changes of this run so far (its resume's): the earlier ones are in the
    // provenance of the runs that made them.
    const std::uint64_t from = last_ ? *last_ + 1 : 0;
    const auto& changes = loader_.data_changes();
    changes_written_ = changes.size();
    while (changes_written_ > 0 && changes[changes_written_ - 1].step >= from) --changes_written_;
    report_changes();
  }

  /// Runs until the run stops; returns the signal that stopped it (0: none). With a
  /// coordinator every rank stops at the same step.
  int run() {
    int stopped_by = 0;  // the signal that stopped the run
    bool ended = false;  // the loader has no more batches
    for (;;) {
      const std::uint64_t next = next_delivered(last_ ? *last_ + 1 : 0, skips_);
      const bool at_steps = steps_ && next >= *steps_;
      int sig = g_signal.load();
      bool all_done = ended || at_steps;
      if (options_.coordinator) {
        // The ranks stop at the same batch, so that their last checkpoint is of one step. They
        // agree at every kAgreeEvery-th step and whenever one is done (end of data, --steps;
        // in step on every rank but with uneven: allow): a signal (mpirun forwards it to every
        // rank, each sees it at its own moment) stops all at the next agreement, and a rank
        // that is done waits there for the others. One small collective per kAgreeEvery
        // batches, in the same order as the checkpoints' on every rank.
        if (all_done || next % kAgreeEvery == 0) {
          const std::string mine = std::to_string(sig) + (all_done ? " done" : " more");
          for (const auto& s : options_.coordinator->all_gather(mine)) {
            if (sig == 0) sig = std::stoi(s);
            all_done = all_done && s.ends_with(" done");
          }
        } else {
          sig = 0;  // until the next agreement
        }
      }
      if (all_done) {
        reason_ = ended           ? "end of data"
                  : batches_ == 0 ? "already at --steps " + std::to_string(*steps_)
                                  : "reached --steps " + std::to_string(*steps_);
        break;
      }
      if (sig != 0) {
        reason_ = std::string("interrupted by ") + (sig == SIGTERM ? "SIGTERM" : "SIGINT");
        stopped_by = sig;
        break;
      }
      if (ended || at_steps) continue;  // waiting for the other ranks
      apply_weights(next);
      std::optional<Batch> b = loader_.next();
      if (!b) {
        ended = true;
        continue;
      }
      consume(*b);
    }
    return stopped_by;
  }

  /// After run(): the checkpoint in flight committed, and one of the last delivered batch
  /// when the last checkpoint is older.
  void checkpoint_at_end() {
    finish_pending();
    progress_.clear();
    if (!plan_.dir.empty() && last_ && checkpointed_ != *last_ + 1) {
      last_checkpoint_ = loader_.save_checkpoint(plan_.dir, {.keep = plan_.keep});
      note("checkpoint " + last_checkpoint_);
    }
  }

  /// "run finished (REASON): ..." with the rates since `start`.
  void report(Clock::time_point start, std::uint64_t rank, std::uint64_t world) const {
    const double secs = std::max(seconds_since(start), 1e-9);
    std::string summary = (world > 1 ? "rank " + std::to_string(rank) + ": " : std::string()) +
                          "run finished (" + reason_ + "): " + std::to_string(batches_) +
                          " batches";
    if (first_step_)
      summary += ", steps " + std::to_string(*first_step_) + ".." + std::to_string(*last_) +
                 ", epoch " + std::to_string(*last_epoch_);
    char rates[160];
    std::snprintf(rates, sizeof(rates), ", %llu samples, %s in %.3f s (%ssamples/s, %s/s)",
                  static_cast<unsigned long long>(samples_),
                  format_bytes(static_cast<double>(bytes_)).c_str(), secs,
                  format_count(static_cast<double>(samples_) / secs).c_str(),
                  format_bytes(static_cast<double>(bytes_) / secs).c_str());
    note(summary + rates);
  }

 private:
  /// The batch's --digests and --provenance lines.
  void write_lines(const Batch& b) {
    const BatchInfo& info = b.info;
    const std::string prefix = std::to_string(info.step) + " " + std::to_string(info.epoch) + " " +
                               std::to_string(info.index_in_epoch);
    if (digests_) digests_.write(prefix + " " + hex64(b.digest()));
    if (provenance_) {
      std::string line = prefix;
      for (const Ref& r : info.refs) {
        line += ' ';
        line += r.to_string();
      }
      provenance_.write(line);
    }
  }

  /// One delivered batch: counted, its digest and provenance lines, progress, and the
  /// periodic checkpoint.
  void consume(const Batch& batch) {
    const Batch* b = &batch;
    const BatchInfo& info = b->info;
    last_ = info.step;
    if (!first_step_) first_step_ = info.step;
    last_epoch_ = info.epoch;
    ++batches_;
    samples_ += info.num_samples;
    const std::uint64_t nbytes = batch_bytes(*b);
    bytes_ += nbytes;
    if (digests_ || provenance_) write_lines(*b);
    std::optional<std::uint64_t> total = steps_;
    if (!total && options_.epochs > 0 && info.batches_in_epoch)
      total = options_.epochs * *info.batches_in_epoch;
    progress_.batch(*b, nbytes, total);
    if (!plan_.dir.empty() && plan_.every > 0 && (info.step + 1) % plan_.every == 0)
      checkpoint(info);
  }

  /// The scheduled weights due by step `next` (MixWeightsSchedule::apply).
  void apply_weights(std::uint64_t next) {
    if (weights_.apply(loader_, next)) report_changes();
  }

  /// The data changes not reported yet: a note each, and '#' lines in the provenance.
  void report_changes() {
    const auto& changes = loader_.data_changes();
    for (; changes_written_ < changes.size(); ++changes_written_) {
      const DataChangeRecord& c = changes[changes_written_];
      std::string what = c.what;
      for (std::size_t at = what.find('\n'); at != std::string::npos; at = what.find('\n', at))
        what.replace(at, 1, "; ");
      note("data change at step " + std::to_string(c.step) + ": " + what);
      if (provenance_)
        provenance_.write("# data change at step " + std::to_string(c.step) + ": " + what);
    }
  }

  /// The periodic checkpoint after `info`'s batch: asynchronous, or collective on this thread.
  void checkpoint(const BatchInfo& info) {
    finish_pending();
    if (options_.coordinator) {
      // Collective: on this thread, in the same order as the per-batch stop check.
      last_checkpoint_ = loader_.save_checkpoint(plan_.dir, {.keep = plan_.keep});
      progress_.clear();
      note("checkpoint " + last_checkpoint_);
    } else {
      pending_ = loader_.save_checkpoint_async(plan_.dir, {.keep = plan_.keep});
    }
    checkpointed_ = info.step + 1;
  }

  /// Waits for the asynchronous checkpoint in flight, if any.
  void finish_pending() {
    if (!pending_.valid()) return;
    last_checkpoint_ = pending_.get();
    progress_.clear();
    note("checkpoint " + last_checkpoint_);
  }

  Loader& loader_;
  const LoaderOptions& options_;
  const CheckpointPlan& plan_;
  const std::optional<std::uint64_t> steps_;
  std::optional<std::uint64_t> checkpointed_;  // steps consumed at the last checkpoint
  const Skips skips_;
  LineOutput& digests_;
  LineOutput& provenance_;
  Progress& progress_;
  std::optional<std::uint64_t> last_;  // the last delivered step
  std::optional<std::uint64_t> first_step_, last_epoch_;
  std::uint64_t batches_ = 0, samples_ = 0, bytes_ = 0;
  std::future<std::string> pending_;
  std::string last_checkpoint_;
  std::string reason_;  // why run() stopped
  MixWeightsSchedule weights_;
  std::size_t changes_written_ = 0;  // loader_.data_changes() reported
};

int run_ranks(std::span<const std::string> argv, std::shared_ptr<Coordinator> coordinator) {
  Args args(argv,
            {"--steps", "--epochs", "--checkpoint-dir", "--checkpoint-every", "--keep", "--skip",
             "--set", "--digests", "--provenance", "--workers", "--progress-interval", "--trace",
             "--metrics", "--metrics-interval", "--data-changed", "--mix-weights",
             "--weights-schedule", "--cache-dir", "--cache-limit"},
            {"--resume", "--overwrite"});
  if (args.help()) {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  const RunArgs run = parse_run_args(args);
  const PipelineConfig config = load_run_pipeline(args, run.path);

  const LaunchEnv env = launch_env("flowstate run");
  const std::uint64_t rank = coordinator ? coordinator->rank() : env.rank.value_or(0);
  const std::uint64_t world = coordinator ? coordinator->world() : env.world.value_or(1);
  check_ranks_match_launcher(config, rank, world);

  const CheckpointPlan plan = plan_checkpoints(args, config, rank, world, coordinator);
  // The directory is this run's (this job's, ranks sharing it) until the process ends: a
  // second run on it is refused now, before it reads or discards anything.
  const std::optional<RunLock> held =
      plan.dir.empty()
          ? std::nullopt
          : hold_checkpoint_directory(plan.dir, plan.per_rank_dir ? nullptr : coordinator.get());
  refuse_or_discard_checkpoints(args, plan.dir);

  const LoaderOptions options = run_loader_options(args, config, run, plan, coordinator);
  Loader loader(config.pipeline, options);
  std::optional<std::uint64_t> checkpointed;  // steps consumed at the last checkpoint
  if (args.has("--resume")) checkpointed = resume(loader, plan.dir);
  Skips skips = add_skips(loader, run.skips);

  LineOutput digests(with_rank(args.value("--digests"), rank), "--digests");
  LineOutput provenance(with_rank(args.value("--provenance"), rank), "--provenance");
  SignalScope signals;
  Progress progress(run.progress_interval);
  const auto start = Clock::now();
  RunLoop loop(loader, options, plan, run, checkpointed, std::move(skips), digests, provenance,
               progress);
  const int stopped_by = loop.run();
  loop.checkpoint_at_end();
  loop.report(start, rank, world);
  // Stopped by a signal: the conventional 128 + signal, after the final checkpoint above.
  return stopped_by != 0 ? 128 + stopped_by : kExitOk;
}

}  // namespace

int cmd_run(std::span<const std::string> argv) {
  std::shared_ptr<Coordinator> coordinator;
#ifdef FLOWSTATE_HAVE_MPI
  // MPI's libraries are loaded (a module) only under a launcher: cli/mpi_module.h.
  if (under_mpi_launcher()) coordinator = load_mpi_coordinator();
  try {
    return run_ranks(argv, coordinator);
  } catch (...) {
    // Other ranks may be waiting in a collective this rank never joins: MPI_Finalize would
    // wait for them. Exiting unfinalized has the launcher end the job.
    if (coordinator) skip_mpi_finalize(*coordinator);
    throw;
  }
#else
  return run_ranks(argv, coordinator);
#endif
}

}  // namespace flowstate::cli
