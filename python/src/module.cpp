// flowstate._flowstate: the C++ side of the Python package (python/flowstate/__init__.py holds
// the Python API over it). It binds the registry, the YAML loader (the only way a Python
// pipeline is made: from a file, a dict or the chained builder, so every check and message is
// the CLI's), the Loader, and Python sources, maps, filters and collate functions as nodes.
//
// The GIL: every call that may wait on the graph (next, load_state, skip, restore, saves, the
// Loader's construction and destruction) releases it, because the graph's threads take it to
// run Python callbacks. Python objects riding in samples are PyObj, whose copies and
// destruction take the GIL themselves.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <ranges>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "flowstate/config/registry.h"
#include "flowstate/config/yaml.h"
#include "flowstate/core/coordinator.h"
#include "flowstate/core/error.h"
#include "flowstate/graph/accumulate.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/device_copy.h"
#include "flowstate/nodes/sources/iterable.h"

namespace py = pybind11;
using namespace flowstate;

namespace {

/// A strong reference to a Python object that may be copied and destroyed on any thread: it
/// takes the GIL for its reference counting. After interpreter shutdown it leaks instead.
class PyObj {
 public:
  PyObj() = default;
  /// Takes a reference; the GIL is held.
  explicit PyObj(const py::handle& h) : o_(h.ptr()) { Py_XINCREF(o_); }
  PyObj(const PyObj& other) : o_(other.o_) {
    if (o_ == nullptr) return;
    py::gil_scoped_acquire gil;
    Py_INCREF(o_);
  }
  PyObj(PyObj&& other) noexcept : o_(std::exchange(other.o_, nullptr)) {}
  PyObj& operator=(PyObj other) noexcept {
    std::swap(o_, other.o_);
    return *this;
  }
  ~PyObj() {
    if (o_ == nullptr || !Py_IsInitialized() || _Py_IsFinalizing()) return;
    py::gil_scoped_acquire gil;
    Py_DECREF(o_);
  }
  /// A new reference; the GIL must be held.
  py::object get() const { return py::reinterpret_borrow<py::object>(o_); }

 private:
  PyObject* o_ = nullptr;
};

/// A Python exception raised by a callback inside the graph. It travels through the graph as
/// a flowstate::Error (which names the node) and is raised again in Python as the original
/// exception object, with a note naming the node.
class PythonError final : public Error {
 public:
  PythonError(const std::string& what, std::shared_ptr<PyObj> exception)
      : Error(what), exception_(std::move(exception)) {}
  std::exception_ptr with_node(const std::string& node) const override {
    PythonError copy("node '" + node + "': " + what(), exception_);
    copy.node_ = node;
    return std::make_exception_ptr(copy);
  }
  const std::shared_ptr<PyObj>& exception() const { return exception_; }

 private:
  std::shared_ptr<PyObj> exception_;
};

/// Runs `fn` under the GIL; a Python exception becomes a PythonError saying `who` raised it.
template <class Fn>
auto call_python(const std::string& who, Fn&& fn) -> decltype(fn()) {
  py::gil_scoped_acquire gil;
  try {
    return fn();
  } catch (py::error_already_set& e) {
    auto exception = std::make_shared<PyObj>(e.value());
    std::string what = who + " raised " + std::string(py::str(e.type().attr("__name__"))) + ": " +
                       std::string(py::str(e.value()));
    throw PythonError(what, std::move(exception));
  }
}

/// A Python callable with its label, shared by the node copies of every Loader.
struct PyCallable {
  std::shared_ptr<PyObj> fn;
  std::string who;  ///< "map 'normalize'", for messages
};

// ---- sources ----

/// seq[i] for from_sequence: the range is iota(0, n) | transform(SequenceItem), random access.
struct SequenceItem {
  PyCallable seq;
  PyObj operator()(std::uint64_t i) const {
    return call_python(seq.who, [&] {
      py::object s = seq.fn->get();
      return PyObj(s[py::int_(i)]);
    });
  }
};

/// A producer over one epoch of a Python iterable made by the user's factory.
struct PyProducer {
  PyCallable factory;
  std::uint64_t epoch = 0;
  bool takes_epoch = false;
  std::shared_ptr<PyObj> made;      ///< what the factory returned
  std::shared_ptr<PyObj> iterator;  ///< iter(made)

