#include "flowstate/graph/metrics.h"

#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "flowstate/core/error.h"

namespace flowstate {

std::string to_json_line(const MetricsSample& s) {
  using nlohmann::ordered_json;
  ordered_json busy = ordered_json::object();
  for (const auto& b : s.busy) busy[b.name] = b.busy;
  ordered_json threads = ordered_json::object();
  for (const auto& b : s.busy) threads[b.name] = b.threads;
  ordered_json checkpoints = ordered_json::array();
  for (const auto& c : s.checkpoints)
    checkpoints.push_back({{"step", c.step},
                           {"at", c.at},
                           {"cut_s", c.cut_s},
                           {"encode_s", c.encode_s},
                           {"write_s", c.write_s},
                           {"commit_s", c.commit_s}});
  ordered_json j;
  j["t"] = s.t;
  j["step"] = s.step ? ordered_json(*s.step) : ordered_json(nullptr);
  j["epoch"] = s.epoch ? ordered_json(*s.epoch) : ordered_json(nullptr);
  j["samples_per_s"] = s.samples_per_s;
  j["mb_per_s"] = s.mb_per_s;
  j["in_flight"] = s.in_flight;
  j["busy"] = busy;
  j["threads"] = threads;
  j["consumer_wait"] = s.consumer_wait;
  j["rss_bytes"] = s.rss_bytes;
  j["checkpoints"] = checkpoints;
  return j.dump();
}

MetricsSample parse_metrics_line(const std::string& line) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(line);
  } catch (const std::exception& e) {
    throw Error(std::string("not a metrics line (JSON): ") + e.what());
  }
  try {
    MetricsSample s;
    s.t = j.at("t").get<double>();
    if (!j.at("step").is_null()) s.step = j.at("step").get<std::uint64_t>();
    if (!j.at("epoch").is_null()) s.epoch = j.at("epoch").get<std::uint64_t>();
    s.samples_per_s = j.at("samples_per_s").get<double>();
    s.mb_per_s = j.at("mb_per_s").get<double>();
    s.in_flight = j.at("in_flight").get<std::size_t>();
    const auto& threads = j.at("threads");
    for (const auto& [name, v] : j.at("busy").items())
      s.busy.push_back(
          {name, v.get<double>(), threads.contains(name) ? threads[name].get<int>() : 1});
    s.consumer_wait = j.at("consumer_wait").get<double>();
    s.rss_bytes = j.at("rss_bytes").get<std::uint64_t>();
    for (const auto& c : j.at("checkpoints"))
      s.checkpoints.push_back({c.at("step").get<std::uint64_t>(), c.at("at").get<double>(),
                               c.at("cut_s").get<double>(), c.at("encode_s").get<double>(),
                               c.at("write_s").get<double>(), c.at("commit_s").get<double>()});
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("not a metrics line: ") + e.what());
  }
}

std::uint64_t current_rss_bytes() {
  std::ifstream in("/proc/self/statm");
  std::uint64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace flowstate
