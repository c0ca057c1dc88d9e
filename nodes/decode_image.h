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
// Crop-only decoding: `random_resized_crop: SIZE` fuses torchvision's RandomResizedCrop into the
// decode. The box is drawn from the header's dimensions exactly as the random_resized_crop
// transform draws it (the same function and options: scale_min, scale_max, ratio_min,
// ratio_max), from this node's record generator; only the JPEG data covering the box is
// decoded, downscaled by the IDCT as far as the box stays at least SIZE (the smallest M/8), then
// resized bilinearly to SIZE (nodes/image_codec.h, decode_image_box). The output is a uint8
// [SIZE, 3] image; it differs from decoding whole and then cropping only by what the scaled IDCT
// changes (docs/DECISIONS.md, "Images (issue 24)", gives the measured difference).
//
//   - decode_image: {field: jpg, min_size: 224, on_error: skip}
//   - decode_image: {field: jpg, random_resized_crop: 224}
//   builder.add(decode_image_node(), DecodeImageOptions{.field = "jpg", .min_size = 224});
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "flowstate/core/error.h"
#include "flowstate/nodes/definition.h"
#include "flowstate/nodes/image_transforms.h"
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
  std::vector<std::int64_t> random_resized_crop;  ///< empty: no fused crop
  double scale_min = CropRange{}.scale_min;
  double scale_max = CropRange{}.scale_max;
  double ratio_min = CropRange{}.ratio_min;
  double ratio_max = CropRange{}.ratio_max;

  /// Whether the crop is fused (its range options are described only then).
  static bool crops(const DecodeImageOptions& o) { return !o.random_resized_crop.empty(); }
  /// The fused crop's ranges.
  CropRange range() const { return {scale_min, scale_max, ratio_min, ratio_max}; }

  static constexpr auto table() {
    using O = DecodeImageOptions;
    return std::tuple_cat(
        std::tuple{
            param("field", &O::field,
                  {.doc = "the field holding the encoded image; replaced by it"}),
            param("min_size", &O::min_size,
                  {.max = 1e9,
                   .doc = "JPEG: decode at the smallest scale (M/8) keeping both sides >= this; "
                          "0: full size"}),
            param("max_pixels", &O::max_pixels,
                  {.min = 1, .max = 1e15, .doc = "an image of more pixels (by its header) is bad"}),
            param("on_error", &O::on_error,
                  {.doc = "a bad image: error (a DataError naming record and field) or skip "
                          "(dropped and counted)"}),
            param("random_resized_crop", &O::random_resized_crop,
                  {.doc = "fused RandomResizedCrop to [height, width] (one value: both): only "
                          "the box is decoded, downscaled as far as this size allows",
                   .default_doc = "no crop: the whole image",
                   .check = check_image_size_or_empty,
                   .describe_if = crops})},
        crop_range_params<O>(crops));
  }
  void validate() const {
    if (random_resized_crop.empty()) return;
    if (min_size != 0)
      throw ConfigError("min_size",
                        "min_size and random_resized_crop cannot both be set: the fused crop "
                        "chooses its own decode scale");
    validate_crop_range(range());
  }

  /// random_resized_crop's check: empty, or a checked size.
  static std::string check_image_size_or_empty(const ParamValue& v) {
    return std::get<std::vector<std::int64_t>>(v).empty() ? "" : check_image_size(v);
  }
};

/// The `decode_image` node's definition.
const NodeDef& decode_image_node();

}  // namespace flowstate
