// `flowstate run`: consumes a YAML pipeline as a trainer would — with periodic checkpoints,
// resume, skipped ranges, digests and provenance — and reports its throughput.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <optional>

#include "cli/command.h"
#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"
#include "flowstate/core/launcher.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/sources/mapped_file.h"
#ifdef FLOWSTATE_HAVE_MPI
#include "flowstate/mpi/mpi_coordinator.h"
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
    "  --workers N|auto        batch-assembly workers (free: never changes the batches);\n"
    "                          auto: tuned while running\n"
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
    "  --skip A:B              drop the batches of steps A..B (inclusive; repeatable)\n"
    "  --set KEY=VALUE         override a pipeline value (nodes[1].shuffle.size=1024; repeatable)\n"
    "  --digests FILE|-        append '<step> <epoch> <index_in_epoch> <digest>' per batch\n"
    "  --provenance FILE|-     append '<step> <epoch> <index_in_epoch> <source>:<index>...'\n"
    "                          (a padding sample: <source>:<index>:pad). In the paths of\n"
    "                          --digests, --provenance and --checkpoint-dir, {rank} is\n"
    "                          replaced by this process's rank. A last line that a killed\n"
    "                          run left cut short is dropped before appending\n"
    "  --trace FILE.json       write a timeline of the run (Chrome trace-event JSON: open it in\n"
    "                          Perfetto UI or chrome://tracing): a track per thread, a span per\n"
    "                          node per batch, the consumer's waits, checkpoint phases\n"
    "  --metrics FILE.jsonl    append a JSON line of metrics every --metrics-interval seconds\n"
    "                          (default 1): step, samples/s, MB/s, batches in flight, each\n"
    "                          node's busy share, RSS, checkpoint durations; `flowstate report`\n"
    "                          turns it into an HTML page\n"
    "  --progress-interval S   seconds between progress lines when not on a terminal\n"
    "                          (default 10; 0: a line per batch). A line shows the percent\n"
    "                          done and an ETA when the number of steps is known (--steps,\n"
    "                          or epochs x batches per epoch)\n\n"
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
    "error, 3 data error, 4 checkpoint error.\n";

std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "signal flag must be lock-free");

// Only sets the flag: the main loop checks it between batches.
void on_signal(int sig) { g_signal.store(sig, std::memory_order_relaxed); }

/// Installs the SIGTERM/SIGINT handlers for its lifetime. SA_RESETHAND: a second signal
/// takes the default action, so a stuck run can still be killed.
class SignalScope {
 public:
  SignalScope() {
    g_signal.store(0);
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    ::sigaction(SIGTERM, &sa, &old_term_);
    ::sigaction(SIGINT, &sa, &old_int_);
  }
  ~SignalScope() {
    ::sigaction(SIGTERM, &old_term_, nullptr);
    ::sigaction(SIGINT, &old_int_, nullptr);
  }
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

 private:
  struct sigaction old_term_ {};
  struct sigaction old_int_ {};
};

/// Where the whole lines of `path` end when its last line lacks its newline, else nullopt.
/// A run killed in the middle of a write leaves such a line (Linux stops a write to a file at a
/// page boundary for a fatal signal), and a resumed run appending after it would glue its first
/// line to it. (Mapped: only the pages from the last newline on are read.)
std::optional<std::uintmax_t> cut_last_line(const std::string& path) {
  const MappedFile f(path);
  if (f.size() == 0 || f.data()[f.size() - 1] == std::byte{'\n'}) return std::nullopt;
  const void* nl = ::memrchr(f.data(), '\n', f.size());
  return nl == nullptr ? 0 : static_cast<const std::byte*>(nl) - f.data() + 1;
}

/// An append-only line file ("-": stdout), flushed after every line. A last line that a killed
/// run left cut short is dropped before appending (its batch is delivered again after the
/// resume), so every line of the file stays whole.
class LineOutput {
 public:
  LineOutput(const std::optional<std::string>& path, const std::string& flag) : flag_(flag) {
    if (!path) return;
    path_ = *path;
    if (*path == "-") {
      file_ = stdout;
      return;
    }
    std::error_code ec;
    if (std::filesystem::is_regular_file(*path, ec)) {
      if (const auto whole = cut_last_line(*path)) {
        std::filesystem::resize_file(*path, *whole, ec);
        if (ec)
          throw ConfigError(flag, "cannot drop the cut last line of '" + *path + "' for " + flag +
                                      ": " + ec.message());
        note(flag + " " + *path + ": dropped a last line a killed run left cut short");
      }
    }
    file_ = std::fopen(path->c_str(), "a");
    if (file_ == nullptr)
      throw ConfigError(flag,
                        "cannot open '" + *path + "' for " + flag + ": " + std::strerror(errno));
    owned_ = true;
  }
  ~LineOutput() {
    if (owned_) std::fclose(file_);
  }
  LineOutput(const LineOutput&) = delete;
  LineOutput& operator=(const LineOutput&) = delete;

