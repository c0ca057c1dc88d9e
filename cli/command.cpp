#include "cli/command.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>

#include "flowstate/config/yaml_support.h"
#include "flowstate/core/error.h"
#include "flowstate/serialization/checkpoint.h"

namespace flowstate::cli {

Args::Args(std::span<const std::string> args, std::initializer_list<std::string_view> with_value,
           std::initializer_list<std::string_view> switches) {
  auto known = [](std::initializer_list<std::string_view> list, std::string_view f) {
    return std::find(list.begin(), list.end(), f) != list.end();
  };
  bool flags_done = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (flags_done || a.size() < 2 || a[0] != '-' || a == "-") {
      positional_.push_back(a);
      continue;
    }
    if (a == "--") {
      flags_done = true;
      continue;
    }
    if (a == "-h" || a == "--help") {
      help_ = true;
      continue;
    }
    std::string flag = a, value;
    bool inline_value = false;
    if (auto eq = a.find('='); eq != std::string::npos && a.rfind("--", 0) == 0) {
      flag = a.substr(0, eq);
      value = a.substr(eq + 1);
      inline_value = true;
    }
    if (known(switches, flag)) {
      if (inline_value) throw UsageError(flag + " takes no value");
      flags_.emplace_back(flag, "");
    } else if (known(with_value, flag)) {
      if (!inline_value) {
        if (i + 1 >= args.size()) throw UsageError(flag + " needs a value");
        value = args[++i];
      }
      flags_.emplace_back(flag, value);
    } else {
      std::vector<std::string> known_flags(with_value.begin(), with_value.end());
      known_flags.insert(known_flags.end(), switches.begin(), switches.end());
      known_flags.emplace_back("--help");
      throw UsageError("unknown option '" + flag + "'" +
                       yaml_support::suggestion(flag, known_flags));
    }
  }
}

bool Args::has(std::string_view flag) const {
  return std::any_of(flags_.begin(), flags_.end(), [&](const auto& f) { return f.first == flag; });
}

std::optional<std::string> Args::value(std::string_view flag) const {
  std::optional<std::string> out;
  for (const auto& [f, v] : flags_)
    if (f == flag) out = v;
  return out;
}

std::vector<std::string> Args::values(std::string_view flag) const {
  std::vector<std::string> out;
  for (const auto& [f, v] : flags_)
    if (f == flag) out.push_back(v);
  return out;
}

std::vector<MixWeightsAt> mix_weights_flags(const Args& args) {
  std::vector<MixWeightsAt> out;
  for (const auto& s : args.values("--mix-weights"))
    out.push_back(parse_mix_weights(s, "--mix-weights"));
  if (auto file = args.value("--weights-schedule"))
    for (auto& w : read_mix_weights_schedule(*file)) out.push_back(std::move(w));
  return out;
}

std::uint64_t parse_uint(std::string_view text, std::string_view what) {
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || p != text.data() + text.size())
    throw UsageError(std::string(what) + " expects a non-negative integer, got '" +
                     std::string(text) + "'");
  return v;
}

std::optional<std::uint64_t> Args::uint(std::string_view flag, std::uint64_t min,
                                        std::uint64_t max) const {
  auto v = value(flag);
  if (!v) return std::nullopt;
  std::uint64_t x = parse_uint(*v, flag);
  if (x < min || x > max)
    throw UsageError(std::string(flag) + " " + *v + " is out of range (must be " +
                     (max == UINT64_MAX
                          ? "at least " + std::to_string(min)
                          : "between " + std::to_string(min) + " and " + std::to_string(max)) +
                     ")");
  return x;
}

std::optional<std::uint64_t> parse_workers(const Args& args) {
  const auto v = args.value("--workers");
  if (v == "auto") return kAuto;
  if (v == "inline") return kInline;
  if (v && (v->empty() || v->find_first_not_of("0123456789") != std::string::npos))
    throw UsageError("--workers expects a number of workers (1 to 1024), auto or inline, got '" +
                     *v + "'");
  return args.uint("--workers", 1, 1024);
}

std::string Args::required(std::string_view flag) const {
  auto v = value(flag);
  if (!v) throw UsageError(std::string(flag) + " is required");
  return *v;
}

PipelineConfig load_pipeline(const std::string& path, const std::vector<std::string>& sets) {
  YamlOptions o;
  o.overrides = sets;
  return load_yaml_file(path, o);
}

PipelineConfig load_pipeline_on_host(const std::string& path, std::vector<std::string> sets,
                                     bool* moved) {
  PipelineConfig config = load_pipeline(path, sets);
  if (moved != nullptr) *moved = false;
  const std::vector<std::string> host = config.pipeline.host_overrides();
  if (host.empty()) return config;
  if (moved != nullptr) *moved = true;
  sets.insert(sets.end(), host.begin(), host.end());
  return load_pipeline(path, sets);
}

std::vector<std::string> invalid_checkpoints(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return out;
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (const std::string name = e.path().filename().string();
        name.rfind("step-", 0) == 0 && !name.ends_with(".tmp"))
      names.push_back(e.path().string());
  std::sort(names.begin(), names.end());
  for (const auto& n : names) {
    try {
      read_checkpoint(n);
    } catch (const CheckpointError& e) {
      out.push_back(n + ": " + e.what());
    }
  }
  return out;
}

std::string error_message(const std::exception& e) {
  std::string msg = e.what();
  auto mentions = [&](const std::string& s) {
    return s.empty() || msg.find(s) != std::string::npos;
  };
  std::vector<std::string> extra;
  if (const auto* c = dynamic_cast<const ConfigError*>(&e)) {
    if (!mentions(c->key())) extra.push_back("key " + c->key());
  } else if (const auto* d = dynamic_cast<const DataError*>(&e)) {
    if (!mentions(d->file())) extra.push_back("file " + d->file());
    if (d->offset() != DataError::kNoOffset)
      extra.push_back("offset " + std::to_string(d->offset()));
  } else if (const auto* k = dynamic_cast<const CheckpointError*>(&e)) {
    if (!mentions(k->file())) extra.push_back("file " + k->file());
  }
  if (!extra.empty()) {
    msg += " [";
    for (std::size_t i = 0; i < extra.size(); ++i) msg += (i ? ", " : "") + extra[i];
    msg += "]";
  }
  return msg;
}

void note(const std::string& message) {
  std::fprintf(stderr, "flowstate: %s\n", message.c_str());
  std::fflush(stderr);
}

std::string format_bytes(double bytes) {
  char buf[64];
  if (bytes >= 1e9)
    std::snprintf(buf, sizeof(buf), "%.2f GB", bytes / 1e9);
  else if (bytes >= 1e6)
    std::snprintf(buf, sizeof(buf), "%.2f MB", bytes / 1e6);
  else if (bytes >= 1e3)
    std::snprintf(buf, sizeof(buf), "%.2f kB", bytes / 1e3);
  else
    std::snprintf(buf, sizeof(buf), "%.0f B", bytes);
  return buf;
}

std::string format_count(double n) {
  char buf[64];
  if (n >= 1e9)
    std::snprintf(buf, sizeof(buf), "%.2f G", n / 1e9);
  else if (n >= 1e6)
    std::snprintf(buf, sizeof(buf), "%.2f M", n / 1e6);
  else if (n >= 1e3)
    std::snprintf(buf, sizeof(buf), "%.2f k", n / 1e3);
  else
    std::snprintf(buf, sizeof(buf), "%.0f", n);
  return buf;
}

}  // namespace flowstate::cli