  void open() {
    call_python(factory.who, [&] {
      py::object f = factory.fn->get();
      py::object obj = takes_epoch ? f(epoch) : f();
      made = std::make_shared<PyObj>(obj);
      iterator = std::make_shared<PyObj>(py::iter(obj));
    });
  }
  std::optional<PyObj> next() {
    if (!iterator) open();
    return call_python(factory.who, [&]() -> std::optional<PyObj> {
      py::object it = iterator->get();
      PyObject* item = PyIter_Next(it.ptr());
      if (item == nullptr) {
        if (PyErr_Occurred()) throw py::error_already_set();
        return std::nullopt;
      }
      py::object value = py::reinterpret_steal<py::object>(item);
      return PyObj(value);
    });
  }
};

/// The same, for an iterable whose object has state_dict()/load_state_dict(): resumes exactly
/// through them (the state is pickled into the batch's stamp).
struct ResumablePyProducer : PyProducer {
  std::string save() const {
    if (!made) return {};  // not opened yet: a fresh producer is the position
    return call_python(factory.who + " state_dict()", [&] {
      py::object obj = made->get();
      py::object bytes = py::module_::import("pickle").attr("dumps")(obj.attr("state_dict")());
      return std::string(py::bytes(bytes));
    });
  }
  void load(std::string_view s) {
    if (!iterator) open();
    call_python(factory.who + " load_state_dict()", [&] {
      py::object state = py::module_::import("pickle").attr("loads")(py::bytes(s.data(), s.size()));
      made->get().attr("load_state_dict")(state);
    });
  }
};

template <class P>
struct ProducerFactory {
  PyCallable factory;
  bool takes_epoch = false;
  P operator()(std::uint64_t epoch) const {
    P p;
    p.factory = factory;
    p.epoch = epoch;
    p.takes_epoch = takes_epoch;
    return p;
  }
};

void python_value_to_device(UserValue& value, DeviceCopy& copy);
py::object to_torch(const Tensor& t);

/// Collates a batch of Python values with the Python `collate` (the user's or the default).
UserCollateFn python_collate(PyCallable collate) {
  return [collate](std::vector<Sample>& samples, Batch& batch) {
    std::vector<PyObj> values;
    values.reserve(samples.size());
    for (std::size_t i = 0; i < samples.size(); ++i) {
      if (!samples[i].user.holds<PyObj>())
        throw DataError("", DataError::kNoOffset,
                        detail::collate_mismatch(i, samples[i], typeid(PyObj)));
      values.push_back(std::move(samples[i].user.get<PyObj>()));
    }
    PyObj collated = call_python(collate.who, [&] {
      py::list list(values.size());
      for (std::size_t i = 0; i < values.size(); ++i) list[i] = values[i].get();
      values.clear();  // under the GIL: the list holds them now
      return PyObj(collate.fn->get()(list));
    });
    batch.user = UserValue::make(std::move(collated));
    batch.user_to_device = python_value_to_device;
  };
}

std::string attr_string(const py::handle& h, const char* name) { return py::str(h.attr(name)); }

PyCallable callable_of(const py::handle& spec, const char* attr, const std::string& who) {
  return {std::make_shared<PyObj>(spec.attr(attr)), who};
}

/// The source a Python spec describes (kind "sequence" or "iterable").
SourceSpec python_source(const py::handle& spec) {
  const std::string kind = attr_string(spec, "kind");
  RangeOptions options{.name = attr_string(spec, "name")};
  if (!spec.attr("size").is_none()) options.size = spec.attr("size").cast<std::uint64_t>();
  SourceSpec source;
  if (kind == "sequence") {
    const auto n = spec.attr("length").cast<std::uint64_t>();
    SequenceItem item{callable_of(spec, "obj", "sequence '" + options.name + "' __getitem__")};
    source = from_range(std::views::iota(std::uint64_t{0}, n) | std::views::transform(item),
                        std::move(options));
  } else {
    const PyCallable factory = callable_of(spec, "obj", "iterable '" + options.name + "'");
    const bool takes_epoch = spec.attr("takes_epoch").cast<bool>();
    if (spec.attr("resumable").cast<bool>())
      source = from_producer(ProducerFactory<ResumablePyProducer>{factory, takes_epoch},
                             std::move(options));
    else {
      const std::string name = options.name;
      source = from_producer(ProducerFactory<PyProducer>{factory, takes_epoch}, std::move(options));
      source.warnings = {"'" + name +
                         "' has no state_dict()/load_state_dict(): a resume replays its epoch "
                         "from the start (up to one epoch of work)"};
    }
  }
  source.user_collate = python_collate(
      callable_of(spec, "collate", "collate of '" + attr_string(spec, "name") + "'"));
  return source;
}

// ---- Python maps and filters on tensor samples ----

/// `t` as a read-only numpy array sharing its memory (the array keeps the tensor alive): a
/// source's samples may view a read-only file mapping, which an in-place change would crash
/// on. The GIL is held.
py::array numpy_view(const Tensor& t) {
  const std::size_t item = dtype_size(t.dtype());
  std::vector<py::ssize_t> shape, strides;
  for (std::int64_t d : t.shape().dims()) shape.push_back(static_cast<py::ssize_t>(d));
  strides.resize(shape.size());
  py::ssize_t stride = static_cast<py::ssize_t>(item);
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<py::ssize_t>(shape[i], 1);
  }
  py::capsule owner(new Tensor(t), [](void* p) { delete static_cast<Tensor*>(p); });
  py::array a(py::dtype(std::string(dtype_name(t.dtype()))), shape, strides, t.data(), owner);
  a.attr("flags").attr("writeable") = false;
  return a;
}

