// `decode_image`: a field's encoded bytes (JPEG or PNG; nodes/image_codec.h) → a uint8
// [height, width, 3] tensor (HWC, RGB), in place. It runs on the parallel workers like a map:
// the decode is a pure function of the record, so resume is exact and the output does not
// depend on the worker count.
//
// Decode-time downscaling: `min_size` > 0 decodes a JPEG at the smallest of libjpeg-turbo's
// scaled IDCTs (M/8) that keeps both sides at least `min_size` pixels — for a following
// random_resized_crop or resize to 224, `min_size: 224` skips most of the IDCT and colour
// conversion work at no visible cost (the crop is then drawn on the smaller image; its scale and
// ratio are relative, so the distribution of crops is the same).
//
// A bad image (not JPEG or PNG, truncated or corrupt data, a zero side, more than `max_pixels`
// pixels in its header) is a DataError naming the record and the field (exit code 3 from
// `flowstate run`). With `on_error: skip` it is dropped instead: the node is then also a
// filter in the spine (the decode happens once, when the filter decides; the sample it keeps
// is passed on), so batches stay full, a checkpoint position stays exact, the dropped record
// is absent from the batches' provenance, and the count of dropped samples is the node's
// state (`dropped`, shown by `flowstate inspect`).
//
//   - decode_image: {field: jpg, min_size: 224, on_error: skip}
//   builder.add(decode_image_node(), DecodeImageOptions{.field = "jpg", .min_size = 224});
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>

#include "flowstate/nodes/definition.h"
#include "flowstate/nodes/options.h"

namespace flowstate {

/// What decode_image does with an image it cannot decode.
enum class BadImage : std::uint8_t {
  kError,  ///< a DataError naming the record and field
  kSkip,   ///< the sample is dropped and counted (the node's `dropped`)
};

template <>
struct EnumNames<BadImage> {
  static constexpr std::array<std::pair<BadImage, const char*>, 2> values{
      {{BadImage::kError, "error"}, {BadImage::kSkip, "skip"}}};
};

/// Options of the `decode_image` node.
struct DecodeImageOptions {
  std::string field = "jpg";
  std::uint64_t min_size = 0;
  std::uint64_t max_pixels = 100'000'000;
  BadImage on_error = BadImage::kError;

  static constexpr auto table() {
    using O = DecodeImageOptions;
    return std::tuple{
        param("field", &O::field, {.doc = "the field holding the encoded image; replaced by it"}),
        param("min_size", &O::min_size,
              {.max = 1e9,
               .doc = "JPEG: decode at the smallest scale (M/8) keeping both sides >= this; 0: "
                      "full size"}),
        param("max_pixels", &O::max_pixels,
              {.min = 1, .max = 1e15, .doc = "an image of more pixels (by its header) is bad"}),
        param("on_error", &O::on_error,
              {.doc = "a bad image: error (a DataError naming record and field) or skip "
                      "(dropped and counted)"}),
    };
  }
};

/// The `decode_image` node's definition.
const NodeDef& decode_image_node();

}  // namespace flowstate
