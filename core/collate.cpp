#include "flowstate/core/collate.h"

#include <string>

#include "flowstate/core/error.h"

namespace flowstate {

Tensor Collate<Tensor>::collate(std::vector<Tensor>&& values) {
  if (values.empty()) return Tensor(DType::kUInt8, Shape{0});
  const Tensor& proto = values.front();
  const auto describe = [](const Tensor& t) {
    return std::string(dtype_name(t.dtype())) + t.shape().to_string();
  };
  for (std::size_t i = 0; i < values.size(); ++i) {
    const Tensor& t = values[i];
    if (!t.defined())
      throw DataError("", DataError::kNoOffset,
                      "Collate<Tensor>: value " + std::to_string(i) + " is an empty Tensor");
    if (t.device().kind == MemoryKind::kDevice)
      throw DataError("", DataError::kNoOffset,
                      "Collate<Tensor>: value " + std::to_string(i) +
                          " is in device memory; collate host tensors and let device_copy move "
                          "the batch");
    if (t.dtype() != proto.dtype() || !(t.shape() == proto.shape()))
      throw DataError("", DataError::kNoOffset,
                      "Collate<Tensor>: value " + std::to_string(i) + " is " + describe(t) +
                          ", value 0 is " + describe(proto) +
                          ": stacking needs equal dtypes and shapes");
  }
  Tensor out(proto.dtype(), proto.shape().prepend(static_cast<std::int64_t>(values.size())));
  const std::size_t bytes = proto.nbytes();
  auto* dst = static_cast<std::byte*>(out.data());
  for (std::size_t i = 0; i < values.size(); ++i)
    if (bytes > 0) std::memcpy(dst + i * bytes, values[i].data(), bytes);
  return out;
}

}  // namespace flowstate
