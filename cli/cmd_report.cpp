// `flowstate report`: turns the metrics of a run (`flowstate run --metrics FILE.jsonl`), and
// optionally its trace, into one self-contained HTML page: inline SVG charts, no script, no
// network. Throughput over time, each node's utilisation stacked, checkpoint marks on the time
// axis, and a summary table. Every series is also in the SVG as data attributes
// (data-series / data-values, data-node), so tests and tools can read the page back.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/command.h"
#include "flowstate/core/error.h"
#include "flowstate/graph/metrics.h"

namespace flowstate::cli {
namespace {

constexpr const char* kUsage =
    "usage: flowstate report METRICS.jsonl [--trace FILE.json] -o REPORT.html\n\n"
    "Writes one self-contained HTML page (inline SVG, no network) from the metrics a run wrote\n"
    "(flowstate run --metrics): samples/s and MB/s over time, each node's utilisation stacked\n"
    "(in threads busy), checkpoint marks on the time axis, and a summary table. With --trace,\n"
    "the page also sums the trace's spans per node and track.\n\n"
    "  -o FILE          the HTML file to write\n"
    "  --trace FILE     a trace of the same run (flowstate run --trace)\n";

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '&':
        o += "&amp;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

std::string num(double v, const char* fmt = "%.6g") {
  char b[64];
  std::snprintf(b, sizeof(b), fmt, v);
  return b;
}

// A fixed palette (colour-blind friendly, Okabe-Ito, then greys).
const char* colour(std::size_t i) {
  static const char* k[] = {"#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9",
                            "#D55E00", "#F0E442", "#000000", "#999999", "#666666"};
  return k[i % (sizeof(k) / sizeof(k[0]))];
}

/// An axis label: 1.29M, 969k, 0.25.
std::string tick(double v) {
  if (v >= 1e6) return num(v * 1e-6, "%.3gM");
  if (v >= 1e3) return num(v * 1e-3, "%.3gk");
  return num(v, "%.3g");
}

constexpr double kW = 900, kH = 260, kL = 64, kR = 20, kT = 20, kB = 36;

struct Axes {
  double t0, t1, y1;
  double x(double t) const { return kL + (t1 > t0 ? (t - t0) / (t1 - t0) : 0) * (kW - kL - kR); }
  double y(double v) const { return kT + (1 - (y1 > 0 ? v / y1 : 0)) * (kH - kT - kB); }
};

/// The frame, ticks and labels of a chart.
std::string frame(const Axes& a, const std::string& ylabel) {
  std::ostringstream o;
  o << "<rect x='" << kL << "' y='" << kT << "' width='" << kW - kL - kR << "' height='"
    << kH - kT - kB << "' fill='none' stroke='#ccc'/>";
  for (int i = 0; i <= 4; ++i) {
    const double v = a.y1 * i / 4, t = a.t0 + (a.t1 - a.t0) * i / 4;
    o << "<text x='" << kL - 6 << "' y='" << num(a.y(v) + 4) << "' text-anchor='end'>" << tick(v)
      << "</text>";
    o << "<line x1='" << kL << "' x2='" << kW - kR << "' y1='" << num(a.y(v)) << "' y2='"
      << num(a.y(v)) << "' stroke='#eee'/>";
    o << "<text x='" << num(a.x(t)) << "' y='" << kH - kB + 16 << "' text-anchor='middle'>"
      << num(t, "%.3g") << "</text>";
  }
  o << "<text x='" << kW / 2 << "' y='" << kH - 4 << "' text-anchor='middle'>seconds</text>";
  o << "<text x='12' y='" << (kT + kH - kB) / 2 << "' transform='rotate(-90 12 "
    << (kT + kH - kB) / 2 << ")' text-anchor='middle'>" << esc(ylabel) << "</text>";
  return o.str();
}

std::string checkpoint_marks(const Axes& a, const std::vector<MetricsSample>& samples) {
  std::ostringstream o;
  for (const auto& s : samples)
    for (const auto& c : s.checkpoints)
      o << "<line class='checkpoint' data-step='" << c.step << "' data-at='" << num(c.at)
        << "' x1='" << num(a.x(c.at)) << "' x2='" << num(a.x(c.at)) << "' y1='" << kT << "' y2='"
        << kH - kB << "' stroke='#D55E00' stroke-dasharray='4 3'><title>checkpoint " << c.step
        << " (" << num((c.cut_s + c.encode_s + c.write_s + c.commit_s) * 1e3, "%.1f")
        << " ms)</title></line>";
  return o.str();
}

std::string values_of(const std::vector<double>& v) {
  std::string s;
  for (double x : v) {
    if (!s.empty()) s += ' ';
    s += num(x);
  }
  return s;
}

/// A line chart of one series.
std::string line_chart(const std::string& id, const std::string& ylabel,
                       const std::vector<MetricsSample>& samples, const std::vector<double>& v,
                       double t0, double t1) {
  Axes a{t0, t1, std::max(1e-9, *std::max_element(v.begin(), v.end()) * 1.1)};
  std::ostringstream o;
  o << "<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 " << kW << " " << kH << "' width='"
    << kW << "' height='" << kH << "'>" << frame(a, ylabel);
  o << "<polyline fill='none' stroke='#0072B2' stroke-width='2' data-series='" << id
    << "' data-values='" << values_of(v) << "' points='";
  for (std::size_t i = 0; i < v.size(); ++i)
    o << num(a.x(samples[i].t)) << "," << num(a.y(v[i])) << " ";
  o << "'/>" << checkpoint_marks(a, samples) << "</svg>";
  return o.str();
}

/// Each node's threads busy (busy share x threads), stacked.
std::string stacked_chart(const std::vector<MetricsSample>& samples,
                          const std::vector<std::string>& nodes, double t0, double t1) {
  const std::size_t n = samples.size();
  std::vector<std::vector<double>> value(nodes.size(), std::vector<double>(n, 0));
  for (std::size_t i = 0; i < n; ++i)
    for (const auto& b : samples[i].busy)
      for (std::size_t k = 0; k < nodes.size(); ++k)
        if (nodes[k] == b.name) value[k][i] = b.busy * b.threads;
  std::vector<double> top(n, 0);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t k = 0; k < nodes.size(); ++k) top[i] += value[k][i];
  Axes a{t0, t1, std::max(1.0, *std::max_element(top.begin(), top.end()) * 1.1)};
  std::ostringstream o;
  o << "<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 " << kW << " " << kH << "' width='"
    << kW << "' height='" << kH << "'>" << frame(a, "threads busy");
  std::vector<double> base(n, 0);
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    o << "<polygon fill='" << colour(k) << "' fill-opacity='0.8' data-node='" << esc(nodes[k])
      << "' data-values='" << values_of(value[k]) << "' points='";
    for (std::size_t i = 0; i < n; ++i)
      o << num(a.x(samples[i].t)) << "," << num(a.y(base[i] + value[k][i])) << " ";
    for (std::size_t i = n; i-- > 0;)
      o << num(a.x(samples[i].t)) << "," << num(a.y(base[i])) << " ";
    o << "'><title>" << esc(nodes[k]) << "</title></polygon>";
    for (std::size_t i = 0; i < n; ++i) base[i] += value[k][i];
  }
  o << checkpoint_marks(a, samples) << "</svg>";
  o << "<p class='legend'>";
  for (std::size_t k = 0; k < nodes.size(); ++k)
    o << "<span><i style='background:" << colour(k) << "'></i>" << esc(nodes[k]) << "</span> ";
  o << "</p>";
  return o.str();
}

