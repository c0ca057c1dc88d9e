#include "flowstate/graph/trace.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cstring>

#include "flowstate/core/error.h"
#include "flowstate/graph/node_stats.h"

namespace flowstate {

namespace {

std::atomic<std::uint64_t> g_tracer_ids{1};

/// The worker track of this thread in the tracer with id `id` (0: none yet).
struct WorkerSlot {
  std::uint64_t tracer = 0;
  std::uint32_t track = 0;
};
thread_local WorkerSlot t_worker;

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

Tracer::Tracer(const std::string& path, std::size_t capacity, TraceSampling sampling)
    : path_(path),
      capacity_(std::max<std::size_t>(capacity, 64)),
      origin_ns_(stats_now_ns()),
      pid_(static_cast<int>(::getpid())),
      id_(g_tracer_ids.fetch_add(1)),
      sampling_(sampling) {
  sampling_.steps_per_second = std::max<std::uint32_t>(sampling_.steps_per_second, 1);
  sampling_.per_second = std::max<std::uint32_t>(sampling_.per_second, 1);
  file_ = std::fopen(path.c_str(), "w");
  if (file_ == nullptr)
    throw Error("cannot write the trace to '" + path + "': " + std::strerror(errno));
  std::fputs("[\n", file_);
  pending_.reserve(capacity_);
  name_track(kSpine, "spine", 0);
  name_track(kDeliver, "deliver (device stream)", 1);
  name_track(kConsumer, "consumer", 2);
  name_track(kCheckpoint, "checkpoint writer", 3);
  writer_ = std::thread([this] { run_writer(); });
}

Tracer::~Tracer() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_one();
  writer_.join();
  // The last metadata event: what the file leaves out, dropped (the writer fell behind) or
  // sampled (a long run), and the sampling rule.
  const bool sampled = sampled_out() > 0;
  std::fprintf(file_,
               "%s{\"name\":\"flowstate\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
               "\"args\":{\"dropped_events\":%" PRIu64
               ",\"sampled\":%s,\"sampled_out_events\":%" PRIu64 ",\"sampling\":%s}}\n]\n",
               first_ ? "" : ",\n", pid_, dropped(), sampled ? "true" : "false", sampled_out(),
               json_string(sampling_rule()).c_str());
  std::fclose(file_);
}

std::uint64_t Tracer::sampled_out() const {
  std::lock_guard lock(pending_lock_);
  return sampled_out_;
}

std::string Tracer::sampling_rule() const {
  char buf[400];
  std::snprintf(buf, sizeof(buf),
                "every event of the first %.3g s (or the first %" PRIu64
                " MB); then every event of one step in a power-of-two stride, at most %u steps "
                "a second, and at most %u other events a second per track and name",
                static_cast<double>(sampling_.full_ns) * 1e-9, sampling_.full_bytes >> 20,
                sampling_.steps_per_second, sampling_.per_second);
  return buf;
}

namespace {
/// The power-of-two stride that keeps at most `per_second` of `steps` steps made in `ns`.
std::int64_t step_stride(std::int64_t steps, std::int64_t ns, std::uint32_t per_second) {
  const double rate =
      static_cast<double>(steps) * 1e9 / static_cast<double>(std::max<std::int64_t>(ns, 1'000'000));
  std::int64_t stride = 1;
  while (static_cast<double>(stride) * per_second < rate) stride *= 2;
  return stride;
}
}  // namespace

bool Tracer::keep(const Event& e) {
  constexpr std::int64_t kSecond = 1'000'000'000;
  const std::int64_t t = std::max<std::int64_t>(e.ts_ns - origin_ns_, 0);
  const std::int64_t w = t / kSecond;
  if (w > window_) {
    // A new second: the step stride that keeps at most steps_per_second of the steps the last
    // second (or seconds, on average) went through.
    if (window_ >= 0 && max_step_ > window_first_step_)
      step_stride_ = step_stride(max_step_ - window_first_step_, (w - window_) * kSecond,
                                 sampling_.steps_per_second);
    window_first_step_ = max_step_;
    window_ = w;
  }
  if (e.step >= 0 && first_step_ < 0) first_step_ = window_first_step_ = e.step;
  max_step_ = std::max(max_step_, e.step);
  if (!sampling_on_) {
    if (t < sampling_.full_ns &&
        written_bytes_.load(std::memory_order_relaxed) < sampling_.full_bytes)
      return true;
    sampling_on_ = true;
    // Sampling may start mid-second (the byte budget reached): the stride from the steps so
    // far, until the next second's count refines it.
    if (first_step_ >= 0)
      step_stride_ = step_stride(max_step_ - first_step_, t, sampling_.steps_per_second);
    char buf[256];
    char* p = buf + std::snprintf(buf, sizeof(buf),
                                  "{\"name\":\"trace sampled from here on\",\"ph\":\"i\","
                                  "\"s\":\"g\",\"pid\":%d,\"tid\":0,\"ts\":",
                                  pid_);
    p = std::to_chars(p, buf + sizeof(buf), t / 1000).ptr;
    std::string meta(buf, p);
    meta += ",\"args\":{\"rule\":" + json_string(sampling_rule()) + "}}";
    pending_meta_.push_back(std::move(meta));
  }
  if (e.step >= 0) return e.step % step_stride_ == 0;
  // Without a step: per track, name and phase, at most per_second a second, one in `stride`
  // (from the last second's count) so that those kept spread over the second.
  Rate& r = rates_[(std::uint64_t{e.track} << 24) | (std::uint64_t{e.name} << 8) |
                   static_cast<unsigned char>(e.ph)];
  if (r.window != w) {
    const std::uint32_t last = r.window == w - 1 ? r.seen : 0;
    r.stride = std::max<std::uint32_t>(1, last / sampling_.per_second);
    r.window = w;
    r.seen = r.kept = 0;
  }
  const bool kept = r.seen % r.stride == 0 && r.kept < sampling_.per_second;
  ++r.seen;
  if (kept) ++r.kept;
  return kept;
}

std::uint16_t Tracer::intern(std::string_view name) {
  std::lock_guard lock(names_mu_);
  for (std::size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == name) return static_cast<std::uint16_t>(i);
  names_.emplace_back(name);
  return static_cast<std::uint16_t>(names_.size() - 1);
}

void Tracer::name_track(std::uint32_t track, const std::string& name, int sort_index) {
  char buf[512];
  std::snprintf(
      buf, sizeof(buf),
      "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%u,\"args\":{\"name\":%s}},"
      "\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%u,"
      "\"args\":{\"sort_index\":%d}}",
      pid_, track, json_string(name).c_str(), pid_, track, sort_index);
  std::lock_guard lock(pending_lock_);
  pending_meta_.emplace_back(buf);
}

std::uint32_t Tracer::worker_track() {
  if (t_worker.tracer != id_) {
    const std::uint32_t k = next_worker_.fetch_add(1);
    t_worker = {id_, kWorker0 + k};
    name_track(kWorker0 + k, "worker " + std::to_string(k), 10 + static_cast<int>(k));
  }
  return t_worker.track;
}

void Tracer::span(std::uint32_t track, std::uint16_t name, std::int64_t begin_ns,
                  std::int64_t end_ns, std::int64_t step, std::int64_t epoch) {
  Event e;
  e.ts_ns = begin_ns;
  e.dur_ns = end_ns - begin_ns;
  e.step = step;
  e.epoch = epoch;
  e.track = track;
  e.name = name;
  add(&e, 1);
}

void Tracer::counter(std::uint16_t name, std::int64_t ts_ns, double value) {
  Event e;
  e.ts_ns = ts_ns;
  e.value = value;
  e.name = name;
  e.ph = 'C';
  add(&e, 1);
}

void Tracer::add(const Event* events, std::size_t n) {
  bool wake = false;
  {
    std::lock_guard lock(pending_lock_);
    const std::size_t before = pending_.size();
    std::uint64_t dropped = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (!keep(events[i])) {
        ++sampled_out_;
      } else if (pending_.size() < capacity_) {
        pending_.push_back(events[i]);
      } else {
        ++dropped;
      }
    }
    if (dropped > 0) dropped_.fetch_add(dropped, std::memory_order_relaxed);
    // Once, when it crosses half: the writer drains it.
    wake = pending_.size() >= capacity_ / 2 && before < capacity_ / 2;
  }
  if (wake) {
    {
      std::lock_guard lock(mu_);
      wake_requested_ = true;
    }
    wake_.notify_one();
  }
}

