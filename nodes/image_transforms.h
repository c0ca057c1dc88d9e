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
//   normalize_image      uint8 HWC → float32 CHW, (x / 255 - mean[c]) / std[c]
//
// Bilinear resizing is PIL's and torchvision's (antialias=True) filter: a triangle whose support
// widens with the downscaling factor, so a large reduction averages every source pixel rather
// than sampling a few; taps are clamped to the cropped region (a crop, then a resize).
#pragma once

#include <cstdint>
#include <vector>

#include "flowstate/core/tensor.h"
#include "flowstate/nodes/transform.h"

namespace flowstate {

/// resize, center_crop, random_resized_crop, flip and normalize_image.
std::vector<TransformSchema> image_transforms();

/// The region [top, top + height) × [left, left + width) of the uint8 [H, W, C] image `in`,
/// resized bilinearly (see above) to [out_h, out_w, C].
Tensor resize_region(const Tensor& in, std::int64_t top, std::int64_t left, std::int64_t height,
                     std::int64_t width, std::int64_t out_h, std::int64_t out_w);

}  // namespace flowstate
