#include "flowstate/nodes/image_codec.h"

// clang-format off
#include <cstdio>  // jpeglib.h needs FILE and size_t declared first
#include <jpeglib.h>
// clang-format on
#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <memory>

#include "flowstate/core/rng.h"

namespace flowstate {

namespace {

std::string hex_prefix(std::span<const std::byte> bytes) {
  std::string out;
  char buf[4];
  for (std::size_t i = 0; i < std::min<std::size_t>(bytes.size(), 8); ++i) {
    std::snprintf(buf, sizeof(buf), "%s%02x", i == 0 ? "" : " ", static_cast<unsigned>(bytes[i]));
    out += buf;
  }
  return out;
}

void check_dimensions(std::uint64_t width, std::uint64_t height, const ImageDecodeLimits& limits,
                      const char* what) {
  if (width == 0 || height == 0)
    throw ImageError(std::string(what) + " of " + std::to_string(width) + "x" +
                     std::to_string(height) + " pixels has no pixels");
  if (width * height > limits.max_pixels)
    throw ImageError(std::string(what) + " of " + std::to_string(width) + "x" +
                     std::to_string(height) + " pixels exceeds max_pixels (" +
                     std::to_string(limits.max_pixels) + ")");
}

// ---- JPEG ----

/// One TurboJPEG instance per thread and direction: instances are not thread-safe, and making
/// one per image would cost more than a small image's decode. An instance that failed is
/// replaced: after an error inside libjpeg its state is not reliably reset (a header that
/// follows a failed one can be misread).
struct TjInstance {
  tjhandle (*init)();
  tjhandle handle = nullptr;
  ~TjInstance() { reset(); }
  tjhandle get() {
    if (handle == nullptr) handle = init();
    if (handle == nullptr) throw ImageError(std::string("TurboJPEG: ") + tjGetErrorStr2(nullptr));
    return handle;
  }
  void reset() {
    if (handle != nullptr) tjDestroy(handle);
    handle = nullptr;
  }
  /// Throws ImageError `what` + the instance's message, and drops the instance.
  [[noreturn]] void fail(const std::string& what) {
    std::string message = what + tjGetErrorStr2(handle);
    reset();
    throw ImageError(message);
  }
};

TjInstance& decompressor() {
  thread_local TjInstance t{tjInitDecompress};
  return t;
}

TjInstance& compressor() {
  thread_local TjInstance t{tjInitCompress};
  return t;
}

Tensor decode_jpeg(std::span<const std::byte> bytes, const ImageDecodeLimits& limits) {
  TjInstance& instance = decompressor();
  tjhandle tj = instance.get();
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  const auto size = static_cast<unsigned long>(bytes.size());
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(tj, data, size, &width, &height, &subsamp, &colorspace) != 0)
    instance.fail("not a valid JPEG: ");
  check_dimensions(static_cast<std::uint64_t>(std::max(width, 0)),
                   static_cast<std::uint64_t>(std::max(height, 0)), limits, "a JPEG");
  if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK)
    throw ImageError("a CMYK JPEG (only grayscale and colour JPEGs are read)");
  const auto [h, w] = jpeg_scaled_size(height, width, limits.min_size);
  Tensor out(DType::kUInt8, Shape{h, w, 3});
  if (tjDecompress2(tj, data, size, static_cast<unsigned char*>(out.data()), w, 0, h, TJPF_RGB,
                    TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS) != 0)
    instance.fail("bad JPEG data: ");
  return out;
}

// ---- JPEG, crop-only (the libjpeg API) ----
// libjpeg reports errors by longjmp, as libpng does: each function that calls into it sets its
// jump target and holds no object with a destructor.

struct JpegReader {
  jpeg_decompress_struct cinfo{};
  jpeg_error_mgr err{};
  jpeg_progress_mgr progress{};
  std::jmp_buf jump{};
  char message[JMSG_LENGTH_MAX] = {};
};

void jpeg_on_error(j_common_ptr c) {
  auto* r = reinterpret_cast<JpegReader*>(c->client_data);
  (*c->err->format_message)(c, r->message);
  std::longjmp(r->jump, 1);
}

/// A warning (level -1: truncated or corrupt data) is an error, as TJFLAG_STOPONWARNING makes it.
void jpeg_on_message(j_common_ptr c, int level) {
  if (level < 0) jpeg_on_error(c);
}