void Tracer::run_writer() {
  std::vector<Event> batch;
  batch.reserve(capacity_);
  std::vector<std::string> meta;
  for (;;) {
    bool stop;
    {
      std::unique_lock lock(mu_);
      wake_.wait_for(lock, std::chrono::milliseconds(50), [&] { return stop_ || wake_requested_; });
      wake_requested_ = false;
      stop = stop_;
    }
    {
      std::lock_guard lock(pending_lock_);
      batch.swap(pending_);
      meta.swap(pending_meta_);
    }
    for (const auto& m : meta) {
      std::fputs(first_ ? "" : ",\n", file_);
      std::fputs(m.c_str(), file_);
      first_ = false;
    }
    meta.clear();
    write(batch);
    batch.clear();
    std::fflush(file_);
    if (stop) return;
  }
}

namespace {

/// Appends decimal digits of `v` at `p`; returns the end.
char* put_int(char* p, std::int64_t v) { return std::to_chars(p, p + 24, v).ptr; }

/// Appends `ns` as microseconds with three decimals ("12.345"), as Chrome's format wants,
/// from the integer: no floating point, exact to the nanosecond.
char* put_us(char* p, std::int64_t ns) {
  if (ns < 0) {
    *p++ = '-';
    ns = -ns;
  }
  p = put_int(p, ns / 1000);
  const auto frac = static_cast<int>(ns % 1000);
  *p++ = '.';
  *p++ = static_cast<char>('0' + frac / 100);
  *p++ = static_cast<char>('0' + frac / 10 % 10);
  *p++ = static_cast<char>('0' + frac % 10);
  return p;
}

char* put(char* p, std::string_view s) {
  std::memcpy(p, s.data(), s.size());
  return p + s.size();
}

}  // namespace

