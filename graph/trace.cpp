#include "flowstate/graph/trace.h"

#include <unistd.h>

#include <cerrno>
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

Tracer::Tracer(const std::string& path, std::size_t capacity)
    : path_(path),
      capacity_(std::max<std::size_t>(capacity, 64)),
      origin_ns_(stats_now_ns()),
      pid_(static_cast<int>(::getpid())),
      id_(g_tracer_ids.fetch_add(1)) {
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
  std::fprintf(file_,
               "%s{\"name\":\"flowstate\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
               "\"args\":{\"dropped_events\":%" PRIu64 "}}\n]\n",
               first_ ? "" : ",\n", pid_, dropped());
  std::fclose(file_);
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
  std::lock_guard lock(mu_);
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
    std::lock_guard lock(mu_);
    const std::size_t room = capacity_ - pending_.size();
    const std::size_t take = std::min(room, n);
    pending_.insert(pending_.end(), events, events + take);
    if (take < n) dropped_.fetch_add(n - take, std::memory_order_relaxed);
    wake = pending_.size() >= capacity_ / 2;
  }
  if (wake) wake_.notify_one();
}

void Tracer::run_writer() {
  std::vector<Event> batch;
  batch.reserve(capacity_);
  std::vector<std::string> meta;
  for (;;) {
    bool stop;
    {
      std::unique_lock lock(mu_);
      wake_.wait_for(lock, std::chrono::milliseconds(50),
                     [&] { return stop_ || pending_.size() >= capacity_ / 2; });
      batch.swap(pending_);
      meta.swap(pending_meta_);
      stop = stop_;
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

void Tracer::write(const std::vector<Event>& events) {
  if (events.empty()) return;
  std::vector<std::string> names;
  {
    std::lock_guard lock(names_mu_);
    names.reserve(names_.size());
    for (const auto& n : names_) names.push_back(json_string(n));
  }
  char buf[512];
  for (const Event& e : events) {
    const double ts = static_cast<double>(e.ts_ns - origin_ns_) * 1e-3;
    const char* name = e.name < names.size() ? names[e.name].c_str() : "\"?\"";
    int len;
    if (e.ph == 'C') {
      len = std::snprintf(buf, sizeof(buf),
                          "%s{\"name\":%s,\"ph\":\"C\",\"pid\":%d,\"tid\":0,\"ts\":%.3f,"
                          "\"args\":{\"value\":%.6g}}",
                          first_ ? "" : ",\n", name, pid_, ts, e.value);
    } else {
      std::string args;
      if (e.step >= 0) args += "\"step\":" + std::to_string(e.step);
      if (e.epoch >= 0)
        args += std::string(args.empty() ? "" : ",") + "\"epoch\":" + std::to_string(e.epoch);
      if (e.summed) args += std::string(args.empty() ? "" : ",") + "\"own_time_summed\":true";
      len = std::snprintf(buf, sizeof(buf),
                          "%s{\"name\":%s,\"ph\":\"X\",\"pid\":%d,\"tid\":%u,\"ts\":%.3f,"
                          "\"dur\":%.3f,\"args\":{%s}}",
                          first_ ? "" : ",\n", name, pid_, e.track, ts,
                          static_cast<double>(e.dur_ns) * 1e-3, args.c_str());
    }
    if (len > 0)
      std::fwrite(buf, 1, std::min<std::size_t>(static_cast<std::size_t>(len), sizeof(buf) - 1),
                  file_);
    first_ = false;
  }
}

}  // namespace flowstate