/// At most 500 progressive scans, as TJFLAG_LIMITSCANS.
void jpeg_on_progress(j_common_ptr c) {
  auto* d = reinterpret_cast<j_decompress_ptr>(c);
  if (c->is_decompressor && d->input_scan_number > 500) {
    auto* r = reinterpret_cast<JpegReader*>(c->client_data);
    std::snprintf(r->message, sizeof(r->message), "progressive JPEG of more than 500 scans");
    std::longjmp(r->jump, 1);
  }
}

bool jpeg_box_header(JpegReader* r, const unsigned char* data, unsigned long size) {
  if (setjmp(r->jump)) return false;
  jpeg_mem_src(&r->cinfo, data, size);
  jpeg_read_header(&r->cinfo, TRUE);
  return true;
}

/// Starts the scaled decode and narrows it to columns [*x, *x + *w) (widened to iMCUs).
bool jpeg_box_start(JpegReader* r, int scale_num, JDIMENSION* x, JDIMENSION* w) {
  if (setjmp(r->jump)) return false;
  r->cinfo.out_color_space = JCS_RGB;
  r->cinfo.scale_num = static_cast<unsigned>(scale_num);
  r->cinfo.scale_denom = 8;
  jpeg_start_decompress(&r->cinfo);
  if (*x != 0 || *w != r->cinfo.output_width) jpeg_crop_scanline(&r->cinfo, x, w);
  return true;
}

/// Reads rows [y0, y0 + rows) into `out` (rows of the cropped width); with `last_row` (room
/// for one row), also reads the rest of the data and finishes, so that truncation is noticed:
/// all rows but the last are skipped (entropy-decoded), the last is read into `last_row`
/// (jpeg_skip_scanlines to the very end reads no data at all).
bool jpeg_box_rows(JpegReader* r, JDIMENSION y0, JDIMENSION rows, unsigned char* out,
                   unsigned char* last_row) {
  if (setjmp(r->jump)) return false;
  if (y0 > 0 && jpeg_skip_scanlines(&r->cinfo, y0) != y0) {
    std::snprintf(r->message, sizeof(r->message), "could not skip to row %u", y0);
    return false;
  }
  const std::size_t stride = static_cast<std::size_t>(r->cinfo.output_width) * 3;
  for (JDIMENSION done = 0; done < rows;) {
    JSAMPROW row = out + done * stride;
    const JDIMENSION n = jpeg_read_scanlines(&r->cinfo, &row, 1);
    if (n == 0) {
      std::snprintf(r->message, sizeof(r->message), "no data for row %u", y0 + done);
      return false;
    }
    done += n;
  }
  if (last_row != nullptr) {
    const JDIMENSION rest = r->cinfo.output_height - r->cinfo.output_scanline;
    if (rest > 1) jpeg_skip_scanlines(&r->cinfo, rest - 1);
    if (rest > 0) jpeg_read_scanlines(&r->cinfo, &last_row, 1);
    jpeg_finish_decompress(&r->cinfo);
  }
  return true;
}

/// The smallest M in 1..8 keeping `box` at least `out` pixels at scale M/8 (8 when even the
/// full size is smaller).
int box_scale(std::int64_t box, std::int64_t out) {
  for (int m = 1; m < 8; ++m)
    if (box * m >= out * 8) return m;
  return 8;
}

