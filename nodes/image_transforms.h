// Image augmentations as map transforms (`- map: {fn: random_resized_crop, size: 224}`), on the
// uint8 [H, W, C] tensors decode_image makes. Each is an options table and a make function
// (nodes/transform.h); config/transforms.cpp registers them with the built-ins. Randomness is
// the record's own generator (MapContext::rng): the same crop and flip for any worker count
// and after a resume.
//
//   resize               bilinear to `size` ([h, w]; one value: the shorter side, keeping the
//                        aspect ratio, as torchvision's Resize(int))
//   center_crop          the centre `size` ([h, w] or one value for both); zero-padded where
//                        the image is smaller (torchvision's CenterCrop)
//   random_resized_crop  torchvision's RandomResizedCrop: an area fraction in [scale_min,
//                        scale_max] and a log-uniform aspect ratio in [ratio_min, ratio_max],
//                        10 attempts, then the centre crop of the clamped ratio; resized
//                        bilinearly to `size`
//   flip                 mirrors left-right with probability `p`
//   normalize_image      uint8 HWC → float32 CHW, (x / 255 - mean[c]) / std[c]; `dtype:
//                        float16` (or bfloat16) writes that value rounded to 16 bits
//
// Bilinear resizing is PIL's and torchvision's (antialias=True) filter: a triangle whose support
// widens with the downscaling factor, so a large reduction averages every source pixel rather
// than sampling a few; taps are clamped to the cropped region (a crop, then a resize).
#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "flowstate/core/rng.h"
#include "flowstate/core/tensor.h"
#include "flowstate/nodes/image_codec.h"
#include "flowstate/nodes/options.h"
#include "flowstate/nodes/transform.h"

namespace flowstate {

/// resize, center_crop, random_resized_crop, flip and normalize_image.
std::vector<TransformSchema> image_transforms();

/// The ranges random_resized_crop draws its box from (torchvision's `scale` and `ratio`).
struct CropRange {
  double scale_min = 0.08;
  double scale_max = 1.0;
  double ratio_min = 3.0 / 4.0;
  double ratio_max = 4.0 / 3.0;
};

/// The table rows of a CropRange's four values, for an options struct `O` holding members of
/// the same names (random_resized_crop's, and decode_image's fused crop): one definition of
/// their keys, bounds and docs.
/// `describe_if`, when given, is each row's FieldSpec::describe_if.
template <class O>
constexpr auto crop_range_params(bool (*describe_if)(const O&) = nullptr) {
  return std::tuple{param("scale_min", &O::scale_min,
                          {.min = 0,
                           .max = 1,
                           .doc = "smallest fraction of the area cropped",
                           .describe_if = describe_if}),
                    param("scale_max", &O::scale_max,
                          {.min = 0,
                           .max = 1,
                           .doc = "largest fraction of the area cropped",
                           .describe_if = describe_if}),
                    param("ratio_min", &O::ratio_min,
                          {.min = 1e-6,
                           .max = 1e6,
                           .doc = "smallest aspect ratio (width / height)",
                           .describe_if = describe_if}),
                    param("ratio_max", &O::ratio_max,
                          {.min = 1e-6,
                           .max = 1e6,
                           .doc = "largest aspect ratio (width / height)",
                           .describe_if = describe_if})};
}

/// Throws ConfigError when a minimum exceeds its maximum.
void validate_crop_range(const CropRange& r);

/// A `size` option's check: one value or [height, width], each in [1, 65536].
std::string check_image_size(const ParamValue& v);

/// A checked `size` option as {height, width}.
std::pair<std::int64_t, std::int64_t> image_size_hw(const std::vector<std::int64_t>& size);

/// torchvision's RandomResizedCrop.get_params on an image of height × width, drawing from
/// `rng`: 10 attempts of an area fraction uniform in [scale_min, scale_max] and a log-uniform
/// ratio, sides rounded half to even; then the centre crop of the clamped ratio.
CropBox random_resized_crop_box(std::int64_t height, std::int64_t width, const CropRange& range,
                                ElementRng& rng);

/// The region [top, top + height) × [left, left + width) of the uint8 [H, W, C] image `in`,
/// resized bilinearly (see above) to [out_h, out_w, C].
Tensor resize_region(const Tensor& in, std::int64_t top, std::int64_t left, std::int64_t height,
                     std::int64_t width, std::int64_t out_h, std::int64_t out_w);

/// resize_region with a fractional region (in pixels of `in`): the filter is centred on the
/// region's own coordinates, and its taps are clamped to the pixels the region touches,
/// [floor(top), ceil(top + height)) × [floor(left), ceil(left + width)), within the image.
/// Integral values give resize_region's result exactly.
Tensor resize_box(const Tensor& in, double top, double left, double height, double width,
                  std::int64_t out_h, std::int64_t out_w);

}  // namespace flowstate
