// `flowstate verify`: proves exact resume for the user's own pipeline. An uninterrupted run of
// N steps gives the reference digests; then checkpoints are written through real files at
// random steps, and each is restored into a fresh Loader (with another worker count) that runs
// on to step N. Every restored batch must equal the reference: step, epoch, position, end of
// epoch mark and digest.
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "cli/command.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/rng.h"
#include "graph/loader.h"

namespace flowstate::cli {
namespace {

constexpr const char* kUsage =
    "usage: flowstate verify PIPELINE.yaml --steps N [--trials T] [--seed S] [options]\n\n"
    "Runs the pipeline uninterrupted for N steps, then T times: checkpoints it at a random\n"
    "step k through real checkpoint files, restores the checkpoint into a new loader\n"
    "(with 1, 3 or 2 workers in turn) and runs it on to step N, comparing every batch with\n"
    "the uninterrupted run. Prints every mismatch; exit status 1 when there is one.\n\n"
    "  --steps N          batches of the reference run (required)\n"
    "  --trials T         restores to check (default 5)\n"
    "  --seed S           seed choosing the restore steps (default 1)\n"
    "  --epochs E         epochs (default: the pipeline's)\n"
    "  --workers W        workers of the reference run (default: the pipeline's)\n"
    "  --set KEY=VALUE    override a pipeline value (repeatable)\n";

struct Trace {
  std::uint64_t step, epoch, index;
  bool last;
  std::uint64_t digest;
  bool operator==(const Trace&) const = default;
};

Trace trace(const Batch& b) {
  return {b.info.step, b.info.epoch, b.info.index_in_epoch, b.info.is_last_in_epoch, b.digest()};
}

std::string describe(const Trace& t) {
  return "step " + std::to_string(t.step) + " epoch " + std::to_string(t.epoch) + " index " +
         std::to_string(t.index) + (t.last ? " (last in epoch)" : "") + " digest " +
         hex64(t.digest);
}

/// A fresh temporary directory, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "flowstate-verify-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr)
      throw CheckpointError(tmpl, "cannot create a temporary directory for verify");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace

int cmd_verify(std::span<const std::string> argv) {
  Args args(argv, {"--steps", "--trials", "--seed", "--epochs", "--workers", "--set"});
  if (args.help()) {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  if (args.positional().size() != 1) throw UsageError("expected one pipeline file");
  args.required("--steps");
  const std::uint64_t steps = *args.uint("--steps", 1);
  const std::uint64_t trials = args.uint("--trials", 1, 10'000).value_or(5);
  const std::uint64_t seed = args.uint("--seed").value_or(1);

  const PipelineConfig config = load_pipeline_on_host(args.positional()[0], args.values("--set"));
  LoaderOptions options;
  options.epochs = args.uint("--epochs").value_or(config.epochs);
  if (auto w = args.uint("--workers", 1, 1024)) options.workers = static_cast<int>(*w);

  std::vector<Trace> reference;
  {
    Loader loader(config.pipeline, options);
    while (reference.size() < steps) {
      std::optional<Batch> b = loader.next();
      if (!b) break;
      reference.push_back(trace(*b));
    }
  }
  const std::size_t n = reference.size();
  if (n == 0) throw ConfigError("", "the pipeline delivers no batches: nothing to verify");
  std::printf("reference: %zu batches uninterrupted (steps %llu..%llu)%s\n", n,
              static_cast<unsigned long long>(reference.front().step),
              static_cast<unsigned long long>(reference.back().step),
              n < steps ? " (the pipeline ends there)" : "");

  // Distinct restore points k in [0, n]: k batches consumed before the checkpoint.
  std::set<std::size_t> points;
  const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(trials, n + 1));
  for (std::uint64_t draw = 0; points.size() < want; ++draw)
    points.insert(static_cast<std::size_t>(bounded(philox64(seed, 0, draw), n + 1)));

  // One loader writes every checkpoint, each into its own directory (its own LATEST).
  TempDir tmp;
  std::vector<std::pair<std::size_t, std::string>> saved;
  std::size_t mismatches = 0;
  {
    Loader saver(config.pipeline, options);
    std::size_t consumed = 0;
    for (std::size_t k : points) {
      for (; consumed < k; ++consumed) {
        std::optional<Batch> b = saver.next();
        Trace t = b ? trace(*b) : Trace{};
        if (!b || !(t == reference[consumed])) {
          ++mismatches;
          std::printf("rerun: batch %zu: %s, expected %s\n", consumed,
                      b ? describe(t).c_str() : "no batch", describe(reference[consumed]).c_str());
        }
      }
      const std::string dir = tmp / ("trial-" + std::to_string(saved.size() + 1));
      saver.save_checkpoint(dir);
      saved.emplace_back(k, dir);
    }
  }

  int t = 0;
  for (const auto& [k, dir] : saved) {
    ++t;
    // Worker counts are free: a restore with other ones must give the same batches.
    static constexpr int kWorkers[] = {1, 3, 2};
    const int workers = kWorkers[(t - 1) % 3];
    LoaderOptions restore_options = options;
    restore_options.workers = workers;
    Loader loader(config.pipeline, restore_options);
    std::optional<CheckpointFound> found = loader.restore(dir);
    if (!found)
      throw CheckpointError(dir, "the checkpoint just written to '" + dir + "' does not verify");
    std::size_t bad = 0;
    for (std::size_t i = k; i < n; ++i) {
      std::optional<Batch> b = loader.next();
      if (!b) {
        std::printf("trial %d: batch %zu: the restored run ended, expected %s\n", t, i,
                    describe(reference[i]).c_str());
        ++bad;
        break;
      }
      Trace got = trace(*b);
      if (!(got == reference[i])) {
        std::printf("trial %d: batch %zu: %s, expected %s\n", t, i, describe(got).c_str(),
                    describe(reference[i]).c_str());
        ++bad;
      }
    }
    mismatches += bad;
    const std::string result = bad == 0 ? std::to_string(n - k) + " batches identical"
                                        : std::to_string(bad) + " mismatches";
    const std::string name = std::filesystem::path(found->path).filename().string();
    std::printf("trial %d: checkpoint after %zu batches (%s), restored with %d worker%s: %s\n", t,
                k, name.c_str(), workers, workers == 1 ? "" : "s", result.c_str());
  }
  std::fflush(stdout);
  if (mismatches > 0) {
    note("verify FAILED: " + std::to_string(mismatches) +
         " batches differ from the "
         "uninterrupted run");
    return kExitFailed;
  }
  note("verify ok: " + std::to_string(saved.size()) +
       " restores reproduced the uninterrupted run exactly (--seed " + std::to_string(seed) + ")");
  return kExitOk;
}

}  // namespace flowstate::cli