/// A sample's tensor fields as a dict field -> read-only numpy view. The GIL is held.
py::dict sample_dict(const Sample& s) {
  py::dict d;
  for (const auto& [id, t] : s) d[py::str(std::string(field_name(id)))] = numpy_view(t);
  return d;
}

/// The value `v` of field `field` that `who` returned (a torch CPU tensor, a numpy array,
/// anything numpy.asarray takes) as a Tensor sharing its memory when it is contiguous. The
/// GIL is held; throws Error for a type flowstate has no dtype for.
Tensor tensor_of(const py::handle& v, const std::string& who, const std::string& field) {
  static py::object* contiguous =
      new py::object(py::module_::import("numpy").attr("ascontiguousarray"));  // never destroyed
  py::array a = (*contiguous)(v);
  const std::string name = py::str(a.dtype().attr("name"));
  DType dtype;
  try {
    dtype = parse_dtype(name);
  } catch (const ConfigError&) {
    throw Error(who + " returned field '" + field + "' of dtype " + name +
                ", which flowstate does not hold (uint8..int64, float32, float64, bool)");
  }
  std::vector<std::int64_t> dims;
  for (py::ssize_t i = 0; i < a.ndim(); ++i) dims.push_back(a.shape(i));
  auto owner = std::make_shared<PyObj>(a);
  auto buffer = Buffer::borrow(const_cast<void*>(a.data()), static_cast<std::size_t>(a.nbytes()),
                               std::move(owner));
  return Tensor(std::move(buffer), 0, dtype, Shape::of(dims));
}

/// device_copy of a Python source's batch: the CPU torch tensors of the collated value (a
/// tensor, or dicts, lists and tuples of them, walked by flowstate._map_tensors) move to the
/// target with DeviceCopy::to_device, so they join the batch's fence and its stream handover.
/// A tensor of a dtype flowstate does not hold (float16, ...) is moved by torch itself
/// (`.to(device)`, complete when it returns). Host targets leave the value as it is.
void python_value_to_device(UserValue& value, DeviceCopy& copy) {
  if (copy.target().kind != MemoryKind::kDevice || !value.holds<PyObj>()) return;
  PyObj& v = value.get<PyObj>();
  const std::string device = copy.target().to_string();
  v = call_python("device_copy of '" + device + "' (a Python batch)", [&] {
    py::cpp_function move([&copy, device](const py::object& t) -> py::object {
      Tensor host;
      try {
        host = tensor_of(t, "collate", "value");
      } catch (const Error&) {
        return t.attr("to")(device);
      }
      return to_torch(copy.to_device(host));
    });
    return PyObj(py::module_::import("flowstate").attr("_map_tensors")(v.get(), move));
  });
}

