// flowstate._flowstate: the C++ side of the Python package (python/flowstate/__init__.py holds
// the Python API over it). It binds the registry, the YAML loader (the only way a Python
// pipeline is made: from a file, a dict or the chained builder, so every check and message is
// the CLI's) and the Loader. Python sources, maps, filters and collate functions as nodes are
// nodes.cpp; batches as torch tensors are batches.cpp; binding.h is what the three share.
//
// The GIL: every call that may wait on the graph (next, load_state, skip, restore, saves, the
// Loader's construction and destruction) releases it, because the graph's threads take it to
// run Python callbacks. Python objects riding in samples are PyObj, whose copies and
// destruction take the GIL themselves.
#include "binding.h"

using namespace flowstate;
using namespace flowstate::python;

namespace {

/// `s` as a Python str the way os.fsdecode makes one: UTF-8, a byte outside it kept as a lone
/// surrogate (surrogateescape), so a non-UTF-8 path never raises UnicodeDecodeError and
/// os.fsencode gives its bytes back.
py::str fs_str(const std::string& s) {
  PyObject* o =
      PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "surrogateescape");
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

// ---- schema ----

py::object param_value(const ParamValue& v) {
  return std::visit([](const auto& x) -> py::object { return py::cast(x); }, v);
}

py::dict param_dict(const ParamSchema& p) {
  py::dict d;
  d["name"] = p.name;
  d["type"] = std::string(param_type_name(p.type));
  d["default"] = p.default_value ? param_value(*p.default_value) : py::none();
  d["doc"] = p.doc;
  d["required"] = p.required;
  d["min"] = p.min ? py::cast(*p.min) : py::none();
  d["max"] = p.max ? py::cast(*p.max) : py::none();
  d["choices"] = p.choices;
  d["free"] = p.free;
  d["data"] = p.data;
  d["default_doc"] = p.default_doc;
  if (p.type == ParamType::kMap) {  // a group: its sub-parameters, described alike
    py::list fields;
    for (const ParamSchema& f : p.fields) fields.append(param_dict(f));
    d["fields"] = fields;
  }
  return d;
}

py::list schema() {
  py::list out;
  for (const NodeSchema& s : Registry::global().nodes()) {
    if (!s.add) continue;  // C++-only types (iterable) are not written in a pipeline
    py::dict d;
    d["type"] = s.type;
    d["doc"] = s.doc;
    d["source"] = s.source;
    py::list params;
    for (const ParamSchema& p : s.params) params.append(param_dict(p));
    d["params"] = params;
    d["dispatch"] = s.dispatch;
    out.append(d);
  }
  return out;
}

py::list top_level_params() {
  py::list out;
  for (const ParamSchema& p : pipeline_params()) out.append(param_dict(p));
  return out;
}

// ---- pipelines ----

/// A Pipeline with the Python objects its nodes call (kept alive with it).
struct PyPipeline {
  Pipeline pipeline;
  std::shared_ptr<std::vector<PyObj>> specs;
};

py::tuple load_yaml(const std::string& text_or_path, bool is_file, const std::string& origin,
                    const std::vector<std::string>& overrides, std::optional<std::string> base_dir,
                    const py::list& python_nodes) {
  auto specs = kept_list();
  for (const py::handle& h : python_nodes) specs->emplace_back(h);
  Registry registry = python_registry(specs);
  YamlOptions options{.overrides = overrides, .registry = &registry};
  if (base_dir) options.base_dir = *base_dir;
  PipelineConfig config = is_file ? load_yaml_file(text_or_path, options)
                                  : load_yaml_string(text_or_path, origin, options);
  py::object checkpoint = py::none();
  if (config.checkpoint) {
    py::dict c;
    c["dir"] = config.checkpoint->dir;
    c["every_steps"] = config.checkpoint->every_steps;
    c["keep"] = config.checkpoint->keep;
    checkpoint = c;
  }
  return py::make_tuple(PyPipeline{std::move(config.pipeline), std::move(specs)}, config.epochs,
                        checkpoint);
}

// ---- the loader ----

/// A Coordinator (core/coordinator.h) over a Python object with `rank()`, `world()`,
/// `all_gather(bytes) -> list[bytes]` and `barrier()` — flowstate.Loader's process_group
/// wraps torch.distributed in one. Each call takes the GIL.
class PyCoordinator final : public Coordinator {
 public:
  explicit PyCoordinator(py::object impl) : impl_(std::move(impl)) {
    rank_ = impl_.attr("rank")().cast<std::uint64_t>();
    world_ = impl_.attr("world")().cast<std::uint64_t>();
  }
  ~PyCoordinator() override {
    py::gil_scoped_acquire gil;
    impl_ = py::object();
  }
  std::uint64_t rank() const override { return rank_; }
  std::uint64_t world() const override { return world_; }
  std::vector<std::string> all_gather(std::string_view message) override {
    py::gil_scoped_acquire gil;
    py::list got = impl_.attr("all_gather")(py::bytes(message.data(), message.size()));
    std::vector<std::string> out;
    for (py::handle h : got) out.push_back(h.cast<std::string>());
    if (out.size() != world_)
      throw Error("process_group: all_gather returned " + std::to_string(out.size()) +
                  " messages for " + std::to_string(world_) + " ranks");
    return out;
  }
  void barrier() override {
    py::gil_scoped_acquire gil;
    impl_.attr("barrier")();
  }

