// Tracer: a timeline of a running Loader as Chrome trace-event JSON (the "JSON Array Format"
// that Perfetto UI and chrome://tracing open): one track per thread — the spine, each
// assembly worker, the deliver step (the device stream with device_copy), the consumer and
// the checkpoint writer —, complete ("X") spans with the step and epoch as arguments, and
// counters ("C") of the batches in flight.
//
//   Tracer t("run.json");
//   const auto name = t.intern("map:augment");
//   t.span(Tracer::kSpine, name, begin_ns, end_ns, step, epoch);
//   // ~Tracer writes what is left and closes the JSON array
//
// Memory is bounded: events go into a buffer of `capacity` events that a writer thread
// drains to the file every 50 ms (and whenever it is half full); when the writer falls behind,
// new events are dropped and counted, and the count is written at the end ("dropped_events"
// in the trace's last metadata event). Timestamps are microseconds since the tracer started.
//
// The file's size is bounded too (TraceSampling): every event of the first 10 s (or of the
// first 64 MB, if that comes first) is written; after that the trace is sampled at a bounded
// rate, so that an hour's run stays near 100 MB and opens in Perfetto: every event of one step
// in a power-of-two stride, chosen each second so that at most 5 steps a second are kept whole
// (all their nodes' spans on every track), and of the events without a step (counters,
// waits, checkpoint phases) at most 5 a second per track and name, spread over the second.
// Where sampling starts the trace holds an instant event saying so, and the last metadata
// event says "sampled", how many events were left out ("sampled_out_events") and the rule.
//
// Thread-safety: every member may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

namespace flowstate {

/// How a Tracer keeps a long run's trace to a bounded rate (see the file comment).
struct TraceSampling {
  std::int64_t full_ns = 10'000'000'000;               ///< every event of the first 10 s is written
  std::uint64_t full_bytes = std::uint64_t{64} << 20;  ///< ... unless the file reached this first
  std::uint32_t steps_per_second = 5;  ///< then: every event of at most this many steps a second
  std::uint32_t per_second = 5;  ///< and of other events, this many a second per track and name
};

class Tracer {
 public:
  /// Fixed tracks (Chrome's "tid"); assembly workers get kWorker0 + k.
  enum Track : std::uint32_t {
    kSpine = 1,
    kDeliver = 2,
    kConsumer = 3,
    kCheckpoint = 4,
    kWorker0 = 10,
  };
  /// One event; `step` and `epoch` < 0 are left out.
  struct Event {
    std::int64_t ts_ns = 0;   ///< steady_clock
    std::int64_t dur_ns = 0;  ///< spans
    std::int64_t step = -1;
    std::int64_t epoch = -1;
    double value = 0;  ///< counters
    std::uint32_t track = 0;
    std::uint16_t name = 0;
    char ph = 'X';        ///< 'X' span, 'C' counter
    bool summed = false;  ///< a spine node's own time in a batch, laid end to end (see loader)
  };

  /// Opens `path` for writing (truncating it); throws Error naming the path when it cannot.
  explicit Tracer(const std::string& path, std::size_t capacity = 1 << 16,
                  TraceSampling sampling = {});
  /// Writes the remaining events and closes the JSON array.
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  /// The id of an event name (the same id for the same name).
  std::uint16_t intern(std::string_view name);
  /// This thread's worker track, named "worker k" on first use (k counts from 0 per tracer).
  std::uint32_t worker_track();
  /// The stats_now_ns() time that the trace's "ts" 0 stands for.
  std::int64_t origin_ns() const { return origin_ns_; }
  /// A span [begin_ns, end_ns) on `track`.
  void span(std::uint32_t track, std::uint16_t name, std::int64_t begin_ns, std::int64_t end_ns,
            std::int64_t step = -1, std::int64_t epoch = -1);
  /// A counter's value at `ts_ns`.
  void counter(std::uint16_t name, std::int64_t ts_ns, double value);
  /// Several events at once (one lock).
  void add(const Event* events, std::size_t n);
  /// Events dropped so far because the buffer was full.
  std::uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  /// Events left out so far by sampling (TraceSampling).
  std::uint64_t sampled_out() const;
  const std::string& path() const { return path_; }

 private:
  void name_track(std::uint32_t track, const std::string& name, int sort_index);
  /// Whether `e` is written (TraceSampling); called with pending_lock_ held.
  bool keep(const Event& e);
  /// The sampling rule in words, for the trace's metadata.
  std::string sampling_rule() const;
  void run_writer();
  void write(const std::vector<Event>& events);

  std::string path_;
  std::FILE* file_ = nullptr;
  std::size_t capacity_;
  std::int64_t origin_ns_;
  int pid_;
  std::uint64_t id_;  ///< distinguishes tracers for the per-thread worker track

  std::mutex names_mu_;
  std::deque<std::string> names_;
  std::atomic<std::uint32_t> next_worker_{0};

  /// Guards pending_ and pending_meta_. A spin lock: the graph's threads hold it for a copy of
  /// a few events, and a std::mutex that four threads meet on per batch sleeps in the kernel
  /// now and then — on a loaded 2-core VM each such wake-up cost more than the event.
  class SpinLock {
   public:
    void lock() {
      for (int spins = 0; flag_.test_and_set(std::memory_order_acquire); ++spins)
        if (spins >= 64) std::this_thread::yield();
    }
    void unlock() { flag_.clear(std::memory_order_release); }

   private:
    std::atomic_flag flag_ = ATOMIC_FLAG_INIT;
  };
  mutable SpinLock pending_lock_;
  std::vector<Event> pending_;
  std::vector<std::string> pending_meta_;  ///< metadata events, already JSON

  // Sampling (guarded by pending_lock_): the 1-second window of trace time the rates count in.
  struct Rate {
    std::int64_t window = -1;
    std::uint32_t seen = 0, kept = 0, stride = 1;
  };
  TraceSampling sampling_;
  bool sampling_on_ = false;  ///< past the full-detail part
  std::int64_t window_ = -1;
  std::int64_t first_step_ = -1, max_step_ = -1, window_first_step_ = -1;
  std::int64_t step_stride_ = 1;
  std::unordered_map<std::uint64_t, Rate> rates_;  ///< per track, name and phase
  std::uint64_t sampled_out_ = 0;
  std::atomic<std::uint64_t> written_bytes_{0};  ///< events written so far (the writer's)
  // The writer's sleep: it wakes every 50 ms, or when pending_ is half full, or to stop.
  std::mutex mu_;
  std::condition_variable wake_;
  bool wake_requested_ = false;
  bool stop_ = false;
  bool first_ = true;  ///< no event written yet (no comma before the next)
  std::atomic<std::uint64_t> dropped_{0};
  std::thread writer_;
};

}  // namespace flowstate
