#include "flowstate/graph/loader.h"

#include <algorithm>
#include <cstdio>

#include "flowstate/graph/loader_runtime.h"
#include "flowstate/nodes/sources/remote_listing.h"

namespace flowstate {

LoaderStats Loader::stats() const {
  LoaderStats s = runtime_->stats();
  s.consumer_busy_ns = consumer_busy_ns_;
  return s;
}

/// What the metrics samples are computed from: the previous sample's counters.
struct Loader::Metrics {
  std::FILE* file = nullptr;
  std::int64_t last_ns = 0;
  const Runtime* runtime = nullptr;  ///< whose counters `busy` holds (a rebuild starts over)
  std::vector<std::uint64_t> busy;
  std::uint64_t wait_ns = 0;
  std::uint64_t samples = 0, bytes = 0;  ///< since the last sample
  ~Metrics() {
    if (file != nullptr) std::fclose(file);
  }
};

Loader::Loader(Pipeline pipeline, LoaderOptions options)
    : pipeline_(std::move(pipeline)),
      options_(std::move(options)),
      canonical_(pipeline_.canonical()),
      fingerprint_(fingerprint_of(canonical_)),
      observer_(std::make_shared<detail::LoaderObserver>()),
      listings_(std::make_shared<ListingMemo>()) {
  if (!options_.trace.empty()) {
    auto& o = *observer_;
    o.tracer = std::make_unique<Tracer>(options_.trace);
    o.consumer_step = o.tracer->intern("consumer step");
    o.ck_cut = o.tracer->intern("checkpoint cut");
    o.ck_encode = o.tracer->intern("checkpoint encode");
    o.ck_write = o.tracer->intern("checkpoint write (state + manifest, fsynced)");
    o.ck_commit = o.tracer->intern("checkpoint commit (rename + fsync)");
  }
  if (!options_.metrics.empty() || options_.on_metrics) {
    if (!(options_.metrics_interval_s > 0))
      throw ConfigError("metrics_interval_s", "the metrics interval must be positive");
    metrics_ = std::make_unique<Metrics>();
    if (!options_.metrics.empty()) {
      metrics_->file = std::fopen(options_.metrics.c_str(), "a");
      if (metrics_->file == nullptr)
        throw Error("cannot write metrics to '" + options_.metrics + "': " + std::strerror(errno));
    }
    metrics_->last_ns = observer_->start_ns;
  }
  runtime_ = make_runtime();
  last_stamp_ = runtime_->spine().snapshot();
}

std::unique_ptr<Loader::Runtime> Loader::make_runtime() {
  // The sources open on this thread: their remote patterns are listed once per job.
  ListingScope scope({.dir = options_.checkpoint_dir,
                      .reuse = options_.on_data_change != OnDataChange::kContinue,
                      .coordinator = options_.coordinator.get(),
                      .memo = listings_,
                      .cache_dir = options_.cache_dir,
                      .cache_limit = options_.cache_limit});
  return std::make_unique<Runtime>(pipeline_, options_, observer_->tracer.get());
}

Loader::~Loader() {
  // A last metrics line for what happened since the previous one (the end of the data, the
  // last checkpoints).
  if (metrics_) {
    bool pending = metrics_->samples > 0;
    {
      std::lock_guard lock(observer_->mu);
      pending = pending || !observer_->checkpoints.empty();
    }
    try {
      if (pending) sample_metrics(stats_now_ns());
    } catch (...) {
      // A destructor does not throw; the callback's error is dropped.
    }
  }
  // The graph stops before the tracer closes its file (the tracer outlives every runtime).
  runtime_.reset();
}

void Loader::sample_metrics(std::int64_t now) {
  Metrics& m = *metrics_;
  const double dt = static_cast<double>(now - m.last_ns) * 1e-9;
  const LoaderStats st = stats();
  if (m.runtime != runtime_.get()) {
    m.runtime = runtime_.get();
    m.busy.assign(st.nodes.size(), 0);
    m.wait_ns = 0;
  }
  MetricsSample s;
  s.t = observer_->seconds_at(now);
  s.step = last_step_;
  s.epoch = last_epoch_;
  s.samples_per_s = dt > 0 ? static_cast<double>(m.samples) / dt : 0;
  s.mb_per_s = dt > 0 ? static_cast<double>(m.bytes) / dt * 1e-6 : 0;
  s.in_flight = st.in_flight;
  for (std::size_t i = 0; i < st.nodes.size(); ++i) {
    const auto& n = st.nodes[i];
    const double d = static_cast<double>(n.busy_ns - std::min(n.busy_ns, m.busy[i])) * 1e-9;
    s.busy.push_back({n.name, dt > 0 ? d / (dt * n.threads) : 0, n.threads});
    m.busy[i] = n.busy_ns;
  }
  s.consumer_wait =
      dt > 0 ? static_cast<double>(st.consumer_wait_ns - std::min(st.consumer_wait_ns, m.wait_ns)) *
                   1e-9 / dt
             : 0;
  m.wait_ns = st.consumer_wait_ns;
  s.rss_bytes = current_rss_bytes();
  {
    std::lock_guard lock(observer_->mu);
    s.checkpoints.swap(observer_->checkpoints);
  }
  m.samples = m.bytes = 0;
  m.last_ns = now;
  if (m.file != nullptr) {
    const std::string line = to_json_line(s) + "\n";
    std::fwrite(line.data(), 1, line.size(), m.file);
    std::fflush(m.file);
  }
  if (options_.on_metrics) options_.on_metrics(s);
}

std::optional<Batch> Loader::next() { return next_batch(nullptr); }

std::optional<Batch> Loader::next(CudaStream stream) {
  const StreamFor same = [stream](const Device&) { return stream; };
  return next_batch(&same);
}

std::optional<Batch> Loader::next(const StreamFor& stream_for) { return next_batch(&stream_for); }

std::optional<Batch> Loader::next_batch(const StreamFor* stream_for) {
  const std::int64_t entered = stats_now_ns();
  if (last_return_ns_ != 0) {
    consumer_busy_ns_ += static_cast<std::uint64_t>(entered - last_return_ns_);
    if (observer_->tracer && last_step_)
      observer_->tracer->span(Tracer::kConsumer, observer_->consumer_step, last_return_ns_, entered,
                              static_cast<std::int64_t>(*last_step_),
                              static_cast<std::int64_t>(last_epoch_.value_or(0)));
  }
  struct Returned {
    Loader* l;
    ~Returned() { l->last_return_ns_ = stats_now_ns(); }
  } returned{this};
  if (error_) std::rethrow_exception(error_);
  rethrow_failed_save();
  if (finished_) return std::nullopt;
  if (!runtime_->started()) runtime_->start();
  for (;;) {
    ItemMsg m = runtime_->take();
    if (m.error) {
      error_ = m.error;
      runtime_->stop();
      std::rethrow_exception(error_);
    }
    if (m.end) {
      finished_ = true;
      runtime_->stop();
      return std::nullopt;
    }
    if (!m.batch) continue;  // cancelled work (only while stopping)
    Batch& b = *m.batch;
    if (b.fence) {
      try {
        if (stream_for != nullptr)
          b.fence->wait((*stream_for)(b.fence->device()));
        else
          b.fence->wait();
      } catch (...) {
        try {
          rethrow_with_node(std::current_exception(), "device_copy");
        } catch (...) {
          error_ = std::current_exception();
        }
        runtime_->stop();
        std::rethrow_exception(error_);
      }
      // After a stream handover the fence stays: it holds the staging buffers until the
      // copy completes, and the consumer may name more streams (Batch::wait).
      if (stream_for == nullptr) b.fence.reset();
    }
    last_stamp_ = b.stamp;
    last_step_ = b.info.step;
    last_epoch_ = b.info.epoch;
    if (metrics_) {
      metrics_->samples += b.info.num_samples;
      for (const auto& [id, t] : b.fields) metrics_->bytes += t.nbytes();
      const std::int64_t now = stats_now_ns();
      if (static_cast<double>(now - metrics_->last_ns) * 1e-9 >= options_.metrics_interval_s)
        sample_metrics(now);
    }
    return std::move(b);
  }
}

PipelineState Loader::state_struct() const {
  PipelineState s = state_struct_without_spine();
  s.spine = serialize_stamp(*last_stamp_);
  return s;
}

PipelineState Loader::state_struct_without_spine() const {
  PipelineState s;
  s.fingerprint = fingerprint_;
  s.canonical = canonical_;
  s.last_step = last_step_;
  s.last_epoch = last_epoch_;
  s.skips = skips_.ranges;
  s.data_changes = data_changes_;
  return s;
}

std::string Loader::state() const { return state_struct().encode(); }

void Loader::rebuild(const PipelineState& state, const DataChange* change) {
  SkipRanges skips{state.skips};
  if (runtime_->pristine()) {
    // Nothing planned or restored yet: the spine is in its starting state, as a new one would
    // be, so it is restored in place — a restore right after construction (every resume) opens the
    // data once, not twice. A restore that fails half way leaves it half restored: a fresh
    // runtime replaces it, and the loader is as it was.
    try {
      runtime_->note_restored();
      runtime_->spine().restore(state.spine, change);
    } catch (...) {
      runtime_ = make_runtime();
      throw;
    }
    runtime_->spine().set_skips(skips);
  } else {
    // Open and restore a new spine first: if that fails, the loader keeps running as before.
    auto rt = make_runtime();
    rt->spine().restore(state.spine, change);
    rt->spine().set_skips(skips);
    runtime_ = std::move(rt);
  }
  skips_ = std::move(skips);
  last_stamp_ = runtime_->spine().snapshot();
  last_step_ = state.last_step;
  last_epoch_ = state.last_epoch;
  data_changes_ = state.data_changes;
  error_ = nullptr;
  finished_ = false;
  // The state applied: listings made afresh for it (a resume continuing over a changed
  // bucket) become the job's.
  save_pending_listings(*listings_);
}

namespace {

/// The parameters of `params` whose key is (an element of) one of `data`'s, or the others.
std::vector<CanonicalParam> select(const std::vector<CanonicalParam>& params,
                                   const std::vector<std::string>& data, bool want_data) {
  std::vector<CanonicalParam> out;
  for (const auto& p : params) {
    const std::string family = p.first.substr(0, p.first.find('['));
    const bool is_data = std::find(data.begin(), data.end(), family) != data.end();
    if (is_data == want_data) out.push_back(p);
  }
  return out;
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

/// Fills in what the nodes after the changed ones hold of their upstream (DataChange::
/// downstream); throws CheckpointError when one replays it, which no change continues through.
void add_downstream(const Pipeline& pipeline, DataChange& change) {
  const auto& nodes = pipeline.nodes();
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    if (!change.touches(nodes[k].name)) continue;
    for (std::size_t i = k + 1; i < nodes.size() && nodes[i].phase() < Phase::kBatch; ++i) {
      const UpstreamHold hold = nodes[i].def->holds_upstream;
      if (hold <= change.downstream) continue;
      change.downstream = hold;
      change.downstream_node = nodes[i].name;
      if (hold == UpstreamHold::kReplay)
        throw CheckpointError("state", "'" + nodes[i].name + "' after '" + nodes[k].name +
                                           "' replays its upstream from its state: a change of "
                                           "'" +
                                           nodes[k].name +
                                           "''s data cannot continue exactly through it");
    }
  }
}

/// Fills in, for every node, the nodes after it (before batch) that hold something of their
/// upstream (DataChange::holds_after), and opts in to continuing over changed files: what a
/// file source whose files changed continues through (FileSource::restore).
void add_file_change(const Pipeline& pipeline, DataChange& change) {
  change.files = true;
  const auto& nodes = pipeline.nodes();
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    auto& after = change.holds_after[nodes[k].name];
    for (std::size_t i = k + 1; i < nodes.size() && nodes[i].phase() < Phase::kBatch; ++i)
      if (nodes[i].def->holds_upstream != UpstreamHold::kNothing)
        after.emplace_back(nodes[i].def->holds_upstream, nodes[i].name);
  }
}

}  // namespace

