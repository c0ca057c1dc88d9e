// What the files of the flowstate._flowstate extension (python/src/) share: references to
// Python objects that any thread may hold, Python errors travelling through the graph, and
// the functions one file defines for the others. Internal to the extension; not installed.
//
//   module.cpp   the module: schema, pipelines from YAML, the Loader and its bindings
//   nodes.cpp    Python sources, maps, filters and collate functions as nodes (the registry)
//   batches.cpp  batches as torch tensors: DLPack, the CUDA stream handover
#pragma once

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
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"
#include "flowstate/nodes/device_copy.h"
#include "flowstate/nodes/sources/iterable.h"
#include "flowstate/tools/accumulate.h"

namespace py = pybind11;

namespace flowstate::python {

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
  /// Drops the reference now (the GIL must be held); get() then returns None's null handle.
  void release() { Py_CLEAR(o_); }

 private:
  PyObject* o_ = nullptr;
};

/// The user's objects that C++ keeps for as long as a pipeline lives (its callables and
/// specs): shutdown() (run by atexit, while the interpreter is whole) drops every reference
/// they still hold. Otherwise a pipeline freed during finalization — when PyObj no longer
/// decrements — would keep, say, a `collate` defined in __main__ and with it __main__'s
/// globals, whose open files would then never be flushed and closed.
std::shared_ptr<PyObj> kept(const py::handle& h);
std::shared_ptr<std::vector<PyObj>> kept_list();
/// Drops what kept() and kept_list() made (the GIL is held; the graphs are stopped).
void release_kept();

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
    // The traceback travels on the exception object, so that the user's own frames stay in
    // it when the loop raises it again (pybind11 keeps it beside the value).
    if (e.trace()) PyException_SetTraceback(e.value().ptr(), e.trace().ptr());
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

// ---- nodes.cpp ----

/// The registry of one Python pipeline: the process's node types, plus `iterable` (a Python
/// source), `python_map` and `python_filter`, whose `ref` indexes `specs`.
Registry python_registry(const std::shared_ptr<std::vector<PyObj>>& specs);

// ---- batches.cpp ----

/// A flowstate tensor as a torch.Tensor sharing its memory (DLPack). The tensor's type must
/// be one the installed torch holds.
py::object to_torch(const Tensor& t);
/// The same for field `field` of any type: an unsigned type this torch lacks is widened
/// (uint16 → int32, uint32 → int64, uint64 → int64 when every value fits; a copy), and a
/// value it cannot hold is an Error naming the field.
py::object to_torch(const Tensor& t, std::string_view field);

/// PyTorch's current stream on `device` (the stream handover's consumer in Python).
CudaStream torch_current_stream(const Device& device);

/// The completion of a batch's device copy, as Python's Batch keeps it: wait() on the host,
/// or wait(stream) for the stream handover (cudaStreamWaitEvent). Null for host batches.
struct PyFence {
  std::shared_ptr<const Fence> fence;

  void wait(const py::object& stream) const;
  /// The device index (-1 for host work).
  int device() const;
};

/// One field of a batch as a DLPack producer (`__dlpack__`, `__dlpack_device__`): a consumer
/// that passes its stream (torch.utils.dlpack.from_dlpack passes PyTorch's current one) has
/// that stream wait on the batch's copy instead of the host.
struct PyDLPackTensor {
  Tensor tensor;
  PyFence fence;

  py::capsule dlpack(const py::object& stream) const;
  py::tuple dlpack_device() const;
};

/// What Python sees of a batch: its info, its tensor fields (as torch tensors), the value a
/// Python collate made, the fields as DLPack producers, and the copy's fence.
py::tuple batch_parts(const Batch& b);

}  // namespace flowstate::python

// ---- state.cpp ----

namespace flowstate::python {

/// `__version__`, describe_state (what `flowstate inspect` shows of a saved state) and the
/// parameters' kinds (for the builder's signatures and the typed stubs).
void bind_state(py::module_& m);

}  // namespace flowstate::python
