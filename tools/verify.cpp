#include "flowstate/tools/verify.h"

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <utility>

#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"
#include "flowstate/core/rng.h"
#include "flowstate/graph/loader.h"

namespace flowstate {
namespace {

VerifyBatch trace(const Batch& b) {
  return {b.info.step, b.info.epoch, b.info.index_in_epoch, b.info.is_last_in_epoch, b.digest()};
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

std::string reference_line(const VerifyReport& r) {
  return "reference: " + std::to_string(r.reference.size()) + " batches uninterrupted (steps " +
         std::to_string(r.reference.front().step) + ".." + std::to_string(r.reference.back().step) +
         ")" + (r.pipeline_ended ? " (the pipeline ends there)" : "");
}

void validate(const VerifyOptions& o) {
  if (o.steps == 0) throw ConfigError("steps", "steps must be at least 1");
  if (o.trials < 1) throw ConfigError("trials", "trials must be at least 1");
  if (o.workers && !is_workers_setting(*o.workers))
    throw ConfigError("workers", "workers must be at least 1, auto (0) or inline (-1)");
  if (o.restore_workers.empty())
    throw ConfigError("restore_workers", "restore_workers needs at least one worker count");
  for (int w : o.restore_workers)
    if (w < 1 && w != static_cast<int>(kInline))
      throw ConfigError("restore_workers",
                        "every restore_workers count must be >= 1 or inline (-1)");
}

}  // namespace

std::string VerifyBatch::describe() const {
  return "step " + std::to_string(step) + " epoch " + std::to_string(epoch) + " index " +
         std::to_string(index_in_epoch) + (is_last_in_epoch ? " (last in epoch)" : "") +
         " digest " + hex64(digest);
}

std::string VerifyMismatch::describe() const {
  const std::string where = trial == 0 ? std::string("rerun") : "trial " + std::to_string(trial);
  const std::string delivered = got          ? got->describe()
                                : trial == 0 ? "no batch"
                                             : "the restored run ended";
  return where + ": batch " + std::to_string(batch) + ": " + delivered + ", expected " +
         expected.describe();
}

std::string VerifyTrial::describe() const {
  const std::string result = mismatches == 0 ? std::to_string(compared) + " batches identical"
                                             : std::to_string(mismatches) + " mismatches";
  const std::string how =
      workers == static_cast<int>(kInline)
          ? "inline"
          : "with " + std::to_string(workers) + " worker" + (workers == 1 ? "" : "s");
  return "trial " + std::to_string(number) + ": checkpoint after " +
         std::to_string(restored_after) + " batches (" + checkpoint + "), restored " + how + ": " +
         result;
}

std::string VerifyReport::summary() const {
  if (reference.empty()) return "";
  std::string out = reference_line(*this) + "\n";
  for (const auto& m : mismatches)
    if (m.trial == 0) out += m.describe() + "\n";
  for (const auto& t : trials) {
    for (const auto& m : mismatches)
      if (m.trial == t.number) out += m.describe() + "\n";
    out += t.describe() + "\n";
  }
  return out;
}

VerifyReport verify(const Pipeline& pipeline, const VerifyOptions& options) {
  validate(options);
  auto emit = [&](const std::string& line) {
    if (options.progress) options.progress(line);
  };
  LoaderOptions loader_options;
  if (options.epochs) loader_options.epochs = *options.epochs;
  loader_options.workers = options.workers;

  VerifyReport report;
  std::vector<VerifyBatch>& reference = report.reference;
  {
    Loader loader(pipeline, loader_options);
    MixWeightsSchedule weights(options.mix_weights);
    while (reference.size() < options.steps) {
      weights.apply(loader);
      std::optional<Batch> b = loader.next();
      if (!b) break;
      reference.push_back(trace(*b));
    }
  }
  const std::size_t n = reference.size();
  if (n == 0) throw ConfigError("", "the pipeline delivers no batches: nothing to verify");
  report.pipeline_ended = n < options.steps;
  emit(reference_line(report));

  // Distinct restore points k in [0, n]: k batches consumed before the checkpoint.
  std::set<std::size_t> points;
  const auto trials = static_cast<std::uint64_t>(options.trials);
  const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(trials, n + 1));
  for (std::uint64_t draw = 0; points.size() < want; ++draw)
    points.insert(static_cast<std::size_t>(bounded(philox64(options.seed, 0, draw), n + 1)));

  // One loader writes every checkpoint, each into its own directory (its own LATEST).
  TempDir tmp;
  std::vector<std::pair<std::size_t, std::string>> saved;
  {
    Loader saver(pipeline, loader_options);
    MixWeightsSchedule weights(options.mix_weights);
    std::size_t consumed = 0;
    for (std::size_t k : points) {
      for (; consumed < k; ++consumed) {
        weights.apply(saver);
        std::optional<Batch> b = saver.next();
        std::optional<VerifyBatch> got;
        if (b) got = trace(*b);
        if (!got || !(*got == reference[consumed])) {
          report.mismatches.push_back({0, consumed, reference[consumed], got});
          emit(report.mismatches.back().describe());
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
    const int workers =
        options.restore_workers[static_cast<std::size_t>(t - 1) % options.restore_workers.size()];
    LoaderOptions restore_options = loader_options;
    restore_options.workers = workers;
    Loader loader(pipeline, restore_options);
    std::optional<CheckpointFound> found = loader.restore(dir);
    if (!found)
      throw CheckpointError(dir, "the checkpoint just written to '" + dir + "' does not verify");
    VerifyTrial trial{.number = t, .restored_after = k, .workers = workers, .compared = n - k};
    MixWeightsSchedule weights(options.mix_weights);
    for (std::size_t i = k; i < n; ++i) {
      weights.apply(loader);
      std::optional<Batch> b = loader.next();
      if (!b) {
        report.mismatches.push_back({t, i, reference[i], std::nullopt});
        emit(report.mismatches.back().describe());
        ++trial.mismatches;
        break;
      }
      VerifyBatch got = trace(*b);
      if (!(got == reference[i])) {
        report.mismatches.push_back({t, i, reference[i], got});
        emit(report.mismatches.back().describe());
        ++trial.mismatches;
      }
    }
    trial.checkpoint = std::filesystem::path(found->path).filename().string();
    emit(trial.describe());
    report.trials.push_back(std::move(trial));
  }
  return report;
}

}  // namespace flowstate