DataChange Loader::data_change_from(const std::vector<CanonicalParam>& before,
                                    OnDataChange on_change, std::string& record) const {
  const std::vector<std::string> data = pipeline_.data_params();
  const std::string structural =
      describe_mismatch(select(before, data, false), select(canonical_, data, false));
  record = describe_mismatch(select(before, data, true), select(canonical_, data, true));
  if (!structural.empty() && on_change == OnDataChange::kContinue)
    throw CheckpointError(
        "state",
        "the state was saved by a pipeline whose output differs in what a run "
        "cannot continue over (only data parameters may change: " +
            (data.empty() ? std::string("this pipeline has none") : joined(data)) + "):\n" +
            structural);
  if (on_change != OnDataChange::kContinue)
    throw CheckpointError(
        "state", "the state was saved by a pipeline whose output differs:\n" +
                     describe_mismatch(before, canonical_) +
                     (structural.empty() ? "\n(only data parameters differ: to continue over "
                                           "them, opt in with `flowstate run --data-changed "
                                           "continue`, LoaderOptions::on_data_change or "
                                           "load_state_dict(state, data_changed=\"continue\"))"
                                         : ""));
  DataChange change;
  change.before.insert(before.begin(), before.end());
  // The nodes whose data parameters differ: each carries its state over (restore_changed).
  const auto was = select(before, data, true), now = select(canonical_, data, true);
  for (const NodeSpec& n : pipeline_.nodes()) {
    const auto of_node = [&](const std::vector<CanonicalParam>& params) {
      std::vector<CanonicalParam> out;
      for (const auto& p : params)
        if (p.first.starts_with(n.name + ".")) out.push_back(p);
      return out;
    };
    if (of_node(was) != of_node(now)) change.nodes.push_back(n.name);
  }
  add_downstream(pipeline_, change);
  add_file_change(pipeline_, change);
  return change;
}