  explicit operator bool() const { return file_ != nullptr; }
  void write(const std::string& line) {
    if (std::fputs(line.c_str(), file_) < 0 || std::fputc('\n', file_) == EOF ||
        std::fflush(file_) != 0)
      throw Error("cannot write " + flag_ + " file '" + path_ + "': " + std::strerror(errno));
  }

 private:
  std::string flag_;
  std::string path_;
  std::FILE* file_ = nullptr;
  bool owned_ = false;
};

using Clock = std::chrono::steady_clock;

/// A positive number of seconds ("0.5"); UsageError naming `flag` otherwise.
double parse_seconds(const std::string& text, const std::string& flag) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !(v > 0) || v > 1e6)
    throw UsageError(flag + " expects a positive number of seconds, got '" + text + "'");
  return v;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

/// Progress: a live line on a terminal, periodic plain lines otherwise.
class Progress {
 public:
  explicit Progress(double interval) : tty_(::isatty(STDERR_FILENO) == 1), interval_(interval) {
    if (tty_) interval_ = 0.25;
  }

  /// `total`: the steps the run will have scheduled when it ends, when known.
  void batch(const Batch& b, std::uint64_t bytes, std::optional<std::uint64_t> total) {
    samples_ += b.info.num_samples;
    bytes_ += bytes;
    ++batches_;
    const double dt = seconds_since(since_);
    if (dt < interval_) return;
    char line[320];
    int n = std::snprintf(line, sizeof(line), "step %llu  epoch %llu  %ssamples/s  %s/s",
                          static_cast<unsigned long long>(b.info.step),
                          static_cast<unsigned long long>(b.info.epoch),
                          format_count(static_cast<double>(samples_) / dt).c_str(),
                          format_bytes(static_cast<double>(bytes_) / dt).c_str());
    if (total && *total > b.info.step) {
      // The ETA assumes the rest goes at this run's average rate so far.
      const std::uint64_t done = b.info.step + 1, left = *total - done;
      const double rate = static_cast<double>(batches_) / std::max(seconds_since(start_), 1e-9);
      std::snprintf(line + n, sizeof(line) - static_cast<std::size_t>(n), "  %.1f%%  ETA %s",
                    100.0 * static_cast<double>(done) / static_cast<double>(*total),
                    format_duration(static_cast<double>(left) / rate).c_str());
    }
    if (tty_) {
      std::fprintf(stderr, "\r\033[K%s", line);
      std::fflush(stderr);
      live_ = true;
    } else {
      note(line);
    }
    samples_ = 0;
    bytes_ = 0;
    since_ = Clock::now();
  }
  /// Ends the live line before other output.
  void clear() {
    if (live_) std::fprintf(stderr, "\r\033[K");
    live_ = false;
  }

 private:
  /// "42s", "3m05s", "2h07m".
  static std::string format_duration(double s) {
    const auto t = static_cast<unsigned long long>(std::min(s, 1e9) + 0.5);
    char buf[48];
    if (t >= 3600)
      std::snprintf(buf, sizeof(buf), "%lluh%02llum", t / 3600, t % 3600 / 60);
    else if (t >= 60)
      std::snprintf(buf, sizeof(buf), "%llum%02llus", t / 60, t % 60);
    else
      std::snprintf(buf, sizeof(buf), "%llus", t);
    return buf;
  }

  bool tty_;
  double interval_;
  bool live_ = false;
  Clock::time_point start_ = Clock::now();
  Clock::time_point since_ = start_;
  std::uint64_t samples_ = 0, bytes_ = 0, batches_ = 0;
};

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

/// Steps between the ranks' agreements on whether to stop (see run_ranks): the most batches a
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

/// True when an MPI launcher started this process (mpirun, or a PMI/PMIx one).
bool under_mpi_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (const char* s = std::getenv(v); s != nullptr && *s != '\0') return true;
  return false;
}

std::uint64_t batch_bytes(const Batch& b) {
  std::uint64_t n = 0;
  for (const auto& [id, t] : b.fields) n += t.nbytes();
  return n;
}