 private:
  py::object impl_;
  std::uint64_t rank_ = 0, world_ = 1;
};

/// The readable fields of a state (Loader.state_dict()'s): the next step, the last batch's
/// epoch (None before the first), the fingerprint.
py::dict fields_of(const PipelineState& s) {
  py::dict d;
  d["step"] = s.last_step ? *s.last_step + 1 : 0;
  d["epoch"] = s.last_epoch ? py::cast(*s.last_epoch) : py::none();
  d["fingerprint"] = s.fingerprint;
  return d;
}

class PyLoader;

/// The live loaders, stopped by shutdown() (registered with atexit): the graph's threads must
/// be gone before the interpreter finalizes, or one of them taking the GIL for a callback
/// would be ended inside C++ frames.
struct LiveLoaders {
  std::mutex mu;
  std::set<PyLoader*> loaders;
  bool shut_down = false;
};
LiveLoaders& live_loaders() {
  static auto* live = new LiveLoaders;  // never destroyed: used until the process ends
  return *live;
}

/// A Loader whose blocking calls release the GIL.
class PyLoader {
 public:
  /// `checkpoint_dir`, `cache_dir` and `cache_limit` are LoaderOptions' (empty, 0: unset).
  PyLoader(const PyPipeline& p, std::uint64_t epochs, std::optional<int> workers,
           std::optional<std::size_t> prefetch, py::object coordinator, std::string checkpoint_dir,
           std::string cache_dir, std::uint64_t cache_limit)
      : specs_(p.specs) {
    std::shared_ptr<Coordinator> coord;
    if (!coordinator.is_none()) coord = std::make_shared<PyCoordinator>(std::move(coordinator));
    coordinator_ = coord;
    {
      std::lock_guard lock(live_loaders().mu);
      if (live_loaders().shut_down)
        throw Error("the interpreter is shutting down: no new flowstate.Loader");
    }
    {
      py::gil_scoped_release release;
      loader_ = std::make_unique<Loader>(p.pipeline, LoaderOptions{.epochs = epochs,
                                                                   .workers = workers,
                                                                   .prefetch = prefetch,
                                                                   .coordinator = std::move(coord),
                                                                   .checkpoint_dir = checkpoint_dir,
                                                                   .cache_dir = cache_dir,
                                                                   .cache_limit = cache_limit});
    }
    std::lock_guard lock(live_loaders().mu);
    live_loaders().loaders.insert(this);
  }
  ~PyLoader() {
    {
      std::lock_guard lock(live_loaders().mu);
      live_loaders().loaders.erase(this);
    }
    stop();
  }
  PyLoader(const PyLoader&) = delete;
  PyLoader& operator=(const PyLoader&) = delete;
  /// Stops the graph and drops the loader; the GIL is held on entry.
  void stop() {
    if (!loader_) return;
    py::gil_scoped_release release;
    loader_.reset();
  }
  Loader& loader() const {
    if (!loader_) throw Error("this flowstate.Loader was stopped at interpreter shutdown");
    return *loader_;
  }
  /// The next batch's parts (batch_parts), or None. A batch copied to a CUDA device is handed
  /// over to PyTorch's current stream on that device (no host wait).
  py::object next() {
    std::optional<Batch> b;
    {
      py::gil_scoped_release release;
      static const Loader::StreamFor kTorchStream = torch_current_stream;
      b = loader().next(kTorchStream);
    }
    if (!b) return py::none();
    return batch_parts(*b);
  }
  py::bytes state() const { return py::bytes(loader().state()); }
  py::dict state_fields() const { return fields_of(loader().state_struct()); }
  void load_state(const std::string& state, bool continue_on_data_change) {
    py::gil_scoped_release release;
    loader().load_state(state,
                        continue_on_data_change ? OnDataChange::kContinue : OnDataChange::kRefuse);
  }
  void set_mix_weights(const std::string& node, const std::vector<double>& weights) {
    py::gil_scoped_release release;
    loader().set_mix_weights(node, weights);
  }
  py::list data_changes() const {
    py::list out;
    for (const auto& c : loader().data_changes()) out.append(py::make_tuple(c.step, c.what));
    return out;
  }
  void skip(std::uint64_t first, std::uint64_t last) {
    py::gil_scoped_release release;
    loader().skip(first, last);
  }
  std::string save_checkpoint(const std::string& dir, std::size_t keep, bool overwrite) {
    py::gil_scoped_release release;
    return loader().save_checkpoint(dir, {.keep = keep, .overwrite = overwrite});
  }
  /// Writes `state` — one this loader's state() returned earlier (a plan's, whose loader runs
  /// ahead of the batches delivered: flowstate/_workers.py) — as the checkpoint of its step,
  /// collectively when the loader has a coordinator.
  std::string save_state_checkpoint(const std::string& dir, const std::string& state,
                                    std::size_t keep, bool overwrite) {
    py::gil_scoped_release release;
    const PipelineState decoded = PipelineState::decode(state);
    const std::uint64_t step = decoded.last_step ? *decoded.last_step + 1 : 0;
    const CheckpointWriteOptions options{.keep = keep, .overwrite = overwrite};
    if (coordinator_) return write_group_checkpoint(dir, step, state, *coordinator_, options);
    return write_checkpoint(dir, step, state, options);
  }
  py::object restore(const std::string& dir) {
    std::optional<CheckpointFound> found;
    {
      py::gil_scoped_release release;
      found = loader().restore(dir);
    }
    if (!found) return py::none();
    py::dict d;
    d["path"] = found->path;
    d["step"] = found->step;
    d["skipped"] = found->skipped;
    return d;
  }
  py::dict stats() const {
    LoaderStats s = loader().stats();
    py::list stages;
    for (const auto& st : s.stages) {
      py::dict d;
      d["name"] = st.name;
      d["items"] = st.items;
      d["busy_ns"] = st.busy_ns;
      d["concurrency"] = st.concurrency;
      stages.append(d);
    }
    py::dict d;
    d["stages"] = stages;
    d["consumer_waits"] = s.consumer_waits;
    d["consumer_wait_ns"] = s.consumer_wait_ns;
    d["graph_waits"] = s.graph_waits;
    d["in_flight_limit"] = s.in_flight_limit;
    d["messages"] = s.messages;
    return d;
  }
  std::uint64_t fingerprint() const { return loader().pipeline().fingerprint(); }