void Tracer::write(const std::vector<Event>& events) {
  if (events.empty()) return;
  std::vector<std::string> names;
  {
    std::lock_guard lock(names_mu_);
    names.reserve(names_.size());
    for (const auto& n : names_) names.push_back(json_string(n));
  }
  // Formatted by hand into one buffer (the writer shares 2 cores with the graph on small
  // machines: snprintf of doubles and a string per event cost ~3x more).
  std::string out;
  out.reserve(events.size() * 120);
  for (const Event& e : events) {
    const std::string_view name =
        e.name < names.size() ? std::string_view(names[e.name]) : std::string_view("\"?\"");
    const std::size_t start = out.size();
    out.resize(start + name.size() + 256);  // the rest of an event is < 200 bytes
    char* p = out.data() + start;
    if (!first_) p = put(p, ",\n");
    first_ = false;
    p = put(p, "{\"name\":");
    p = put(p, name);
    if (e.ph == 'C') {
      p = put(p, ",\"ph\":\"C\",\"pid\":");
      p = put_int(p, pid_);
      p = put(p, ",\"tid\":0,\"ts\":");
      p = put_us(p, e.ts_ns - origin_ns_);
      p += std::snprintf(p, 48, ",\"args\":{\"value\":%.6g}}", e.value);
    } else {
      p = put(p, ",\"ph\":\"X\",\"pid\":");
      p = put_int(p, pid_);
      p = put(p, ",\"tid\":");
      p = put_int(p, e.track);
      p = put(p, ",\"ts\":");
      p = put_us(p, e.ts_ns - origin_ns_);
      p = put(p, ",\"dur\":");
      p = put_us(p, e.dur_ns);
      p = put(p, ",\"args\":{");
      bool any = false;
      if (e.step >= 0) {
        p = put(p, "\"step\":");
        p = put_int(p, e.step);
        any = true;
      }
      if (e.epoch >= 0) {
        p = put(p, any ? ",\"epoch\":" : "\"epoch\":");
        p = put_int(p, e.epoch);
        any = true;
      }
      if (e.summed) p = put(p, any ? ",\"own_time_summed\":true" : "\"own_time_summed\":true");
      p = put(p, "}}");
    }
    out.resize(static_cast<std::size_t>(p - out.data()));
  }
  std::fwrite(out.data(), 1, out.size(), file_);
  written_bytes_.fetch_add(out.size(), std::memory_order_relaxed);
}

}  // namespace flowstate