void Loader::rebuild_changed(PipelineState state, const DataChange& change, std::string record) {
  const std::uint64_t step = state.last_step ? *state.last_step + 1 : 0;
  change.notes.clear();
  state.data_changes.push_back({step, ""});
  rebuild(state, &change);
  for (const auto& note : change.notes) record += (record.empty() ? "" : "\n") + note;
  if (record.empty())
    data_changes_.pop_back();  // nothing changed after all (the same weights again)
  else
    data_changes_.back().what = std::move(record);
}

void Loader::load_state(std::string_view bytes) { load_state(bytes, options_.on_data_change); }

void Loader::load_state(std::string_view bytes, OnDataChange on_change) {
  PipelineState s = PipelineState::decode(bytes);
  if (s.fingerprint == fingerprint_) {
    if (on_change != OnDataChange::kContinue) {
      rebuild(s);
      return;
    }
    // The same configuration: only a source's files may have changed (FileSource::restore
    // continues over them and notes it; nothing noted, nothing is recorded).
    DataChange change;
    add_file_change(pipeline_, change);
    rebuild_changed(std::move(s), change, "");
    return;
  }
  std::string record;
  DataChange change = data_change_from(s.canonical, on_change, record);
  rebuild_changed(std::move(s), change, std::move(record));
}