/// A Python map on any sample: a Python value (a Python source's) is passed as it is and
/// replaced by what the function returns; a tensor sample is passed as sample_dict() and its
/// fields replaced by the returned mapping's.
SampleFn python_map_fn(PyCallable fn) {
  return [fn](Sample& s, MapContext&) {
    if (s.user.holds<PyObj>()) {
      PyObj& v = s.user.get<PyObj>();
      v = call_python(fn.who, [&] { return PyObj(fn.fn->get()(v.get())); });
      return;
    }
    Fields out = call_python(fn.who, [&] {
      py::object r = fn.fn->get()(sample_dict(s));
      if (!py::isinstance<py::dict>(r) &&
          !py::isinstance(r, py::module_::import("collections.abc").attr("Mapping")))
        throw Error(fn.who + " returned " + std::string(py::str(py::type::of(r).attr("__name__"))) +
                    " for a sample of tensor fields; return a dict field -> array");
      Fields f;
      for (const auto& [k, v] : py::dict(r)) {
        const std::string field = py::str(k);
        f.set(field, tensor_of(v, fn.who, field));
      }
      return f;
    });
    static_cast<Fields&>(s) = std::move(out);
  };
}

/// A Python filter on any sample (the value, or sample_dict()).
std::function<bool(const Sample&, MapContext&)> python_filter_fn(PyCallable fn) {
  return [fn](const Sample& s, MapContext&) {
    return call_python(fn.who, [&] {
      py::object arg = s.user.holds<PyObj>() ? s.user.get<PyObj>().get() : sample_dict(s);
      return py::bool_(fn.fn->get()(arg)).cast<bool>();
    });
  };
}