DecodedBox decode_jpeg_box(std::span<const std::byte> bytes, const ImageDecodeLimits& limits,
                           const std::function<CropBox(std::int64_t, std::int64_t)>& pick,
                           std::int64_t out_h, std::int64_t out_w) {
  JpegReader r;
  r.cinfo.err = jpeg_std_error(&r.err);
  r.err.error_exit = jpeg_on_error;
  r.err.emit_message = jpeg_on_message;
  r.cinfo.client_data = &r;
  jpeg_create_decompress(&r.cinfo);
  struct Destroy {
    j_decompress_ptr c;
    ~Destroy() { jpeg_destroy_decompress(c); }
  } destroy{&r.cinfo};
  r.progress.progress_monitor = jpeg_on_progress;
  r.cinfo.progress = &r.progress;
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  const auto size = static_cast<unsigned long>(bytes.size());
  if (!jpeg_box_header(&r, data, size))
    throw ImageError(std::string("not a valid JPEG: ") + r.message);
  const std::int64_t height = r.cinfo.image_height, width = r.cinfo.image_width;
  check_dimensions(static_cast<std::uint64_t>(width), static_cast<std::uint64_t>(height), limits,
                   "a JPEG");
  if (r.cinfo.jpeg_color_space == JCS_CMYK || r.cinfo.jpeg_color_space == JCS_YCCK)
    throw ImageError("a CMYK JPEG (only grayscale and colour JPEGs are read)");
  const CropBox box = pick(height, width);
  const int m = std::min(box_scale(box.height, out_h), box_scale(box.width, out_w));
  // The box at scale m/8, and the scaled pixels it touches.
  const double s = m / 8.0;
  const double top = static_cast<double>(box.top) * s, left = static_cast<double>(box.left) * s;
  const double bh = static_cast<double>(box.height) * s, bw = static_cast<double>(box.width) * s;
  const auto sh = static_cast<std::int64_t>(std::ceil(static_cast<double>(height) * s));
  const auto sw = static_cast<std::int64_t>(std::ceil(static_cast<double>(width) * s));
  const std::int64_t y0 =
      std::clamp<std::int64_t>(static_cast<std::int64_t>(std::floor(top)), 0, sh - 1);
  const std::int64_t y1 =
      std::clamp<std::int64_t>(static_cast<std::int64_t>(std::ceil(top + bh)), y0 + 1, sh);
  // One more column each side: fancy upsampling of the chroma at a cropped region's edge
  // columns lacks their outer neighbours, so those columns differ from the whole decode's.
  const std::int64_t x0 =
      std::clamp<std::int64_t>(static_cast<std::int64_t>(std::floor(left)) - 1, 0, sw - 1);
  const std::int64_t x1 =
      std::clamp<std::int64_t>(static_cast<std::int64_t>(std::ceil(left + bw)) + 1, x0 + 1, sw);
  auto x = static_cast<JDIMENSION>(x0);
  auto w = static_cast<JDIMENSION>(x1 - x0);
  if (!jpeg_box_start(&r, m, &x, &w)) throw ImageError(std::string("bad JPEG data: ") + r.message);
  if (static_cast<std::int64_t>(r.cinfo.output_height) != sh)
    throw ImageError("libjpeg scaled " + std::to_string(height) + " rows to " +
                     std::to_string(r.cinfo.output_height) + ", not " + std::to_string(sh));
  DecodedBox out;
  out.scale_num = m;
  out.pixels = Tensor(DType::kUInt8, Shape{y1 - y0, static_cast<std::int64_t>(w), 3});
  // A file that does not end in EOI is read to its end: truncation is an error, as in the full
  // decode. Otherwise what lies below the box is never decoded.
  const bool ends_in_eoi = size >= 2 && data[size - 2] == 0xff && data[size - 1] == 0xd9;
  std::vector<unsigned char> last_row(ends_in_eoi ? 0 : static_cast<std::size_t>(w) * 3);
  if (!jpeg_box_rows(&r, static_cast<JDIMENSION>(y0), static_cast<JDIMENSION>(y1 - y0),
                     static_cast<unsigned char*>(out.pixels.data()),
                     ends_in_eoi ? nullptr : last_row.data()))
    throw ImageError(std::string("bad JPEG data: ") + r.message);
  out.top = top - static_cast<double>(y0);
  out.left = left - static_cast<double>(x);
  out.height = bh;
  out.width = bw;
  return out;
}

// ---- PNG ----
// libpng reports errors by longjmp: each function that calls into it sets its jump target
// and holds no object with a destructor, so a jump skips nothing.

struct PngReader {
  png_structp png = nullptr;
  png_infop info = nullptr;
  const unsigned char* data = nullptr;
  std::size_t size = 0;
  std::size_t pos = 0;
  char error[256] = {};
};

void png_on_error(png_structp png, png_const_charp message) {
  auto* r = static_cast<PngReader*>(png_get_error_ptr(png));
  std::snprintf(r->error, sizeof(r->error), "%s", message);
  png_longjmp(png, 1);
}

void png_on_warning(png_structp, png_const_charp) {}

void png_on_read(png_structp png, png_bytep out, std::size_t n) {
  auto* r = static_cast<PngReader*>(png_get_io_ptr(png));
  if (r->size - r->pos < n) png_error(png, "truncated PNG data");
  std::memcpy(out, r->data + r->pos, n);
  r->pos += n;
}

