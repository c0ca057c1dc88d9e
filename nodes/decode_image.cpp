#include "flowstate/nodes/decode_image.h"

#include <memory>

#include "flowstate/core/error.h"
#include "flowstate/nodes/filter.h"
#include "flowstate/nodes/image_codec.h"
#include "flowstate/nodes/image_transforms.h"

namespace flowstate {

namespace {

/// The per-sample decode. With `skip`, a bad image leaves the field as an empty 1-D tensor,
/// which the node's filter drops (a decoded image has rank 3).
SampleFn decode_fn(const DecodeImageOptions& o) {
  return [field = field_id(o.field), name = o.field,
          limits = ImageDecodeLimits{.max_pixels = o.max_pixels, .min_size = o.min_size},
          skip = o.on_error == BadImage::kSkip](Sample& s, MapContext&) {
    const Tensor* in = s.find(field);
    if (in == nullptr)
      throw DataError("", DataError::kNoOffset,
                      "record " + s.ref.to_string() + " has no field '" + name + "'");
    try {
      s.set(field, decode_image_bytes(in->bytes(), limits));
    } catch (const ImageError& e) {
      if (!skip)
        throw DataError("", DataError::kNoOffset,
                        "field '" + name + "' of record " + s.ref.to_string() + ": " + e.what());
      s.set(field, Tensor(DType::kUInt8, Shape{0}));
    }
  };
}

/// The per-sample decode with the fused crop: the box drawn from the header's size by
/// random_resized_crop's own function, from this node's record generator.
SampleFn decode_crop_fn(const DecodeImageOptions& o) {
  const auto [oh, ow] = image_size_hw(o.random_resized_crop);
  return [field = field_id(o.field), name = o.field,
          limits = ImageDecodeLimits{.max_pixels = o.max_pixels}, range = o.range(), oh = oh,
          ow = ow, skip = o.on_error == BadImage::kSkip](Sample& s, MapContext& ctx) {
    const Tensor* in = s.find(field);
    if (in == nullptr)
      throw DataError("", DataError::kNoOffset,
                      "record " + s.ref.to_string() + " has no field '" + name + "'");
    try {
      const DecodedBox d = decode_image_box(
          in->bytes(), limits,
          [&](std::int64_t h, std::int64_t w) {
            return random_resized_crop_box(h, w, range, ctx.rng);
          },
          oh, ow);
      s.set(field, resize_box(d.pixels, d.top, d.left, d.height, d.width, oh, ow));
    } catch (const ImageError& e) {
      if (!skip)
        throw DataError("", DataError::kNoOffset,
                        "field '" + name + "' of record " + s.ref.to_string() + ": " + e.what());
      s.set(field, Tensor(DType::kUInt8, Shape{0}));
    }
  };
}

}  // namespace

const NodeDef& decode_image_node() {
  static const NodeDef def = define_node<DecodeImageOptions>(
      {.type = "decode_image",
       .phase = Phase::kPerSample,
       .doc = "decodes a JPEG or PNG field to uint8 [H, W, 3] (RGB), optionally downscaled "
              "while decoding; bad images are errors or skipped and counted"},
      [](BuildContext& ctx, const DecodeImageOptions& o) {
        ctx.add_sample_map(o.random_resized_crop.empty() ? decode_fn(o) : decode_crop_fn(o));
        if (o.on_error != BadImage::kSkip) return;
        // Skipping decides in the spine, like a filter: batches stay full, resume stays exact.
        FilterFn decoded = [field = field_id(o.field)](const Sample& s, MapContext&) {
          const Tensor* t = s.find(field);
          return t != nullptr && t->shape().rank() == 3;
        };
        const SampleReader* reader = ctx.reader();
        ctx.add(std::make_unique<FilterNode>(ctx.name(), std::move(decoded), ctx.key(), reader,
                                             ctx.store(), ctx.parallel_for()));
      },
      inspect_fields<FilterState>);
  return def;
}

}  // namespace flowstate