/// Summed span time per (track, name) of a trace.
std::string trace_table(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot read the trace '" + path + "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw Error("the trace '" + path + "' is not JSON: " + e.what());
  }
  const nlohmann::json& events = j.is_object() ? j.at("traceEvents") : j;
  std::map<int, std::string> tracks;
  std::map<std::pair<std::string, int>, std::pair<double, std::uint64_t>> sums;
  for (const auto& e : events) {
    const std::string ph = e.value("ph", "");
    if (ph == "M" && e.value("name", "") == "thread_name")
      tracks[e.value("tid", 0)] = e["args"].value("name", "");
    if (ph != "X") continue;
    auto& s = sums[{e.value("name", ""), e.value("tid", 0)}];
    s.first += e.value("dur", 0.0) * 1e-6;
    ++s.second;
  }
  std::vector<std::pair<std::pair<std::string, int>, std::pair<double, std::uint64_t>>> rows(
      sums.begin(), sums.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::ostringstream o;
  o << "<h2>Trace: time in spans</h2><table class='trace'><tr><th>span</th><th>track</th>"
       "<th>spans</th><th>seconds</th></tr>";
  for (const auto& [key, v] : rows)
    o << "<tr><td>" << esc(key.first) << "</td><td>" << esc(tracks[key.second]) << "</td><td>"
      << v.second << "</td><td>" << num(v.first, "%.3f") << "</td></tr>";
  o << "</table>";
  return o.str();
}

}  // namespace