/// Reads the header and sets up the conversion to 8-bit RGB; false on an error (r->error).
bool png_read_header(PngReader* r, png_uint_32* width, png_uint_32* height) {
  if (setjmp(png_jmpbuf(r->png))) return false;
  png_set_user_limits(r->png, PNG_UINT_31_MAX, PNG_UINT_31_MAX);  // bounded by max_pixels
  png_read_info(r->png, r->info);
  *width = png_get_image_width(r->png, r->info);
  *height = png_get_image_height(r->png, r->info);
  const int color = png_get_color_type(r->png, r->info);
  const int depth = png_get_bit_depth(r->png, r->info);
  if (depth == 16) png_set_strip_16(r->png);
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(r->png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(r->png);
  if ((color & PNG_COLOR_MASK_ALPHA) != 0 || png_get_valid(r->png, r->info, PNG_INFO_tRNS) != 0)
    png_set_strip_alpha(r->png);
  if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA)
    png_set_gray_to_rgb(r->png);
  png_set_interlace_handling(r->png);
  png_read_update_info(r->png, r->info);
  if (png_get_channels(r->png, r->info) != 3 || png_get_bit_depth(r->png, r->info) != 8)
    png_error(r->png, "unsupported PNG colour layout");
  return true;
}

bool png_read_pixels(PngReader* r, png_bytep* rows) {
  if (setjmp(png_jmpbuf(r->png))) return false;
  png_read_image(r->png, rows);
  return true;
}

Tensor decode_png(std::span<const std::byte> bytes, const ImageDecodeLimits& limits) {
  PngReader r;
  r.data = reinterpret_cast<const unsigned char*>(bytes.data());
  r.size = bytes.size();
  r.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &r, png_on_error, png_on_warning);
  if (r.png != nullptr) r.info = png_create_info_struct(r.png);
  struct Free {
    PngReader* r;
    ~Free() {
      if (r->png != nullptr)
        png_destroy_read_struct(&r->png, r->info != nullptr ? &r->info : nullptr, nullptr);
    }
  } free_reader{&r};
  if (r.info == nullptr) throw ImageError("libpng: out of memory");
  png_set_read_fn(r.png, &r, png_on_read);
  png_uint_32 width = 0, height = 0;
  if (!png_read_header(&r, &width, &height))
    throw ImageError(std::string("not a valid PNG: ") + r.error);
  check_dimensions(width, height, limits, "a PNG");
  Tensor out(DType::kUInt8,
             Shape{static_cast<std::int64_t>(height), static_cast<std::int64_t>(width), 3});
  std::vector<png_bytep> rows(height);
  auto* base = static_cast<png_bytep>(out.data());
  for (png_uint_32 y = 0; y < height; ++y) rows[y] = base + static_cast<std::size_t>(y) * width * 3;
  if (!png_read_pixels(&r, rows.data())) throw ImageError(std::string("bad PNG data: ") + r.error);
  return out;
}

}  // namespace

ImageFormat sniff_image(std::span<const std::byte> bytes) {
  static constexpr unsigned char kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  if (bytes.size() >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff) return ImageFormat::kJpeg;
  if (bytes.size() >= 8 && std::memcmp(b, kPng, 8) == 0) return ImageFormat::kPng;
  return ImageFormat::kUnknown;
}

Tensor decode_image_bytes(std::span<const std::byte> bytes, const ImageDecodeLimits& limits) {
  switch (sniff_image(bytes)) {
    case ImageFormat::kJpeg:
      return decode_jpeg(bytes, limits);
    case ImageFormat::kPng:
      return decode_png(bytes, limits);
    case ImageFormat::kUnknown:
      break;
  }
  if (bytes.empty()) throw ImageError("not an image: 0 bytes");
  throw ImageError("not a JPEG or PNG image (" + std::to_string(bytes.size()) + " bytes starting " +
                   hex_prefix(bytes) + ")");
}

DecodedBox decode_image_box(std::span<const std::byte> bytes, const ImageDecodeLimits& limits,
                            const std::function<CropBox(std::int64_t, std::int64_t)>& pick,
                            std::int64_t out_h, std::int64_t out_w) {
  if (sniff_image(bytes) == ImageFormat::kJpeg)
    return decode_jpeg_box(bytes, limits, pick, out_h, out_w);
  DecodedBox out;
  out.pixels = decode_image_bytes(bytes, {.max_pixels = limits.max_pixels});
  const CropBox box = pick(out.pixels.shape()[0], out.pixels.shape()[1]);
  out.top = static_cast<double>(box.top);
  out.left = static_cast<double>(box.left);
  out.height = static_cast<double>(box.height);
  out.width = static_cast<double>(box.width);
  return out;
}