int run_ranks(std::span<const std::string> argv, std::shared_ptr<Coordinator> coordinator) {
  Args args(argv,
            {"--steps", "--epochs", "--checkpoint-dir", "--checkpoint-every", "--keep", "--skip",
             "--set", "--digests", "--provenance", "--workers", "--progress-interval", "--trace",
             "--metrics", "--metrics-interval"},
            {"--resume", "--overwrite"});
  if (args.help()) {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  if (args.positional().size() != 1)
    throw UsageError("expected one pipeline file, got " + std::to_string(args.positional().size()) +
                     " arguments");
  const std::string path = args.positional()[0];
  const std::optional<std::uint64_t> steps = args.uint("--steps");
  const bool auto_workers = args.value("--workers") == "auto";
  const std::optional<std::uint64_t> workers =
      auto_workers ? std::optional<std::uint64_t>(kAuto) : args.uint("--workers", 1, 1024);
  const double interval = static_cast<double>(args.uint("--progress-interval").value_or(10));
  std::vector<std::pair<std::uint64_t, std::uint64_t>> new_skips;
  for (const auto& s : args.values("--skip")) new_skips.push_back(parse_skip(s));

  bool moved = false;
  const PipelineConfig config = args.has("--digests")
                                    ? load_pipeline_on_host(path, args.values("--set"), &moved)
                                    : load_pipeline(path, args.values("--set"));
  if (moved) note("--digests hashes host memory: device_copy delivers to the cpu in this run");

  const LaunchEnv env = launch_env("flowstate run");
  const std::uint64_t rank = coordinator ? coordinator->rank() : env.rank.value_or(0);
  const std::uint64_t world = coordinator ? coordinator->world() : env.world.value_or(1);
  config.pipeline.check_launch(rank, world);

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
  if (!ckpt_dir.empty() && !args.has("--resume")) {
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

  LoaderOptions options;
  options.epochs = args.uint("--epochs").value_or(config.epochs);
  if (workers) options.workers = static_cast<int>(*workers);
  if (!per_rank_dir) options.coordinator = coordinator;
  options.trace = args.value("--trace").value_or("");
  options.metrics = args.value("--metrics").value_or("");
  if (auto m = args.value("--metrics-interval")) {
    options.metrics_interval_s = parse_seconds(*m, "--metrics-interval");
    if (options.metrics.empty()) throw UsageError("--metrics-interval needs --metrics FILE");
  }
  Loader loader(config.pipeline, options);

  std::optional<std::uint64_t> checkpointed;  // steps consumed at the last checkpoint
  if (args.has("--resume")) {
    std::optional<CheckpointFound> found = loader.restore(ckpt_dir);
    if (found) {
      for (const auto& s : found->skipped) note("skipped checkpoint " + s);
      note("resumed from " + found->path + ": continuing with step " + std::to_string(found->step));
      checkpointed = found->step;
    } else {
      // (Checkpoints that all fail to verify are a CheckpointError, not a fresh start.)
      note("no checkpoint in '" + ckpt_dir + "'; starting from the beginning");
    }
  }
  std::vector<std::pair<std::uint64_t, std::uint64_t>> skips = loader.state_struct().skips;
  for (const auto& [a, b] : new_skips) {
    const bool known = std::any_of(skips.begin(), skips.end(), [&, a = a, b = b](const auto& r) {
      return r.first <= a && b <= r.second;
    });
    if (known) continue;  // already in the state (a resumed run given the same --skip)
    loader.skip(a, b);
    skips = loader.state_struct().skips;
  }

  LineOutput digests(with_rank(args.value("--digests"), rank), "--digests");
  LineOutput provenance(with_rank(args.value("--provenance"), rank), "--provenance");
  SignalScope signals;
  Progress progress(interval);
  const auto start = Clock::now();

  std::optional<std::uint64_t> last = loader.last_step();
  std::optional<std::uint64_t> first_step, last_epoch;
  std::uint64_t batches = 0, samples = 0, bytes = 0;
  std::future<std::string> pending;
  std::string last_checkpoint;
  auto finish_pending = [&] {
    if (!pending.valid()) return;
    last_checkpoint = pending.get();
    progress.clear();
    note("checkpoint " + last_checkpoint);
  };

  auto consume = [&](const Batch& batch) {
    const Batch* b = &batch;
    const BatchInfo& info = b->info;
    last = info.step;
    if (!first_step) first_step = info.step;
    last_epoch = info.epoch;
    ++batches;
    samples += info.num_samples;
    const std::uint64_t nbytes = batch_bytes(*b);
    bytes += nbytes;
    const std::string prefix = std::to_string(info.step) + " " + std::to_string(info.epoch) + " " +
                               std::to_string(info.index_in_epoch);
    if (digests) digests.write(prefix + " " + hex64(b->digest()));
    if (provenance) {
      std::string line = prefix;
      for (const Ref& r : info.refs) line += " " + r.to_string();
      provenance.write(line);
    }
    std::optional<std::uint64_t> total = steps;
    if (!total && options.epochs > 0 && info.batches_in_epoch)
      total = options.epochs * *info.batches_in_epoch;
    progress.batch(*b, nbytes, total);
    if (!ckpt_dir.empty() && every > 0 && (info.step + 1) % every == 0) {
      finish_pending();
      if (options.coordinator) {
        // Collective: on this thread, in the same order as the per-batch stop check.
        last_checkpoint = loader.save_checkpoint(ckpt_dir, {.keep = keep});
        progress.clear();
        note("checkpoint " + last_checkpoint);
      } else {
        pending = loader.save_checkpoint_async(ckpt_dir, {.keep = keep});
      }
      checkpointed = info.step + 1;
    }
  };

  std::string reason;
  int stopped_by = 0;  // the signal that stopped the run
  bool ended = false;  // the loader has no more batches
  for (;;) {
    const std::uint64_t next = next_delivered(last ? *last + 1 : 0, skips);
    const bool at_steps = steps && next >= *steps;
    int sig = g_signal.load();
    bool all_done = ended || at_steps;
    if (options.coordinator) {
      // The ranks stop at the same batch, so that their last checkpoint is of one step. They
      // agree at every kAgreeEvery-th step and whenever one is done (end of data, --steps;
      // in step on every rank but with uneven: allow): a signal (mpirun forwards it to every
      // rank, each sees it at its own moment) stops all at the next agreement, and a rank that
      // is done waits there for the others. One small collective per kAgreeEvery batches, in
      // the same order as the checkpoints' on every rank.
      if (all_done || next % kAgreeEvery == 0) {
        const std::string mine = std::to_string(sig) + (all_done ? " done" : " more");
        for (const auto& s : options.coordinator->all_gather(mine)) {
          if (sig == 0) sig = std::stoi(s);
          all_done = all_done && s.ends_with(" done");
        }
      } else {
        sig = 0;  // until the next agreement
      }
    }
    if (all_done) {
      reason = ended          ? "end of data"
               : batches == 0 ? "already at --steps " + std::to_string(*steps)
                              : "reached --steps " + std::to_string(*steps);
      break;
    }
    if (sig != 0) {
      reason = std::string("interrupted by ") + (sig == SIGTERM ? "SIGTERM" : "SIGINT");
      stopped_by = sig;
      break;
    }
    if (ended || at_steps) continue;  // waiting for the other ranks
    std::optional<Batch> b = loader.next();
    if (!b) {
      ended = true;
      continue;
    }
    consume(*b);
  }
  finish_pending();
  progress.clear();
  if (!ckpt_dir.empty() && last && checkpointed != *last + 1) {
    last_checkpoint = loader.save_checkpoint(ckpt_dir, {.keep = keep});
    note("checkpoint " + last_checkpoint);
  }

  const double secs = std::max(seconds_since(start), 1e-9);
  std::string summary = (world > 1 ? "rank " + std::to_string(rank) + ": " : std::string()) +
                        "run finished (" + reason + "): " + std::to_string(batches) + " batches";
  if (first_step)
    summary += ", steps " + std::to_string(*first_step) + ".." + std::to_string(*last) +
               ", epoch " + std::to_string(*last_epoch);
  char rates[160];
  std::snprintf(rates, sizeof(rates), ", %llu samples, %s in %.3f s (%ssamples/s, %s/s)",
                static_cast<unsigned long long>(samples),
                format_bytes(static_cast<double>(bytes)).c_str(), secs,
                format_count(static_cast<double>(samples) / secs).c_str(),
                format_bytes(static_cast<double>(bytes) / secs).c_str());
  note(summary + rates);
  // Stopped by a signal: the conventional 128 + signal, after the final checkpoint above.
  return stopped_by != 0 ? 128 + stopped_by : kExitOk;
}

}  // namespace

int cmd_run(std::span<const std::string> argv) {
  std::shared_ptr<Coordinator> coordinator;
#ifdef FLOWSTATE_HAVE_MPI
  std::shared_ptr<MpiCoordinator> mpi;
  if (under_mpi_launcher()) coordinator = mpi = std::make_shared<MpiCoordinator>();
  try {
    return run_ranks(argv, coordinator);
  } catch (...) {
    // Other ranks may be waiting in a collective this rank never joins: MPI_Finalize would
    // wait for them. Exiting unfinalized has the launcher end the job.
    if (mpi) mpi->skip_finalize();
    throw;
  }
#else
  return run_ranks(argv, coordinator);
#endif
}

}  // namespace flowstate::cli