int cmd_report(std::span<const std::string> argv) {
  Args args(argv, {"-o", "--trace"});
  if (args.help()) {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  if (args.positional().size() != 1) throw UsageError("expected one metrics file (JSON lines)");
  const std::optional<std::string> out = args.value("-o");
  if (!out) throw UsageError("give the HTML file to write with -o");
  const std::string path = args.positional()[0];
  std::ifstream in(path);
  if (!in) throw UsageError("cannot read '" + path + "'");
  std::vector<MetricsSample> samples;
  std::string line;
  for (std::size_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    try {
      samples.push_back(parse_metrics_line(line));
    } catch (const Error& e) {
      throw UsageError(path + ":" + std::to_string(n) + ": " + e.what());
    }
  }
  if (samples.empty()) throw UsageError(path + " holds no metrics lines");
  // A resumed run appends to the same file: its time starts again. Keep the last run.
  std::size_t first = 0;
  for (std::size_t i = 1; i < samples.size(); ++i)
    if (samples[i].t < samples[i - 1].t) first = i;
  samples.erase(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(first));

  std::vector<std::string> nodes;
  for (const auto& s : samples)
    for (const auto& b : s.busy)
      if (std::find(nodes.begin(), nodes.end(), b.name) == nodes.end()) nodes.push_back(b.name);
  std::vector<double> sps, mbps;
  for (const auto& s : samples) {
    sps.push_back(s.samples_per_s);
    mbps.push_back(s.mb_per_s);
  }
  const double t0 = 0, t1 = std::max(samples.back().t, 1e-9);

  // Summary: means over the lines, weighted by their intervals.
  std::map<std::string, double> busy_mean;
  double weight = 0, sps_mean = 0, wait_mean = 0;
  std::uint64_t rss_peak = 0;
  std::size_t checkpoints = 0;
  double ck_worst = 0;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const double dt = samples[i].t - (i == 0 ? 0 : samples[i - 1].t);
    weight += dt;
    sps_mean += samples[i].samples_per_s * dt;
    wait_mean += samples[i].consumer_wait * dt;
    for (const auto& b : samples[i].busy) busy_mean[b.name] += b.busy * dt;
    rss_peak = std::max(rss_peak, samples[i].rss_bytes);
    for (const auto& c : samples[i].checkpoints) {
      ++checkpoints;
      ck_worst = std::max(ck_worst, c.cut_s + c.encode_s + c.write_s + c.commit_s);
    }
  }
  const auto mean = [&](double v) { return weight > 0 ? v / weight : 0; };
  std::string busiest;
  for (const auto& n : nodes)
    if (busiest.empty() || busy_mean[n] > busy_mean[busiest]) busiest = n;

  std::ostringstream h;
  h << "<!DOCTYPE html><html><head><meta charset='utf-8'><title>flowstate report: " << esc(path)
    << "</title><style>"
    << "body{font:14px system-ui,sans-serif;margin:24px;color:#222;max-width:960px}"
       "svg text{font:11px system-ui,sans-serif;fill:#444}"
       "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;"
       "text-align:right}td:first-child,th:first-child{text-align:left}"
       ".legend span{margin-right:14px;white-space:nowrap}.legend i{display:inline-block;"
       "width:10px;height:10px;margin-right:4px}"
    << "</style></head><body>";
  h << "<h1>flowstate report</h1><p>" << esc(path) << ": " << samples.size() << " samples over "
    << num(t1, "%.1f") << " s, last step "
    << (samples.back().step ? std::to_string(*samples.back().step) : std::string("-"))
    << ". Dashed lines mark checkpoints.</p>";
  h << "<h2>Summary</h2><table class='summary'><tr><th>metric</th><th>value</th></tr>"
    << "<tr><td>mean samples/s</td><td>" << num(mean(sps_mean), "%.0f") << "</td></tr>"
    << "<tr><td>busiest node</td><td>" << esc(busiest) << " ("
    << num(mean(busy_mean[busiest]) * 100, "%.0f") << "% busy)</td></tr>"
    << "<tr><td>consumer waiting</td><td>" << num(mean(wait_mean) * 100, "%.0f") << "%</td></tr>"
    << "<tr><td>peak RSS</td><td>" << num(static_cast<double>(rss_peak) / (1 << 20), "%.1f")
    << " MiB</td></tr>"
    << "<tr><td>checkpoints</td><td>" << checkpoints << " (slowest " << num(ck_worst * 1e3, "%.1f")
    << " ms)</td></tr></table>";
  h << "<table class='nodes'><tr><th>node</th><th>mean busy</th><th>threads</th></tr>";
  for (const auto& n : nodes) {
    int threads = 1;
    for (const auto& b : samples.back().busy)
      if (b.name == n) threads = b.threads;
    h << "<tr><td>" << esc(n) << "</td><td>" << num(mean(busy_mean[n]) * 100, "%.1f")
      << "%</td><td>" << threads << "</td></tr>";
  }
  h << "</table>";
  h << "<h2>Throughput</h2>" << line_chart("samples_per_s", "samples/s", samples, sps, t0, t1)
    << line_chart("mb_per_s", "MB/s", samples, mbps, t0, t1);
  h << "<h2>Utilisation per node (threads busy, stacked)</h2>"
    << stacked_chart(samples, nodes, t0, t1);
  if (auto trace = args.value("--trace")) h << trace_table(*trace);
  h << "</body></html>\n";

  std::ofstream o(*out, std::ios::trunc);
  o << h.str();
  o.close();
  if (!o) throw Error("cannot write '" + *out + "'");
  note("wrote " + *out);
  return kExitOk;
}

}  // namespace flowstate::cli