std::pair<int, int> jpeg_scaled_size(int height, int width, std::uint64_t min_size) {
  if (min_size == 0) return {height, width};
  int count = 0;
  const tjscalingfactor* factors = tjGetScalingFactors(&count);
  std::pair<int, int> best{height, width};
  for (int i = 0; i < count; ++i) {
    const tjscalingfactor f = factors[i];
    if (f.num > f.denom) continue;  // enlarging is a resize's job
    const int h = TJSCALED(height, f);
    const int w = TJSCALED(width, f);
    if (static_cast<std::uint64_t>(std::min(h, w)) >= min_size &&
        static_cast<std::int64_t>(h) * w < static_cast<std::int64_t>(best.first) * best.second)
      best = {h, w};
  }
  return best;
}

std::string encode_jpeg(std::span<const std::uint8_t> rgb, int width, int height, int quality) {
  if (width <= 0 || height <= 0 ||
      rgb.size() != static_cast<std::size_t>(width) * static_cast<std::size_t>(height) * 3)
    throw ImageError("encode_jpeg: " + std::to_string(rgb.size()) + " bytes are not " +
                     std::to_string(width) + "x" + std::to_string(height) + " RGB pixels");
  TjInstance& instance = compressor();
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  if (tjCompress2(instance.get(), rgb.data(), width, 0, height, TJPF_RGB, &jpeg, &size, TJSAMP_420,
                  quality, 0) != 0) {
    tjFree(jpeg);
    instance.fail("encode_jpeg: ");
  }
  std::string out(reinterpret_cast<const char*>(jpeg), size);
  tjFree(jpeg);
  return out;
}

RgbImage synthetic_image(std::uint64_t seed, std::uint64_t index, int min_side, int max_side,
                         std::uint64_t classes, std::uint64_t* label) {
  ElementRng rng(seed, index, std::uint64_t{4} << 32);
  const auto span = static_cast<std::uint64_t>(max_side - min_side + 1);
  RgbImage img;
  img.width = min_side + static_cast<int>(rng.below(span));
  img.height = min_side + static_cast<int>(rng.below(span));
  const std::uint64_t cls = rng.below(classes);
  if (label != nullptr) *label = cls;
  auto unit = [&] { return static_cast<double>(rng() >> 11) / 9007199254740992.0; };
  auto colour = [&] {
    return std::array<double, 3>{static_cast<double>(rng.below(256)),
                                 static_cast<double>(rng.below(256)),
                                 static_cast<double>(rng.below(256))};
  };
  const int w = img.width, h = img.height;
  img.pixels.resize(static_cast<std::size_t>(w) * h * 3);
  // The background: a gradient from one colour to another along a random direction.
  const auto c0 = colour(), c1 = colour();
  const double angle = unit() * 6.283185307179586;
  const double dx = std::cos(angle), dy = std::sin(angle);
  const double extent = std::abs(dx) * w + std::abs(dy) * h;
  const double origin = std::min(0.0, dx * w) + std::min(0.0, dy * h);
  std::vector<double> plane(static_cast<std::size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const double t = (dx * x + dy * y - origin) / extent;
      for (int c = 0; c < 3; ++c)
        plane[(static_cast<std::size_t>(y) * w + x) * 3 + c] = c0[c] + (c1[c] - c0[c]) * t;
    }
  // Shapes: filled circles and rectangles of random colours.
  const int shapes = 3 + static_cast<int>(rng.below(8));
  for (int s = 0; s < shapes; ++s) {
    const auto col = colour();
    const bool circle = rng.below(2) == 0;
    const int cx = static_cast<int>(rng.below(static_cast<std::uint64_t>(w)));
    const int cy = static_cast<int>(rng.below(static_cast<std::uint64_t>(h)));
    const int r = 10 + static_cast<int>(rng.below(static_cast<std::uint64_t>(std::min(w, h) / 3)));
    const int rh = circle ? r : 10 + static_cast<int>(rng.below(static_cast<std::uint64_t>(h / 3)));
    for (int y = std::max(0, cy - rh); y < std::min(h, cy + rh); ++y)
      for (int x = std::max(0, cx - r); x < std::min(w, cx + r); ++x) {
        if (circle && (x - cx) * (x - cx) + (y - cy) * (y - cy) > r * r) continue;
        for (int c = 0; c < 3; ++c) plane[(static_cast<std::size_t>(y) * w + x) * 3 + c] = col[c];
      }
  }
  // Noise: ±8 per value from a xorshift stream seeded by the image's generator.
  std::uint64_t x = rng() | 1;
  for (std::size_t i = 0; i < plane.size(); ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const double v = plane[i] + static_cast<double>(static_cast<int>(x % 17) - 8);
    img.pixels[i] = static_cast<std::uint8_t>(std::clamp(std::lround(v), 0L, 255L));
  }
  return img;
}

}  // namespace flowstate
