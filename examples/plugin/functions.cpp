#include "examples/plugin/functions.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>

#include "flowstate/core/error.h"

namespace flowstate::examples {
namespace {

struct XorOptions {
  std::string field = "data";
  std::uint64_t key = 0;
  static constexpr auto table() {
    return std::tuple{param("field", &XorOptions::field, {.doc = "the field read and replaced"}),
                      param("key", &XorOptions::key,
                            {.max = 255, .required = true, .doc = "XORed into every byte"})};
  }
};

/// `t`'s bytes XOR `key`, in a new tensor of the same dtype and shape.
Tensor xor_tensor(const Tensor& t, std::byte key) {
  Tensor out(t.dtype(), t.shape());
  const auto* src = static_cast<const std::byte*>(t.data());
  auto* dst = static_cast<std::byte*>(out.data());
  for (std::size_t i = 0; i < t.nbytes(); ++i) dst[i] = src[i] ^ key;
  return out;
}

/// The field `name` of `fields`, or a DataError placed at the YAML's `field`.
const Tensor& field_of(const Fields& fields, FieldId id, const std::string& name, const Params& p) {
  const Tensor* t = fields.find(id);
  if (t == nullptr) throw param_data_error(p, "field", "no field '" + name + "'");
  return *t;
}

struct ByteBelowOptions {
  std::string field = "data";
  std::uint64_t below = 0;
  static constexpr auto table() {
    return std::tuple{
        param("field", &ByteBelowOptions::field, {.doc = "the field whose first byte is read"}),
        param("below", &ByteBelowOptions::below,
              {.min = 1, .max = 256, .required = true, .doc = "kept: a first byte below this"})};
  }
};

}  // namespace

TransformSchema xor_bytes_transform() {
  return define_transform<XorOptions>(
      "xor_bytes", "every byte of the field XOR key",
      [](const XorOptions& o, const Params& p) -> SampleFn {
        return
            [id = field_id(o.field), field = o.field, key = std::byte(o.key), p](
                Sample& s, MapContext&) { s.set(id, xor_tensor(field_of(s, id, field, p), key)); };
      },
      [](const XorOptions& o, const Params& p) -> BatchFn {
        return [id = field_id(o.field), field = o.field, key = std::byte(o.key), p](Batch& b,
                                                                                    MapContext&) {
          b.fields.set(id, xor_tensor(field_of(b.fields, id, field, p), key));
        };
      });
}

PredicateSchema byte_below_predicate() {
  return define_predicate<ByteBelowOptions>(
      "byte_below", "keeps the samples whose field's first byte is below `below`",
      [](const ByteBelowOptions& o, const Params& p) {
        return Predicate{.fn = [id = field_id(o.field), field = o.field, below = o.below, p](
                                   const Sample& s, MapContext&) {
          const Tensor& t = field_of(s, id, field, p);
          if (t.nbytes() == 0)
            throw DataError("", DataError::kNoOffset,
                            "record " + s.ref.to_string() + ": field '" + field + "' is empty");
          return std::to_integer<std::uint64_t>(*static_cast<const std::byte*>(t.data())) < below;
        }};
      });
}

}  // namespace flowstate::examples
