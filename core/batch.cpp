#include "flowstate/core/batch.h"

#include <stdexcept>
#include <string>

#include "flowstate/core/hash.h"

namespace flowstate {

std::uint64_t Batch::digest() const {
  Hasher h;
  for (const auto& [id, t] : fields) {
    if (t.device().kind == MemoryKind::kDevice)
      throw std::invalid_argument("Batch::digest: field '" + std::string(field_name(id)) +
                                  "' is in device memory");
    std::string_view name = field_name(id);
    h.update(name);
    h.update_value(static_cast<std::uint8_t>(t.dtype()));
    for (auto d : t.shape().dims()) h.update_value(d);
    h.update(t.data(), t.nbytes());
  }
  return h.digest();
}

}  // namespace flowstate
