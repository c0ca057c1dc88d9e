// Batches as torch tensors: each field exported through DLPack (zero copies; the capsule's
// owner keeps flowstate's buffer alive for as long as torch holds the tensor), and the CUDA
// stream handover — the consumer's stream waits on the copy's event instead of the host.
#include "binding.h"

namespace flowstate::python {

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

namespace {

/// Whether the installed torch has the unsigned type `d` (torch 1.13 has uint8 only; 2.3 and
/// later also uint16/32/64, which then come zero-copy through DLPack like every other type).
bool torch_has(DType d) {
  static const bool wide = [] {
    py::gil_scoped_acquire gil;
    return py::hasattr(py::module_::import("torch"), "uint32");
  }();
  return wide || (d != DType::kUInt16 && d != DType::kUInt32 && d != DType::kUInt64);
}

template <class From, class To>
Tensor widened(const Tensor& t, DType to) {
  Tensor out(to, t.shape());
  const auto in = t.values<From>();
  const auto dst = out.values<To>();
  for (std::size_t i = 0; i < in.size(); ++i) dst[i] = static_cast<To>(in[i]);
  return out;
}

/// `t` in a type the installed torch holds, by the rule README.md documents: uint16 → int32,
/// uint32 → int64 (every value fits), uint64 → int64 when every value is below 2^63 (else an
/// Error naming the field). A copy, in host memory; other types are returned as they are.
Tensor torch_typed(const Tensor& t, std::string_view field) {
  if (torch_has(t.dtype())) return t;
  const std::string who = field.empty() ? "a tensor" : "field '" + std::string(field) + "'";
  if (t.device().kind == MemoryKind::kDevice)
    throw Error(who + " of dtype " + std::string(dtype_name(t.dtype())) +
                " is on a device, and this torch has no such type: convert it before "
                "device_copy (a map with `decode`/`cast` to a signed type)");
  switch (t.dtype()) {
    case DType::kUInt16:
      return widened<std::uint16_t, std::int32_t>(t, DType::kInt32);
    case DType::kUInt32:
      return widened<std::uint32_t, std::int64_t>(t, DType::kInt64);
    case DType::kUInt64: {
      for (const std::uint64_t v : t.values<std::uint64_t>())
        if (v > static_cast<std::uint64_t>(INT64_MAX))
          throw Error(who + " of dtype uint64 holds " + std::to_string(v) +
                      ", which torch's int64 cannot hold (this torch has no uint64)");
      return widened<std::uint64_t, std::int64_t>(t, DType::kInt64);
    }
    default:
      return t;
  }
}

}  // namespace

py::object to_torch(const Tensor& t, std::string_view field) {
  const Tensor typed = torch_typed(t, field);
  return to_torch(typed);
}

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

CudaStream torch_current_stream(const Device& device) {
  return call_python("torch.cuda.current_stream", [&] {
    py::object s = py::module_::import("torch.cuda").attr("current_stream")(device.index);
    return stream_of(s);
  });
}

void PyFence::wait(const py::object& stream) const {
  if (!fence) return;
  if (stream.is_none()) {
    py::gil_scoped_release release;
    fence->wait();
    return;
  }
  const CudaStream s = stream_of(stream);
  fence->wait(s);
}

int PyFence::device() const {
  if (!fence) return -1;
  const Device d = fence->device();
  return d.kind == MemoryKind::kDevice ? d.index : -1;
}

py::capsule PyDLPackTensor::dlpack(const py::object& stream) const {
  if (tensor.device().kind == MemoryKind::kDevice) {
    // None: the consumer did not say which stream it uses, so the copy must be complete.
    fence.wait(stream);
  }
  return dlpack_capsule(tensor);
}

py::tuple PyDLPackTensor::dlpack_device() const {
  const DLDevice d = python::dlpack_device(tensor);
  return py::make_tuple(static_cast<int>(d.device_type), d.device_id);
}

/// The fields of flowstate.BatchInfo, in its order.
py::tuple info_tuple(const BatchInfo& info) {
  return py::make_tuple(info.step, info.epoch, info.index_in_epoch,
                        info.batches_in_epoch ? py::cast(*info.batches_in_epoch) : py::none(),
                        info.is_last_in_epoch, info.num_samples, info.remainder, info.padding);
}

py::tuple batch_parts(const Batch& b) {
  py::dict fields, producers;
  PyFence fence{b.fence};
  for (const auto& [id, tensor] : b.fields) {
    py::str name(std::string(field_name(id)));
    const Tensor typed = torch_typed(tensor, field_name(id));
    fields[name] = to_torch(typed);
    producers[name] = PyDLPackTensor{typed, fence};
  }
  // A Python collate's value, or the int64 index tensor of a plan (flowstate/_workers.py).
  py::object user = py::none();
  if (b.user.holds<PyObj>())
    user = b.user.get<PyObj>().get();
  else if (b.user.holds<Tensor>())
    user = to_torch(b.user.get<Tensor>());
  return py::make_tuple(info_tuple(b.info), fields, user, producers, fence);
}

}  // namespace flowstate::python
