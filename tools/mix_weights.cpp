#include "flowstate/tools/mix_weights.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <map>

#include "flowstate/core/error.h"

namespace flowstate {

MixWeightsAt parse_mix_weights(std::string_view text, const std::string& origin) {
  const std::string s(text);
  const auto colon = s.find(':');
  const auto eq = s.find('=');
  if (colon == std::string::npos || eq == std::string::npos || eq < colon)
    throw ConfigError(origin, origin + ": expected STEP:NODE=W,W, got '" + s + "'");
  MixWeightsAt w;
  const std::string step = s.substr(0, colon);
  auto [end, ec] = std::from_chars(step.data(), step.data() + step.size(), w.step);
  if (step.empty() || ec != std::errc() || end != step.data() + step.size())
    throw ConfigError(origin, origin + ": '" + step + "' in '" + s + "' is not a step number");
  w.node = s.substr(colon + 1, eq - colon - 1);
  if (w.node.empty()) throw ConfigError(origin, origin + ": no mix node named in '" + s + "'");
  std::string_view rest = std::string_view(s).substr(eq + 1);
  for (;;) {
    const auto comma = rest.find(',');
    const std::string item(rest.substr(0, comma));
    double v = 0;
    auto [e, c] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || c != std::errc() || e != item.data() + item.size())
      throw ConfigError(origin, origin + ": '" + item + "' in '" + s + "' is not a number");
    w.weights.push_back(v);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return w;
}

std::vector<MixWeightsAt> read_mix_weights_schedule(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path, "cannot read the weights schedule '" + path + "'");
  std::vector<MixWeightsAt> out;
  std::string line;
  for (std::size_t n = 1; std::getline(in, line); ++n) {
    line = line.substr(0, line.find('#'));
    const auto first = std::find_if_not(line.begin(), line.end(),
                                        [](unsigned char c) { return std::isspace(c) != 0; });
    const auto last = std::find_if_not(line.rbegin(), line.rend(), [](unsigned char c) {
                        return std::isspace(c) != 0;
                      }).base();
    if (first >= last) continue;
    out.push_back(parse_mix_weights(std::string(first, last), path + ":" + std::to_string(n)));
  }
  return out;
}

MixWeightsSchedule::MixWeightsSchedule(std::vector<MixWeightsAt> entries)
    : entries_(std::move(entries)) {
  std::stable_sort(entries_.begin(), entries_.end(),
                   [](const MixWeightsAt& a, const MixWeightsAt& b) { return a.step < b.step; });
}

bool MixWeightsSchedule::apply(Loader& loader, std::uint64_t next) {
  std::map<std::string, const MixWeightsAt*> due;
  for (; done_ < entries_.size() && entries_[done_].step <= next; ++done_)
    due[entries_[done_].node] = &entries_[done_];
  for (const auto& [node, w] : due) loader.set_mix_weights(node, w->weights);
  return !due.empty();
}

bool MixWeightsSchedule::apply(Loader& loader) {
  const auto last = loader.last_step();
  return apply(loader, last ? *last + 1 : 0);
}

}  // namespace flowstate
