// Image codecs: JPEG through libjpeg-turbo's TurboJPEG API, PNG through libpng, to 8-bit RGB
// in HWC layout (a uint8 tensor [height, width, 3]). What `decode_image` (nodes/decode_image.h)
// runs on a field's bytes, and what `flowstate gen images`, the tests and the benchmarks encode
// their JPEGs with (the writer beside the reader, like nodes/sources/tar.h's).
//
// Colour: a grayscale image becomes three equal channels; a palette image its palette's
// colours; an alpha channel is dropped (not composited), as PIL's `convert("RGB")` does; a
// 16-bit PNG keeps the high byte of each sample. A CMYK or YCCK JPEG is refused.
//
// Bounds: the header's dimensions are checked before anything is allocated — a zero side, or
// more than `max_pixels` pixels, is refused. A JPEG that libjpeg-turbo reports any problem
// with, a warning included (truncated data, corrupt entropy data), is refused; so are
// progressive JPEGs of more than 500 scans (TJFLAG_LIMITSCANS).
//
// Decode-time downscaling: with `min_size` > 0, a JPEG is decoded at the smallest of
// libjpeg-turbo's scaling factors (M/8, M = 1..8; the scaled IDCT, which never decodes the
// full-size image) whose result keeps both sides at least `min_size` pixels; an image whose
// sides are already below it is decoded at full size. PNG has no scaled decode: it is always
// decoded at full size.
//
// Crop-only decoding (decode_image_box): a box chosen from the header's dimensions, and only
// the part of a JPEG covering it decoded — libjpeg's jpeg_crop_scanline for the columns (to an
// iMCU boundary), jpeg_skip_scanlines for the rows above it (their entropy data is read, no
// IDCT), nothing below it — at the smallest scaling M/8 that keeps the box at least the
// output size. A JPEG whose data ends in an EOI marker is not read past the box's last row (a
// corrupt entropy segment below the box goes unnoticed); one that does not (a truncated file)
// is read to its end, so truncation is refused as by the full decode.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "flowstate/core/tensor.h"

namespace flowstate {

/// Why an image could not be decoded (the caller adds which record and field).
class ImageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Limits and the scaling target of one decode.
struct ImageDecodeLimits {
  std::uint64_t max_pixels = 100'000'000;  ///< width × height above this is refused
  std::uint64_t min_size = 0;              ///< JPEG: smallest scale keeping both sides ≥ this
};

/// The container formats decode_image_bytes reads.
enum class ImageFormat : std::uint8_t { kUnknown, kJpeg, kPng };
/// The format `bytes` start with (JPEG: FF D8 FF; PNG: its 8-byte signature).
ImageFormat sniff_image(std::span<const std::byte> bytes);

/// Decodes a JPEG or PNG to a uint8 [height, width, 3] tensor. Throws ImageError.
Tensor decode_image_bytes(std::span<const std::byte> bytes, const ImageDecodeLimits& limits);

/// The dimensions a JPEG with these header dimensions decodes to under `min_size` (see the
/// file comment): {height, width}.
std::pair<int, int> jpeg_scaled_size(int height, int width, std::uint64_t min_size);

/// A box in pixels of an image: rows [top, top + height), columns [left, left + width).
struct CropBox {
  std::int64_t top = 0;
  std::int64_t left = 0;
  std::int64_t height = 0;
  std::int64_t width = 0;
};

/// The part of an image decode_image_box decoded, and where the box lies in it.
struct DecodedBox {
  Tensor pixels;  ///< uint8 [rows, columns, 3]: the box, and what the decode could not avoid
  /// The box in `pixels`' coordinates: fractional when the decode was scaled.
  double top = 0, left = 0, height = 0, width = 0;
  int scale_num = 8;  ///< the JPEG scaling M/8 used (8: full size; PNG: always 8)
};

/// Decodes the box `pick(height, width)` chooses from the image's full dimensions (see the
/// file comment), scaled so that the box stays at least out_h × out_w where it can. PNG decodes
/// whole. Throws ImageError.
DecodedBox decode_image_box(std::span<const std::byte> bytes, const ImageDecodeLimits& limits,
                            const std::function<CropBox(std::int64_t, std::int64_t)>& pick,
                            std::int64_t out_h, std::int64_t out_w);

/// Encodes 8-bit RGB pixels (HWC, rows of width × 3 bytes) as a baseline JPEG with 4:2:0
/// chroma subsampling at `quality` (1..100). Throws ImageError.
std::string encode_jpeg(std::span<const std::uint8_t> rgb, int width, int height, int quality);

/// An RGB image in memory.
struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<std::uint8_t> pixels;  ///< HWC, height × width × 3
};

/// Image `index` of the synthetic set of `seed` (`flowstate gen images`): sides drawn from
/// [min_side, max_side], a two-colour gradient in a random direction, 3 to 10 filled circles
/// and rectangles, and ±8 of noise per value; a pure function of (seed, index). `label`, if
/// given, gets the image's class in [0, classes).
RgbImage synthetic_image(std::uint64_t seed, std::uint64_t index, int min_side, int max_side,
                         std::uint64_t classes = 1000, std::uint64_t* label = nullptr);

}  // namespace flowstate