void Loader::set_mix_weights(const std::string& node, const std::vector<double>& weights) {
  const std::vector<std::string> data = pipeline_.data_params();
  if (std::find(data.begin(), data.end(), node + ".weights") == data.end())
    throw ConfigError("set_mix_weights", "set_mix_weights: '" + node +
                                             "' is not a mix node of this pipeline (its data "
                                             "parameters: " +
                                             (data.empty() ? std::string("none") : joined(data)) +
                                             ")");
  std::string text;
  for (double w : weights) text += (text.empty() ? "" : ", ") + format_double(w);
  DataChange change;
  change.before.insert(canonical_.begin(), canonical_.end());
  change.set[node + ".weights"] = "[" + text + "]";
  change.nodes.push_back(node);
  try {
    add_downstream(pipeline_, change);
  } catch (const CheckpointError& e) {
    throw ConfigError("set_mix_weights", std::string("set_mix_weights: ") + e.what());
  }
  rebuild_changed(state_struct(), change, "");
}

void Loader::skip(std::uint64_t first, std::uint64_t last) {
  if (first > last)
    throw ConfigError("skip", "skip range " + std::to_string(first) + ":" + std::to_string(last) +
                                  " is reversed (first > last)");
  if (last_step_ && first <= *last_step_)
    throw ConfigError("skip", "skip range " + std::to_string(first) + ":" + std::to_string(last) +
                                  " starts at or before step " + std::to_string(*last_step_) +
                                  ", which was already delivered");
  PipelineState s = state_struct();
  SkipRanges skips{s.skips};
  skips.add(first, last);
  s.skips = skips.ranges;
  // Re-plan from the last delivered batch: batches prepared ahead are discarded, so the
  // skip and the is_last_in_epoch marks are exact.
  rebuild(s);
}

}  // namespace flowstate
