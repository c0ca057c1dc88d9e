#include "flowstate/tools/testing.h"

#include <exception>
#include <ostream>
#include <set>

#include "flowstate/core/hash.h"

namespace flowstate::testing {

std::string BatchTrace::to_string() const {
  return "{step " + std::to_string(step) + " epoch " + std::to_string(epoch) + " index " +
         std::to_string(index_in_epoch) + (last ? " last" : "") + " samples " +
         std::to_string(num_samples) + " rem " + std::to_string(remainder) + " digest " +
         hex64(digest) + "}";
}

std::ostream& operator<<(std::ostream& os, const BatchTrace& t) { return os << t.to_string(); }

BatchTrace trace(const Batch& b) {
  return {b.info.step,
          b.info.epoch,
          b.info.index_in_epoch,
          b.info.is_last_in_epoch,
          b.info.num_samples,
          b.info.remainder,
          b.digest()};
}

std::vector<BatchTrace> drain(Loader& loader, std::size_t limit) {
  std::vector<BatchTrace> out;
  while (out.size() < limit) {
    auto b = loader.next();
    if (!b) break;
    out.push_back(trace(*b));
  }
  return out;
}

std::string OracleReport::summary() const {
  std::string breaks;
  for (std::size_t k : breakpoints) breaks += (breaks.empty() ? "" : ", ") + std::to_string(k);
  std::string out = "save/restore oracle: " + std::to_string(batches) +
                    " batches uninterrupted; breakpoints after " +
                    (breaks.empty() ? std::string("none") : breaks) + " batches: ";
  if (ok()) return out + "every restore reproduced the uninterrupted run\n";
  out += std::to_string(failures.size()) + " failed\n";
  for (const auto& f : failures) out += "  " + f + "\n";
  return out;
}

namespace {

/// The first difference between a restored run and the uninterrupted one, or "".
std::string first_difference(const std::vector<BatchTrace>& got,
                             const std::vector<BatchTrace>& full) {
  for (std::size_t i = 0; i < got.size() || i < full.size(); ++i) {
    if (i < got.size() && i < full.size() && got[i] == full[i]) continue;
    const std::string g = i < got.size() ? got[i].to_string() : "nothing (the run ended)";
    const std::string e = i < full.size() ? full[i].to_string() : "nothing (the run ended)";
    return "batch " + std::to_string(i) + " differs: got " + g + ", expected " + e + " (" +
           std::to_string(got.size()) + " batches in all, expected " + std::to_string(full.size()) +
           ")";
  }
  return "";
}

/// drain() with `weights` applied before every batch.
std::vector<BatchTrace> drain_with(Loader& loader, const std::vector<MixWeightsAt>& weights,
                                   std::size_t limit = SIZE_MAX) {
  if (weights.empty()) return drain(loader, limit);
  MixWeightsSchedule schedule(weights);
  std::vector<BatchTrace> out;
  while (out.size() < limit) {
    schedule.apply(loader);
    auto b = loader.next();
    if (!b) break;
    out.push_back(trace(*b));
  }
  return out;
}

/// The oracle: the uninterrupted run (from `from` when given, else from the beginning), then
/// for each breakpoint k that `breakpoints` picks from it, k batches, save, restore into a
/// loader of `restore_options`, drain, and the whole compared with the uninterrupted run.
OracleReport run_oracle(
    const std::function<Pipeline()>& make, const LoaderOptions& options,
    const LoaderOptions& restore_options, const std::vector<MixWeightsAt>& weights,
    const std::string* from,
    const std::function<std::set<std::size_t>(const std::vector<BatchTrace>&)>& breakpoints) {
  OracleReport report;
  std::vector<BatchTrace> full;
  {
    Loader l(make(), options);
    if (from) l.load_state(*from);
    full = drain_with(l, weights);
  }
  report.batches = full.size();
  if (full.empty()) {
    report.failures.push_back("the oracle needs a pipeline that produces batches");
    return report;
  }
  for (std::size_t k : breakpoints(full)) {
    if (k > full.size()) continue;
    report.breakpoints.push_back(k);
    const std::string where = "breakpoint after " + std::to_string(k) + " batches: ";
    const char* doing = "consuming";
    try {
      std::string saved;
      std::vector<BatchTrace> got;
      {
        Loader l(make(), options);
        if (from) l.load_state(*from);
        got = drain_with(l, weights, k);
        if (got.size() != k) {
          report.failures.push_back(where + "the run ended after " + std::to_string(got.size()) +
                                    " batches");
          continue;
        }
        doing = "saving";
        saved = l.state();
      }
      doing = "restoring";
      Loader resumed(make(), restore_options);
      resumed.load_state(saved);
      doing = "draining the restored run";
      auto rest = drain_with(resumed, weights);
      got.insert(got.end(), rest.begin(), rest.end());
      if (std::string d = first_difference(got, full); !d.empty())
        report.failures.push_back(where + d);
    } catch (const std::exception& e) {
      report.failures.push_back(where + doing + " threw: " + e.what());
    }
  }
  return report;
}

}  // namespace

OracleReport check_save_restore(const std::function<Pipeline()>& make, LoaderOptions options,
                                LoaderOptions restore_options) {
  return check_save_restore(make, std::move(options), std::move(restore_options), {});
}

OracleReport check_save_restore(const std::function<Pipeline()>& make, LoaderOptions options,
                                LoaderOptions restore_options, std::vector<MixWeightsAt> weights) {
  return run_oracle(make, options, restore_options, weights, nullptr,
                    [](const std::vector<BatchTrace>& full) {
                      std::set<std::size_t> breaks{0, 1, full.size() / 5, full.size()};
                      for (std::size_t i = 0; i < full.size(); ++i) {
                        if (full[i].epoch == 0 && full[i].last) {
                          breaks.insert(i);  // after consuming the batch before the epoch's last
                          breaks.insert(i + 1);  // exactly at the epoch's end
                        }
                        if (full[i].epoch == 1 && full[i].index_in_epoch == 0)
                          breaks.insert(i + (full.size() - i) / 2);
                      }
                      return breaks;
                    });
}

OracleReport check_save_restore(const std::function<Pipeline()>& make, LoaderOptions options) {
  return check_save_restore(make, options, options);
}

OracleReport check_save_restore_from(const std::function<Pipeline()>& make, LoaderOptions options,
                                     const std::string& state) {
  return run_oracle(make, options, options, {}, &state, [](const std::vector<BatchTrace>& full) {
    std::set<std::size_t> every;  // a breakpoint after every batch
    for (std::size_t k = 0; k <= full.size(); ++k) every.insert(k);
    return every;
  });
}

}  // namespace flowstate::testing