/// The registry of one Python pipeline: the process's node types, plus `iterable` (a Python
/// source), `python_map` and `python_filter`, whose `ref` indexes `specs`.
Registry python_registry(const std::shared_ptr<std::vector<PyObj>>& specs) {
  Registry r;
  for (const NodeSchema& s : Registry::global().nodes())
    if (s.type != "iterable") r.add(s);
  const ParamSchema ref{.name = "ref",
                        .type = ParamType::kUInt,
                        .doc = "the Python object (set by the flowstate package)",
                        .required = true};
  auto spec_of = [specs](const Params& p) {
    const auto i = p.uint("ref");
    if (i >= specs->size())
      throw ConfigError(p.key("ref"), "no Python object " + std::to_string(i));
    return (*specs)[i].get();
  };

  NodeSchema source{.type = "iterable",
                    .doc = "a Python sequence or iterable",
                    .source = true,
                    .params = {ref},
                    .def = &iterable_node()};
  source.add = [spec_of](NodeContext& ctx) {
    ctx.builder.source(python_source(spec_of(ctx.params)));
  };
  r.add(std::move(source));

  NodeSchema map{.type = "python_map", .doc = "a Python function on each sample", .params = {ref}};
  map.params.push_back({.name = "workers",
                        .type = ParamType::kUInt,
                        .doc = "parallel workers assembling batches",
                        .min = 1,
                        .max = 1024,
                        .free = true});
  map.node_name = [spec_of](const Params& p) { return attr_string(spec_of(p), "name"); };
  map.add = [spec_of](NodeContext& ctx) {
    py::object spec = spec_of(ctx.params);
    const std::string name = attr_string(spec, "name");
    if (ctx.after_batch)
      throw ConfigError("python_map", "a Python map '" + name +
                                          "' works on samples: put it before batch (or give the "
                                          "source a collate function)");
    PyCallable fn = callable_of(spec, "fn", "map '" + name + "'");
    MapOptions options{.name = name};
    if (ctx.params.has("workers")) options.workers = static_cast<int>(ctx.params.uint("workers"));
    ctx.builder.map(python_map_fn(std::move(fn)), std::move(options));
  };
  NodeSchema filter{
      .type = "python_filter", .doc = "a Python predicate on each sample", .params = {ref}};
  filter.node_name = map.node_name;
  r.add(std::move(map));
  filter.add = [spec_of](NodeContext& ctx) {
    py::object spec = spec_of(ctx.params);
    const std::string name = attr_string(spec, "name");
    PyCallable fn = callable_of(spec, "fn", "filter '" + name + "'");
    ctx.builder.filter(python_filter_fn(std::move(fn)), {.name = name});
  };
  r.add(std::move(filter));
  return r;
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
  d["default_doc"] = p.default_doc;
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
  auto specs = std::make_shared<std::vector<PyObj>>();
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

// ---- batches ----

/// The DLPack device of `t` as a consumer sees it: pinned host memory is host memory
/// (PyTorch 1.13 does not accept kDLCUDAHost).
DLDevice dlpack_device(const Tensor& t) {
  if (t.device().kind == MemoryKind::kDevice) return {kDLCUDA, t.device().index};
  return {kDLCPU, 0};
}

/// A "dltensor" capsule sharing `t`'s memory (the capsule's owner keeps the buffer alive for
/// as long as its consumer holds the tensor).
py::capsule dlpack_capsule(const Tensor& t) {
  DLManagedTensor* m = t.to_dlpack();
  m->dl_tensor.device = dlpack_device(t);
  return py::capsule(m, "dltensor", [](PyObject* cap) {
    // Not consumed (renamed to "used_dltensor" by a consumer that took ownership): free it.
    if (PyCapsule_IsValid(cap, "dltensor")) {
      auto* mt = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
      if (mt != nullptr && mt->deleter != nullptr) mt->deleter(mt);
    }
  });
}

/// A flowstate tensor as a torch.Tensor sharing its memory (DLPack).
py::object to_torch(const Tensor& t) {
  // torch.utils.dlpack.from_dlpack calls torch._C._from_dlpack for a capsule; calling it
  // directly saves a Python frame per tensor.
  static py::object* from_dlpack = [] {
    py::module_ c = py::module_::import("torch._C");
    return new py::object(py::hasattr(c, "_from_dlpack")
                              ? c.attr("_from_dlpack")
                              : py::module_::import("torch.utils.dlpack").attr("from_dlpack"));
  }();
  return (*from_dlpack)(dlpack_capsule(t));
}

/// A stream as the DLPack protocol and PyTorch pass it: None, an int (1 is the legacy
/// default stream, 2 the per-thread one, as cudaStreamLegacy / cudaStreamPerThread spell
/// them), or an object with `cuda_stream` (torch.cuda.Stream).
CudaStream stream_of(const py::handle& stream) {
  if (stream.is_none()) return nullptr;
  py::object handle = py::hasattr(stream, "cuda_stream")
                          ? stream.attr("cuda_stream")
                          : py::reinterpret_borrow<py::object>(stream);
  return reinterpret_cast<CudaStream>(handle.cast<std::uintptr_t>());
}

/// PyTorch's current stream on `device` (the stream handover's consumer in Python).
CudaStream torch_current_stream(const Device& device) {
  return call_python("torch.cuda.current_stream", [&] {
    py::object s = py::module_::import("torch.cuda").attr("current_stream")(device.index);
    return stream_of(s);
  });
}

/// The completion of a batch's device copy, as Python's Batch keeps it: wait() on the host,
/// or wait(stream) for the stream handover (cudaStreamWaitEvent). Null for host batches.
struct PyFence {
  std::shared_ptr<const Fence> fence;

  void wait(const py::object& stream) const {
    if (!fence) return;
    if (stream.is_none()) {
      py::gil_scoped_release release;
      fence->wait();
      return;
    }
    const CudaStream s = stream_of(stream);
    fence->wait(s);
  }
  /// The device index (-1 for host work).
  int device() const {
    if (!fence) return -1;
    const Device d = fence->device();
    return d.kind == MemoryKind::kDevice ? d.index : -1;
  }
};

/// One field of a batch as a DLPack producer (`__dlpack__`, `__dlpack_device__`): a consumer
/// that passes its stream (torch.utils.dlpack.from_dlpack passes PyTorch's current one) has
/// that stream wait on the batch's copy instead of the host.
struct PyDLPackTensor {
  Tensor tensor;
  PyFence fence;

  py::capsule dlpack(const py::object& stream) const {
    if (tensor.device().kind == MemoryKind::kDevice) {
      // None: the consumer did not say which stream it uses, so the copy must be complete.
      fence.wait(stream);
    }
    return dlpack_capsule(tensor);
  }
  py::tuple dlpack_device() const {
    const DLDevice d = ::dlpack_device(tensor);
    return py::make_tuple(static_cast<int>(d.device_type), d.device_id);
  }
};

/// The fields of flowstate.BatchInfo, in its order.
py::tuple info_tuple(const BatchInfo& info) {
  return py::make_tuple(info.step, info.epoch, info.index_in_epoch,
                        info.batches_in_epoch ? py::cast(*info.batches_in_epoch) : py::none(),
                        info.is_last_in_epoch, info.num_samples, info.remainder, info.padding);
}

/// What Python sees of a batch: its info, its tensor fields (as torch tensors), the value a
/// Python collate made, the fields as DLPack producers, and the copy's fence.
py::tuple batch_parts(const Batch& b) {
  py::dict fields, producers;
  PyFence fence{b.fence};
  for (const auto& [id, tensor] : b.fields) {
    py::str name(std::string(field_name(id)));
    fields[name] = to_torch(tensor);
    producers[name] = PyDLPackTensor{tensor, fence};
  }
  py::object user = b.user.holds<PyObj>() ? b.user.get<PyObj>().get() : py::none();
  return py::make_tuple(info_tuple(b.info), fields, user, producers, fence);
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
  PyLoader(const PyPipeline& p, std::uint64_t epochs, std::optional<int> workers,
           std::optional<std::size_t> prefetch, py::object coordinator)
      : specs_(p.specs) {
    std::shared_ptr<Coordinator> coord;
    if (!coordinator.is_none()) coord = std::make_shared<PyCoordinator>(std::move(coordinator));
    {
      std::lock_guard lock(live_loaders().mu);
      if (live_loaders().shut_down)
        throw Error("the interpreter is shutting down: no new flowstate.Loader");
    }
    {
      py::gil_scoped_release release;
      loader_ =
          std::make_unique<Loader>(p.pipeline, LoaderOptions{.epochs = epochs,
                                                             .workers = workers,
                                                             .prefetch = prefetch,
                                                             .coordinator = std::move(coord)});
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
  py::dict state_fields() const {
    PipelineState s = loader().state_struct();
    py::dict d;
    d["step"] = s.last_step ? *s.last_step + 1 : 0;
    d["epoch"] = s.last_epoch ? py::cast(*s.last_epoch) : py::none();
    d["fingerprint"] = s.fingerprint;
    return d;
  }
  void load_state(const std::string& state) {
    py::gil_scoped_release release;
    loader().load_state(state);
  }
  void skip(std::uint64_t first, std::uint64_t last) {
    py::gil_scoped_release release;
    loader().skip(first, last);
  }
  std::string save_checkpoint(const std::string& dir, std::size_t keep, bool overwrite) {
    py::gil_scoped_release release;
    return loader().save_checkpoint(dir, {.keep = keep, .overwrite = overwrite});
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
    return d;
  }
  std::uint64_t fingerprint() const { return loader().pipeline().fingerprint(); }

 private:
  std::shared_ptr<std::vector<PyObj>> specs_;
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
  m.def("_export_view_for_test",
        [](const py::bytes& data, std::size_t offset, const std::vector<std::int64_t>& shape) {
          const std::string bytes = data;
          auto buffer = Buffer::allocate(bytes.size());
          std::memcpy(buffer->data(), bytes.data(), bytes.size());
          return to_torch(Tensor(std::move(buffer), offset, DType::kUInt8, Shape::of(shape)));
        });
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
      },
      "Stops every Loader's graph (registered with atexit).");
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
      .def("canonical", [](const PyPipeline& p) { return p.pipeline.canonical(); })
      .def("describe", [](const PyPipeline& p) { return p.pipeline.describe(); });

  py::class_<PyLoader>(m, "Loader")
      .def(py::init<const PyPipeline&, std::uint64_t, std::optional<int>,
                    std::optional<std::size_t>, py::object>(),
           py::arg("pipeline"), py::arg("epochs"), py::arg("workers"), py::arg("prefetch"),
           py::arg("coordinator") = py::none())
      .def("next", &PyLoader::next)
      .def("state", &PyLoader::state)
      .def("state_fields", &PyLoader::state_fields)
      .def("load_state", &PyLoader::load_state)
      .def("skip", &PyLoader::skip)
      .def("save_checkpoint", &PyLoader::save_checkpoint)
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
}