 private:
  std::shared_ptr<std::vector<PyObj>> specs_;
  std::shared_ptr<Coordinator> coordinator_;
  std::unique_ptr<Loader> loader_;
};

/// Sets `attrs` on a new instance of `type` with message `what`, and raises it.
void raise(const py::object& type, const char* what, const py::dict& attrs) {
  py::object e = type(what);
  for (const auto& [k, v] : attrs) e.attr(k) = v;
  PyErr_SetObject(type.ptr(), e.ptr());
}

}  // namespace

PYBIND11_MODULE(_flowstate, m) {
  m.doc() = "flowstate's C++ core; use the `flowstate` package.";

  static py::object error = py::reinterpret_borrow<py::object>(
      PyErr_NewException("flowstate.Error", PyExc_RuntimeError, nullptr));
  static py::object config_error = py::reinterpret_borrow<py::object>(PyErr_NewException(
      "flowstate.ConfigError", py::make_tuple(error, py::handle(PyExc_ValueError)).ptr(), nullptr));
  static py::object data_error = py::reinterpret_borrow<py::object>(
      PyErr_NewException("flowstate.DataError", error.ptr(), nullptr));
  static py::object checkpoint_error = py::reinterpret_borrow<py::object>(
      PyErr_NewException("flowstate.CheckpointError", error.ptr(), nullptr));
  m.attr("Error") = error;
  m.attr("ConfigError") = config_error;
  m.attr("DataError") = data_error;
  m.attr("CheckpointError") = checkpoint_error;

  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const PythonError& e) {
      py::object exc = e.exception()->get();
      if (!e.node().empty()) {
        exc.attr("flowstate_node") = e.node();
        if (py::hasattr(exc, "add_note"))
          exc.attr("add_note")("raised in flowstate node '" + e.node() + "'");
      }
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    } catch (const ConfigError& e) {
      py::dict a;
      a["key"] = e.key();
      a["node"] = e.node();
      raise(config_error, e.what(), a);
    } catch (const DataError& e) {
      py::dict a;
      a["file"] = e.file();
      a["offset"] = e.offset() == DataError::kNoOffset ? py::none() : py::cast(e.offset());
      a["node"] = e.node();
      raise(data_error, e.what(), a);
    } catch (const CheckpointError& e) {
      py::dict a;
      a["file"] = e.file();
      a["node"] = e.node();
      raise(checkpoint_error, e.what(), a);
    } catch (const Error& e) {
      py::dict a;
      a["node"] = e.node();
      raise(error, e.what(), a);
    }
  });

  // A view `offset` bytes into a buffer holding `data`, exported as to_torch exports every
  // field: what the tests use to check the DLPack export of a view from Python.
  // A field of any dtype ("uint16", ...) is exported by the same rule (widened where this
  // torch lacks the type).
  m.def(
      "_export_view_for_test",
      [](const py::bytes& data, std::size_t offset, const std::vector<std::int64_t>& shape,
         const std::string& dtype) {
        const std::string bytes = data;
        auto buffer = Buffer::allocate(bytes.size());
        std::memcpy(buffer->data(), bytes.data(), bytes.size());
        return to_torch(Tensor(std::move(buffer), offset, parse_dtype(dtype), Shape::of(shape)),
                        "test");
      },
      py::arg("data"), py::arg("offset"), py::arg("shape"), py::arg("dtype") = "uint8");
  m.def(
      "shutdown",
      [] {
        std::vector<PyLoader*> loaders;
        {
          std::lock_guard lock(live_loaders().mu);
          live_loaders().shut_down = true;
          loaders.assign(live_loaders().loaders.begin(), live_loaders().loaders.end());
        }
        for (PyLoader* l : loaders) l->stop();
        release_kept();
      },
      "Stops every Loader's graph (registered with atexit).");
  m.def(
      "state_fields",
      [](const py::bytes& state) { return fields_of(PipelineState::decode(std::string(state))); },
      "The readable fields of an encoded state: step, epoch, fingerprint.");
  m.def("schema", &schema, "Every node type a pipeline may name, with its parameters.");
  m.def("pipeline_params", &top_level_params, "The top-level keys of a pipeline document.");
  m.def("load_yaml", &load_yaml, py::arg("text_or_path"), py::arg("is_file"), py::arg("origin"),
        py::arg("overrides"), py::arg("base_dir"), py::arg("python_nodes"));

  py::class_<PyFence>(m, "Fence")
      .def("wait", &PyFence::wait, py::arg("stream") = py::none(),
           "Without a stream, blocks until the batch's device copy is complete; with one "
           "(torch.cuda.Stream or its handle), makes it wait on the copy (cudaStreamWaitEvent).")
      .def_property_readonly("device", &PyFence::device);
  py::class_<PyDLPackTensor>(m, "DLPackTensor")
      .def("__dlpack__", &PyDLPackTensor::dlpack, py::arg("stream") = py::none())
      .def("__dlpack_device__", &PyDLPackTensor::dlpack_device);

  py::class_<PyPipeline>(m, "Pipeline")
      .def_property_readonly("fingerprint",
                             [](const PyPipeline& p) { return p.pipeline.fingerprint(); })
      .def_property_readonly("seed", [](const PyPipeline& p) { return p.pipeline.seed(); })
      .def_property_readonly("workers", [](const PyPipeline& p) { return p.pipeline.workers(); })
      .def_property_readonly("warnings", [](const PyPipeline& p) { return p.pipeline.warnings(); })
      .def_property_readonly("node_names",
                             [](const PyPipeline& p) {
                               std::vector<std::string> names;
                               for (const auto& n : p.pipeline.nodes()) names.push_back(n.name);
                               return names;
                             })
      // Values that are not UTF-8 (a path in another encoding) decode as os.fsdecode does
      // (surrogateescape): os.fsencode gives the bytes back.
      .def("canonical",
           [](const PyPipeline& p) {
             py::list out;
             for (const auto& [k, v] : p.pipeline.canonical())
               out.append(py::make_tuple(fs_str(k), fs_str(v)));
             return out;
           })
      .def("describe", [](const PyPipeline& p) { return fs_str(p.pipeline.describe()); });

  m.def(
      "parse_byte_size",
      [](const std::string& text, const std::string& key) { return parse_byte_size(text, key); },
      py::arg("text"), py::arg("key"),
      "Bytes a size like 20GiB, 500MB or 1048576 stands for; ConfigError under `key` otherwise.");

  py::class_<PyLoader>(m, "Loader")
      .def(
          py::init<const PyPipeline&, std::uint64_t, std::optional<int>, std::optional<std::size_t>,
                   py::object, std::string, std::string, std::uint64_t>(),
          py::arg("pipeline"), py::arg("epochs"), py::arg("workers"), py::arg("prefetch"),
          py::arg("coordinator") = py::none(), py::arg("checkpoint_dir") = std::string(),
          py::arg("cache_dir") = std::string(), py::arg("cache_limit") = std::uint64_t{0})
      .def("next", &PyLoader::next)
      .def("state", &PyLoader::state)
      .def("state_fields", &PyLoader::state_fields)
      .def("load_state", &PyLoader::load_state, py::arg("state"),
           py::arg("continue_on_data_change") = false)
      .def("set_mix_weights", &PyLoader::set_mix_weights)
      .def("data_changes", &PyLoader::data_changes)
      .def("skip", &PyLoader::skip)
      .def("save_checkpoint", &PyLoader::save_checkpoint)
      .def("save_state_checkpoint", &PyLoader::save_state_checkpoint)
      .def("restore", &PyLoader::restore)
      .def("stats", &PyLoader::stats)
      .def_property_readonly("fingerprint", &PyLoader::fingerprint);

  py::class_<GradientAccumulator>(m, "GradientAccumulator")
      .def(py::init<std::uint64_t, std::uint64_t>(), py::arg("micro_batches"),
           py::arg("batch_size"))
      .def("step_after",
           [](const GradientAccumulator& a, std::uint64_t index_in_epoch, bool last,
              std::uint32_t num_samples) {
             BatchInfo i;
             i.index_in_epoch = index_in_epoch;
             i.is_last_in_epoch = last;
             i.num_samples = num_samples;
             return a.step_after(i);
           })
      .def("loss_scale",
           [](const GradientAccumulator& a, std::uint64_t index_in_epoch, bool last,
              std::uint32_t num_samples) {
             BatchInfo i;
             i.index_in_epoch = index_in_epoch;
             i.is_last_in_epoch = last;
             i.num_samples = num_samples;
             return a.loss_scale(i);
           })
      .def("step_scale", [](const GradientAccumulator& a, std::uint64_t index_in_epoch, bool last,
                            std::uint32_t num_samples) {
        BatchInfo i;
        i.index_in_epoch = index_in_epoch;
        i.is_last_in_epoch = last;
        i.num_samples = num_samples;
        return a.step_scale(i);
      });
  bind_state(m);
}
