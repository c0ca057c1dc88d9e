// Python sources, maps and filters as flowstate nodes, and the registry of one Python pipeline
// that adds them to the process's node types. A Python source is a plan (flowstate/_workers.py):
// `from_sequence` as its indices (random access, O(1) resume by index), `from_iterable` as a
// producer over the user's factory; its maps are no-ops here and its filters read their item
// through the Python side. Python maps and filters on a file source's samples see a dict of
// read-only numpy views. Every callback runs under the GIL (call_python).
#include "binding.h"

namespace flowstate::python {

// ---- what shutdown() releases ----

namespace {
struct Kept {
  std::mutex mu;
  std::vector<std::weak_ptr<PyObj>> objects;
  std::vector<std::weak_ptr<std::vector<PyObj>>> lists;
};
Kept& kept_registry() {
  static auto* k = new Kept;  // never destroyed: used until the process ends
  return *k;
}
template <class T>
void prune(std::vector<std::weak_ptr<T>>& v) {
  std::erase_if(v, [](const std::weak_ptr<T>& w) { return w.expired(); });
}
}  // namespace

std::shared_ptr<PyObj> kept(const py::handle& h) {
  auto p = std::make_shared<PyObj>(h);
  Kept& k = kept_registry();
  std::lock_guard lock(k.mu);
  if (k.objects.size() >= 64 && k.objects.size() % 64 == 0) prune(k.objects);
  k.objects.push_back(p);
  return p;
}

std::shared_ptr<std::vector<PyObj>> kept_list() {
  auto p = std::make_shared<std::vector<PyObj>>();
  Kept& k = kept_registry();
  std::lock_guard lock(k.mu);
  if (k.lists.size() >= 64 && k.lists.size() % 64 == 0) prune(k.lists);
  k.lists.push_back(p);
  return p;
}

void release_kept() {
  Kept& k = kept_registry();
  std::vector<std::shared_ptr<PyObj>> objects;
  std::vector<std::shared_ptr<std::vector<PyObj>>> lists;
  {
    std::lock_guard lock(k.mu);
    for (auto& w : k.objects)
      if (auto p = w.lock()) objects.push_back(std::move(p));
    for (auto& w : k.lists)
      if (auto p = w.lock()) lists.push_back(std::move(p));
    k.objects.clear();
    k.lists.clear();
  }
  for (auto& o : objects) o->release();
  for (auto& l : lists)
    for (PyObj& o : *l) o.release();
}

// ---- sources ----

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

/// Collates a batch of Python values with a Python callable (the plan of an iterable: `list`).
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
  };
}

std::string attr_string(const py::handle& h, const char* name) { return py::str(h.attr(name)); }

PyCallable callable_of(const py::handle& spec, const char* attr, const std::string& who) {
  return {kept(spec.attr(attr)), who};
}

/// A source over the iterable the spec's factory makes each epoch: exact resume through its
/// state_dict()/load_state_dict() when it has them, a replay of the epoch otherwise.
SourceSpec producer_source(const py::handle& spec, RangeOptions options) {
  const PyCallable factory = callable_of(spec, "obj", "iterable '" + options.name + "'");
  const bool takes_epoch = spec.attr("takes_epoch").cast<bool>();
  if (spec.attr("resumable").cast<bool>())
    return from_producer(ProducerFactory<ResumablePyProducer>{factory, takes_epoch},
                         std::move(options));
  const std::string name = options.name;
  SourceSpec source =
      from_producer(ProducerFactory<PyProducer>{factory, takes_epoch}, std::move(options));
  source.warnings = {"'" + name +
                     "' has no state_dict()/load_state_dict(): a resume replays its epoch "
                     "from the start (up to one epoch of work)"};
  return source;
}

/// The source a Python spec describes: a plan (flowstate/_workers.py), whose Python side reads,
/// maps and collates each batch, in the calling process or in worker processes. Kind "indices"
/// (a sequence) yields 0..n-1 as int64 values, collated by Collate<std::int64_t> into an int64
/// tensor, with no Python per item; kind "items" (an iterable) yields the iterable's items,
/// collated into a list.
SourceSpec python_source(const py::handle& spec) {
  const std::string kind = attr_string(spec, "kind");
  RangeOptions options{.name = attr_string(spec, "name")};
  if (!spec.attr("size").is_none()) options.size = spec.attr("size").cast<std::uint64_t>();
  if (kind == "indices") {
    const auto n = spec.attr("length").cast<std::int64_t>();
    return from_range(std::views::iota(std::int64_t{0}, n), std::move(options));
  }
  if (kind != "items") throw ConfigError("iterable.ref", "not a Python source: " + kind);
  const std::string name = options.name;
  SourceSpec source = producer_source(spec, std::move(options));
  source.user_collate = python_collate(
      {kept(py::module_::import("builtins").attr("list")), "the item list of '" + name + "'"});
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
  for (const auto& [id, t] : s) {
    const std::string name(field_name(id));
    if (t.dtype() == DType::kBFloat16)
      throw Error("field '" + name + "' of record " + s.ref.to_string() +
                  " is bfloat16, which numpy has no type for: `cast` it to float32 before a "
                  "Python map");
    d[py::str(name)] = numpy_view(t);
  }
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
                ", which flowstate does not hold (uint8..int64, float16, float32, float64, "
                "bool)");
  }
  std::vector<std::int64_t> dims;
  for (py::ssize_t i = 0; i < a.ndim(); ++i) dims.push_back(a.shape(i));
  auto owner = std::make_shared<PyObj>(a);
  auto buffer = Buffer::borrow(const_cast<void*>(a.data()), static_cast<std::size_t>(a.nbytes()),
                               std::move(owner));
  return Tensor(std::move(buffer), 0, dtype, Shape::of(dims));
}

/// A Python map on a sample of tensor fields (a file source's): it is passed as sample_dict()
/// and its fields replaced by the returned mapping's. (A Python source's maps run on the
/// Python side, flowstate/_workers.py: in the graph they are no-ops.)
SampleFn python_map_fn(PyCallable fn) {
  return [fn](Sample& s, MapContext&) {
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
      py::object arg;
      if (s.user.holds<PyObj>())
        arg = s.user.get<PyObj>().get();
      else if (s.user.holds<std::int64_t>())  // a plan's index (flowstate/_workers.py)
        arg = py::int_(s.user.get<std::int64_t>());
      else
        arg = sample_dict(s);
      return py::bool_(fn.fn->get()(arg)).cast<bool>();
    });
  };
}

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
  map.add = [spec_of](NodeContext& ctx) {
    py::object spec = spec_of(ctx.params);
    const std::string name = attr_string(spec, "name");
    if (ctx.after_batch)
      throw ConfigError("python_map", "a Python map '" + name +
                                          "' works on samples: put it before batch (or give the "
                                          "source a collate function)");
    MapOptions options{.name = name};
    if (ctx.params.has("workers")) options.workers = static_cast<int>(ctx.params.uint("workers"));
    if (spec.attr("fn").is_none()) {
      // In a plan (flowstate/_workers.py) the Python side applies the map to each batch's
      // items; the node keeps its place and name in the pipeline (and the fingerprint).
      ctx.builder.map([](Sample&, MapContext&) {}, std::move(options));
      return;
    }
    PyCallable fn = callable_of(spec, "fn", "map '" + name + "'");
    ctx.builder.map(python_map_fn(std::move(fn)), std::move(options));
  };
  NodeSchema filter{
      .type = "python_filter", .doc = "a Python predicate on each sample", .params = {ref}};
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

}  // namespace flowstate::python
