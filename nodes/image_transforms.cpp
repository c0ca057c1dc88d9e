#include "flowstate/nodes/image_transforms.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "flowstate/core/error.h"
#include "flowstate/core/rng.h"

namespace flowstate {

namespace {

// ---- helpers ----

/// The image field of a sample: a uint8 [H, W, C] tensor with H, W, C > 0, else a DataError
/// naming the record and field at parameter `field` of `p`.
const Tensor& image_of(const Sample& s, FieldId field, const std::string& name, const Params& p) {
  const Tensor* t = s.find(field);
  if (t == nullptr)
    throw param_data_error(p, "field",
                           "record " + s.ref.to_string() + " has no field '" + name + "'");
  const Shape& sh = t->shape();
  if (t->dtype() != DType::kUInt8 || sh.rank() != 3 || sh[0] == 0 || sh[1] == 0 || sh[2] == 0)
    throw param_data_error(p, "field",
                           "field '" + name + "' of record " + s.ref.to_string() + " is " +
                               std::string(dtype_name(t->dtype())) + " " + sh.to_string() +
                               ", not a decoded image (uint8 [H, W, C]; see decode_image)");
  return *t;
}

/// Python's round(): to nearest, ties to even (torchvision's crop arithmetic).
std::int64_t round_even(double v) { return static_cast<std::int64_t>(std::nearbyint(v)); }

/// A uniform double in [lo, hi) from the record's generator.
double uniform(ElementRng& rng, double lo, double hi) {
  return lo + (hi - lo) * (static_cast<double>(rng() >> 11) / 9007199254740992.0);
}

std::string check_size(const ParamValue& v) { return check_image_size(v); }

std::pair<std::int64_t, std::int64_t> size_hw(const std::vector<std::int64_t>& size) {
  return image_size_hw(size);
}

/// The taps of a bilinear resampling of [begin, begin + length) to `out` values.
struct Taps {
  std::vector<std::int64_t> first;
  std::vector<std::int32_t> count;
  std::vector<float> weights;  ///< `stride` per output value
  std::size_t stride = 0;
};

/// The taps of a bilinear resampling of the span [begin, begin + length) (fractional values
/// allowed) to `out` values, clamped to the pixels [first, end).
Taps make_taps(double begin, double length, std::int64_t first, std::int64_t end,
               std::int64_t out) {
  const double scale = length / static_cast<double>(out);
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter_scale;  // the triangle's support is 1, widened when shrinking
  Taps t;
  t.stride = static_cast<std::size_t>(std::ceil(support)) * 2 + 1;
  t.first.resize(static_cast<std::size_t>(out));
  t.count.resize(static_cast<std::size_t>(out));
  t.weights.assign(static_cast<std::size_t>(out) * t.stride, 0.0f);
  for (std::int64_t i = 0; i < out; ++i) {
    const double center = begin + (static_cast<double>(i) + 0.5) * scale;
    const std::int64_t lo =
        std::max(first, static_cast<std::int64_t>(std::floor(center - support + 0.5)));
    const std::int64_t hi =
        std::min(end, static_cast<std::int64_t>(std::floor(center + support + 0.5)));
    const auto n = static_cast<std::size_t>(std::max<std::int64_t>(hi - lo, 1));
    float* w = &t.weights[static_cast<std::size_t>(i) * t.stride];
    double sum = 0;
    for (std::size_t k = 0; k < n && k < t.stride; ++k) {
      const double x =
          (static_cast<double>(lo) + static_cast<double>(k) - center + 0.5) / filter_scale;
      const double v = std::max(0.0, 1.0 - std::abs(x));
      w[k] = static_cast<float>(v);
      sum += v;
    }
    if (sum <= 0) {  // cannot happen for a centre inside the region; keep the nearest value
      w[0] = 1.0f;
      sum = 1.0;
    }
    for (std::size_t k = 0; k < n && k < t.stride; ++k) w[k] = static_cast<float>(w[k] / sum);
    t.first[static_cast<std::size_t>(i)] = std::min(lo, end - 1);
    t.count[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(std::min(n, t.stride));
  }
  return t;
}

/// The horizontal pass of an RGB row: out[3x + ch] = the sum over k of weight k × the tap's
/// channel ch, accumulated in k order from 0 — the generic loop's arithmetic, so the result is
/// the same bit for bit. With SSE2 a pixel's three channels are one 4-lane vector (the fourth
/// lane reads the next byte, when it lies within the image, and is discarded: `out` must have
/// room for one float after the row).
void horizontal_rgb(const std::uint8_t* in_row, const std::uint8_t* src_end, const Taps& tx,
                    std::int64_t out_w, float* out) {
  for (std::int64_t x = 0; x < out_w; ++x) {
    const auto xi = static_cast<std::size_t>(x);
    const float* wt = &tx.weights[xi * tx.stride];
    const std::uint8_t* px = in_row + tx.first[xi] * 3;
    const std::int32_t n = tx.count[xi];
#if defined(__SSE2__)
    if (px + 3 * static_cast<std::ptrdiff_t>(n) + 1 <= src_end) {
      const __m128i zero = _mm_setzero_si128();
      __m128 sum = _mm_setzero_ps();
      for (std::int32_t k = 0; k < n; ++k) {
        std::int32_t bytes = 0;
        std::memcpy(&bytes, px + 3 * k, 4);
        __m128i v = _mm_unpacklo_epi8(_mm_cvtsi32_si128(bytes), zero);
        v = _mm_unpacklo_epi16(v, zero);
        sum = _mm_add_ps(sum, _mm_mul_ps(_mm_set1_ps(wt[k]), _mm_cvtepi32_ps(v)));
      }
      _mm_storeu_ps(out + 3 * x, sum);
      continue;
    }
#endif
    float a0 = 0, a1 = 0, a2 = 0;
    for (std::int32_t k = 0; k < n; ++k) {
      a0 += wt[k] * px[3 * k];
      a1 += wt[k] * px[3 * k + 1];
      a2 += wt[k] * px[3 * k + 2];
    }
    out[3 * x] = a0;
    out[3 * x + 1] = a1;
    out[3 * x + 2] = a2;
  }
}

// ---- resize ----

struct ResizeOptions {
  std::string field = "jpg";
  std::vector<std::int64_t> size;
  static constexpr auto table() {
    return std::tuple{
        param("field", &ResizeOptions::field, {.doc = "the image field, read and replaced"}),
        param("size", &ResizeOptions::size,
              {.required = true,
               .doc = "[height, width]; one value: the shorter side (aspect ratio kept)",
               .check = check_size})};
  }
};

TransformSchema resize_transform() {
  return define_transform<ResizeOptions>(
      "resize", "bilinear resize of a uint8 [H, W, C] image (antialiased when shrinking)",
      [](const ResizeOptions& o, const Params& p) -> SampleFn {
        return [o, id = field_id(o.field), p](Sample& s, MapContext&) {
          const Tensor& in = image_of(s, id, o.field, p);
          const std::int64_t h = in.shape()[0], w = in.shape()[1];
          std::int64_t oh = 0, ow = 0;
          if (o.size.size() == 2) {
            oh = o.size[0];
            ow = o.size[1];
          } else if (h <= w) {  // torchvision's Resize(int): the long side truncated
            oh = o.size[0];
            ow = std::max<std::int64_t>(1, o.size[0] * w / h);
          } else {
            ow = o.size[0];
            oh = std::max<std::int64_t>(1, o.size[0] * h / w);
          }
          s.set(id, resize_region(in, 0, 0, h, w, oh, ow));
        };
      });
}

// ---- center_crop ----

struct CenterCropOptions {
  std::string field = "jpg";
  std::vector<std::int64_t> size;
  static constexpr auto table() {
    return std::tuple{
        param("field", &CenterCropOptions::field, {.doc = "the image field, read and replaced"}),
        param("size", &CenterCropOptions::size,
              {.required = true,
               .doc = "[height, width], or one value for both",
               .check = check_size})};
  }
};

/// The [oh, ow] window of `in` whose top-left corner is (top, left), possibly outside the
/// image: what lies outside is zero.
Tensor window(const Tensor& in, std::int64_t top, std::int64_t left, std::int64_t oh,
              std::int64_t ow) {
  const std::int64_t h = in.shape()[0], w = in.shape()[1], c = in.shape()[2];
  Tensor out(DType::kUInt8, Shape{oh, ow, c});
  auto* dst = static_cast<std::uint8_t*>(out.data());
  const auto* src = static_cast<const std::uint8_t*>(in.data());
  std::memset(dst, 0, out.nbytes());
  const std::int64_t x0 = std::max<std::int64_t>(0, left), x1 = std::min(w, left + ow);
  for (std::int64_t y = std::max<std::int64_t>(0, top); y < std::min(h, top + oh); ++y)
    if (x1 > x0)
      std::memcpy(dst + ((y - top) * ow + (x0 - left)) * c, src + (y * w + x0) * c,
                  static_cast<std::size_t>((x1 - x0) * c));
  return out;
}

TransformSchema center_crop_transform() {
  return define_transform<CenterCropOptions>(
      "center_crop", "the centre [h, w] of a uint8 [H, W, C] image (zero-padded if smaller)",
      [](const CenterCropOptions& o, const Params& p) -> SampleFn {
        const auto [oh, ow] = size_hw(o.size);
        return [oh, ow, name = o.field, id = field_id(o.field), p](Sample& s, MapContext&) {
          const Tensor& in = image_of(s, id, name, p);
          const std::int64_t h = in.shape()[0], w = in.shape()[1];
          // torchvision: int(round((H - h) / 2)), Python's rounding; negative when padding.
          const std::int64_t top = round_even(static_cast<double>(h - oh) / 2.0);
          const std::int64_t left = round_even(static_cast<double>(w - ow) / 2.0);
          s.set(id, window(in, top, left, oh, ow));
        };
      });
}

// ---- random_resized_crop ----

struct RandomResizedCropOptions {
  std::string field = "jpg";
  std::vector<std::int64_t> size;
  double scale_min = CropRange{}.scale_min;
  double scale_max = CropRange{}.scale_max;
  double ratio_min = CropRange{}.ratio_min;
  double ratio_max = CropRange{}.ratio_max;
  static constexpr auto table() {
    using O = RandomResizedCropOptions;
    return std::tuple_cat(
        std::tuple{param("field", &O::field, {.doc = "the image field, read and replaced"}),
                   param("size", &O::size,
                         {.required = true,
                          .doc = "output [height, width], or one value for both",
                          .check = check_size})},
        crop_range_params<O>());
  }
  CropRange range() const { return {scale_min, scale_max, ratio_min, ratio_max}; }
  void validate() const { validate_crop_range(range()); }
};

TransformSchema random_resized_crop_transform() {
  return define_transform<RandomResizedCropOptions>(
      "random_resized_crop",
      "torchvision's RandomResizedCrop: a random area and aspect ratio, resized bilinearly",
      [](const RandomResizedCropOptions& o, const Params& p) -> SampleFn {
        const auto [oh, ow] = size_hw(o.size);
        return [o, oh, ow, id = field_id(o.field), p](Sample& s, MapContext& ctx) {
          const Tensor& in = image_of(s, id, o.field, p);
          const CropBox c =
              random_resized_crop_box(in.shape()[0], in.shape()[1], o.range(), ctx.rng);
          s.set(id, resize_region(in, c.top, c.left, c.height, c.width, oh, ow));
        };
      });
}

// ---- flip ----

struct FlipOptions {
  std::string field = "jpg";
  double p = 0.5;
  static constexpr auto table() {
    return std::tuple{
        param("field", &FlipOptions::field, {.doc = "the image field, read and replaced"}),
        param("p", &FlipOptions::p, {.min = 0, .max = 1, .doc = "probability of a flip"})};
  }
};

TransformSchema flip_transform() {
  return define_transform<FlipOptions>(
      "flip", "mirrors a uint8 [H, W, C] image left-right with probability p",
      [](const FlipOptions& o, const Params& p) -> SampleFn {
        return [prob = o.p, name = o.field, id = field_id(o.field), p](Sample& s, MapContext& ctx) {
          const Tensor& in = image_of(s, id, name, p);
          if (!(uniform(ctx.rng, 0.0, 1.0) < prob)) return;
          const std::int64_t h = in.shape()[0], w = in.shape()[1], c = in.shape()[2];
          Tensor out(DType::kUInt8, in.shape());
          const auto* src = static_cast<const std::uint8_t*>(in.data());
          auto* dst = static_cast<std::uint8_t*>(out.data());
          if (c == 3) {  // a pixel at a time as three bytes, not a call to memcpy each
            for (std::int64_t y = 0; y < h; ++y) {
              const std::uint8_t* s_row = src + y * w * 3;
              std::uint8_t* d_row = dst + y * w * 3;
              for (std::int64_t x = 0; x < w; ++x) {
                const std::uint8_t* px = s_row + (w - 1 - x) * 3;
                d_row[x * 3] = px[0];
                d_row[x * 3 + 1] = px[1];
                d_row[x * 3 + 2] = px[2];
              }
            }
          } else {
            for (std::int64_t y = 0; y < h; ++y)
              for (std::int64_t x = 0; x < w; ++x)
                std::memcpy(dst + (y * w + x) * c, src + (y * w + (w - 1 - x)) * c,
                            static_cast<std::size_t>(c));
          }
          s.set(id, std::move(out));
        };
      });
}

// ---- normalize_image ----

/// Per-channel values are written as a list of numbers (one value: every channel).
std::string check_channel_values(const ParamValue& v) {
  const auto& list = std::get<std::vector<std::string>>(v);
  if (list.empty()) return "must list one value, or one per channel";
  for (const auto& s : list) {
    double d = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), d);
    if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(d))
      return "'" + s + "' is not a number";
  }
  return "";
}

std::vector<double> channel_values(const std::vector<std::string>& list) {
  std::vector<double> out;
  for (const auto& s : list) {
    double d = 0;
    std::from_chars(s.data(), s.data() + s.size(), d);
    out.push_back(d);
  }
  return out;
}

}  // namespace

/// The element type normalize_image writes.
enum class ImageDType : std::uint8_t { kFloat32, kFloat16, kBFloat16 };
template <>
struct EnumNames<ImageDType> {
  static constexpr std::array<std::pair<ImageDType, const char*>, 3> values{
      {{ImageDType::kFloat32, "float32"},
       {ImageDType::kFloat16, "float16"},
       {ImageDType::kBFloat16, "bfloat16"}}};
};

namespace {

struct NormalizeImageOptions {
  std::string field = "jpg";
  std::vector<std::string> mean{"0.485", "0.456", "0.406"};
  std::vector<std::string> std{"0.229", "0.224", "0.225"};
  ImageDType dtype = ImageDType::kFloat32;
  static constexpr auto table() {
    using O = NormalizeImageOptions;
    return std::tuple{
        param("field", &O::field, {.doc = "the image field, read and replaced"}),
        param("mean", &O::mean,
              {.doc = "per channel, subtracted after scaling to [0, 1] (default ImageNet's)",
               .check = check_channel_values}),
        param("std", &O::std,
              {.doc = "per channel, divides (default ImageNet's)", .check = check_channel_values}),
        // Described only when not float32: pipelines written before it keep their fingerprints.
        param("dtype", &O::dtype,
              {.doc = "the output's element type; float16/bfloat16 are the float32 value rounded "
                      "to nearest even",
               .describe_if = [](const O& o) { return o.dtype != ImageDType::kFloat32; }})};
  }
  void validate() const {
    for (double s : channel_values(std))
      if (!(s > 0)) throw ConfigError("std", "every std value must be greater than zero");
  }
};

/// Writes the [C, H, W] planes of uint8 [H, W, C] `src` through per-channel tables of 256
/// output elements (`table[ch * 256 + x]`), as T: float, or the bits of a Float16/BFloat16.
template <class T>
void normalize_planes(const std::uint8_t* src, T* dst, const T* table, std::int64_t plane,
                      std::int64_t c) {
  if (c == 3) {  // one pass over the pixels, three planes written
    const T *t0 = table, *t1 = t0 + 256, *t2 = t0 + 512;
    T *o0 = dst, *o1 = dst + plane, *o2 = dst + 2 * plane;
    for (std::int64_t i = 0; i < plane; ++i) {
      o0[i] = t0[src[3 * i]];
      o1[i] = t1[src[3 * i + 1]];
      o2[i] = t2[src[3 * i + 2]];
    }
  } else {
    for (std::int64_t ch = 0; ch < c; ++ch)
      for (std::int64_t i = 0; i < plane; ++i)
        dst[ch * plane + i] = table[static_cast<std::size_t>(ch * 256 + src[i * c + ch])];
  }
}

TransformSchema normalize_image_transform() {
  return define_transform<NormalizeImageOptions>(
      "normalize_image",
      "uint8 [H, W, C] -> float32 (or dtype) [C, H, W], (x / 255 - mean) / std per channel",
      [](const NormalizeImageOptions& o, const Params& p) -> SampleFn {
        return [mean = channel_values(o.mean), std = channel_values(o.std), name = o.field,
                id = field_id(o.field), dtype = o.dtype, p](Sample& s, MapContext& ctx) {
          const Tensor& in = image_of(s, id, name, p);
          const std::int64_t h = in.shape()[0], w = in.shape()[1], c = in.shape()[2];
          auto pick = [&](const std::vector<double>& v, const char* what, std::int64_t ch) {
            if (v.size() == 1) return v[0];
            if (static_cast<std::int64_t>(v.size()) != c)
              throw param_data_error(p, what,
                                     "lists " + std::to_string(v.size()) + " values, but field '" +
                                         name + "' of record " + s.ref.to_string() + " has " +
                                         std::to_string(c) + " channels");
            return v[static_cast<std::size_t>(ch)];
          };
          const auto* src = static_cast<const std::uint8_t*>(in.data());
          const std::int64_t plane = h * w;
          // (x / 255 - m) / s through a 256-entry table per channel: one load per value.
          std::vector<float> table(static_cast<std::size_t>(256 * c));
          for (std::int64_t ch = 0; ch < c; ++ch) {
            const double m = pick(mean, "mean", ch), sd = pick(std, "std", ch);
            for (int v = 0; v < 256; ++v)
              table[static_cast<std::size_t>(ch * 256 + v)] =
                  static_cast<float>((static_cast<double>(v) / 255.0 - m) / sd);
          }
          const DType out_type = dtype == ImageDType::kFloat32   ? DType::kFloat32
                                 : dtype == ImageDType::kFloat16 ? DType::kFloat16
                                                                 : DType::kBFloat16;
          // Written into the batch's memory when the assembler offers it (BatchSlots).
          Tensor out = output_tensor(ctx, id, out_type, Shape{c, h, w});
          if (dtype == ImageDType::kFloat32) {
            normalize_planes(src, static_cast<float*>(out.data()), table.data(), plane, c);
          } else {
            // 16-bit output: the table holds each float32 value rounded once to 16 bits, and
            // the pixels are written as halves straight away (no float32 image in between).
            std::vector<std::uint16_t> halves(table.size());
            if (dtype == ImageDType::kFloat16) {
              float_to_float16(table.data(), halves.data(), table.size());
            } else {
              for (std::size_t i = 0; i < table.size(); ++i) halves[i] = bfloat16_bits(table[i]);
            }
            normalize_planes(src, static_cast<std::uint16_t*>(out.data()), halves.data(), plane, c);
          }
          s.set(id, std::move(out));
        };
      });
}

}  // namespace

std::string check_image_size(const ParamValue& v) {
  const auto& d = std::get<std::vector<std::int64_t>>(v);
  if (d.empty() || d.size() > 2) return "must be one size or [height, width]";
  for (auto x : d)
    if (x < 1 || x > 65536) return "sides must be between 1 and 65536";
  return "";
}

std::pair<std::int64_t, std::int64_t> image_size_hw(const std::vector<std::int64_t>& size) {
  return {size[0], size.size() == 2 ? size[1] : size[0]};
}

void validate_crop_range(const CropRange& r) {
  if (r.scale_min > r.scale_max)
    throw ConfigError("scale_min", "scale_min (" + std::to_string(r.scale_min) +
                                       ") is greater than scale_max (" +
                                       std::to_string(r.scale_max) + ")");
  if (r.ratio_min > r.ratio_max)
    throw ConfigError("ratio_min", "ratio_min (" + std::to_string(r.ratio_min) +
                                       ") is greater than ratio_max (" +
                                       std::to_string(r.ratio_max) + ")");
}

CropBox random_resized_crop_box(std::int64_t h, std::int64_t w, const CropRange& o,
                                ElementRng& rng) {
  const double area = static_cast<double>(h) * static_cast<double>(w);
  const double log_lo = std::log(o.ratio_min), log_hi = std::log(o.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * uniform(rng, o.scale_min, o.scale_max);
    const double aspect = std::exp(uniform(rng, log_lo, log_hi));
    const std::int64_t cw = round_even(std::sqrt(target * aspect));
    const std::int64_t ch = round_even(std::sqrt(target / aspect));
    if (cw > 0 && cw <= w && ch > 0 && ch <= h) {
      const auto top = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(h - ch + 1)));
      const auto left =
          static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(w - cw + 1)));
      return {top, left, ch, cw};
    }
  }
  // The fallback: the centre crop of the whole image with its ratio clamped to the range.
  const double in_ratio = static_cast<double>(w) / static_cast<double>(h);
  std::int64_t cw = w, ch = h;
  if (in_ratio < o.ratio_min) {
    ch = std::max<std::int64_t>(1, round_even(static_cast<double>(w) / o.ratio_min));
  } else if (in_ratio > o.ratio_max) {
    cw = std::max<std::int64_t>(1, round_even(static_cast<double>(h) * o.ratio_max));
  }
  ch = std::min(ch, h);
  cw = std::min(cw, w);
  return {(h - ch) / 2, (w - cw) / 2, ch, cw};
}

Tensor resize_region(const Tensor& in, std::int64_t top, std::int64_t left, std::int64_t height,
                     std::int64_t width, std::int64_t out_h, std::int64_t out_w) {
  return resize_box(in, static_cast<double>(top), static_cast<double>(left),
                    static_cast<double>(height), static_cast<double>(width), out_h, out_w);
}

Tensor resize_box(const Tensor& in, double top_f, double left_f, double height_f, double width_f,
                  std::int64_t out_h, std::int64_t out_w) {
  const std::int64_t h = in.shape()[0], w = in.shape()[1], c = in.shape()[2];
  const auto* src = static_cast<const std::uint8_t*>(in.data());
  Tensor out(DType::kUInt8, Shape{out_h, out_w, c});
  auto* dst = static_cast<std::uint8_t*>(out.data());
  // The pixels the region touches, within the image.
  auto pixel = [](double v, std::int64_t lo, std::int64_t hi, bool up) {
    return std::clamp(static_cast<std::int64_t>(up ? std::ceil(v) : std::floor(v)), lo, hi);
  };
  const std::int64_t x0 = pixel(left_f, 0, w - 1, false);
  const std::int64_t x1 = pixel(left_f + width_f, x0 + 1, w, true);
  const std::int64_t top = pixel(top_f, 0, h - 1, false);
  const std::int64_t height = pixel(top_f + height_f, top + 1, h, true) - top;
  const Taps tx = make_taps(left_f, width_f, x0, x1, out_w);
  const Taps ty = make_taps(top_f, height_f, top, top + height, out_h);
  // Horizontal pass over the rows the vertical taps read: [height, out_w, c] floats.
  const auto row = static_cast<std::size_t>(out_w * c);
  // The intermediate rows (about a megabyte for an ImageNet crop) are a per-thread scratch
  // buffer: a fresh one per image would be fresh pages, faulted in by the kernel every time.
  thread_local std::vector<float> mid;
  // One float of slack: the RGB path stores four lanes per pixel, the fourth overwritten next.
  mid.resize(static_cast<std::size_t>(height) * row + 1);
  const std::uint8_t* src_end = src + h * w * c;
  for (std::int64_t y = 0; y < height; ++y) {
    const std::uint8_t* in_row = src + (top + y) * w * c;
    float* m = mid.data() + static_cast<std::size_t>(y) * row;
    if (c == 3) {
      horizontal_rgb(in_row, src_end, tx, out_w, m);
      continue;
    }
    for (std::int64_t x = 0; x < out_w; ++x) {
      const auto xi = static_cast<std::size_t>(x);
      const float* wt = &tx.weights[xi * tx.stride];
      const std::uint8_t* px = in_row + tx.first[xi] * c;
      for (std::int64_t ch = 0; ch < c; ++ch) {
        float acc = 0;
        for (std::int32_t k = 0; k < tx.count[xi]; ++k) acc += wt[k] * px[k * c + ch];
        m[x * c + ch] = acc;
      }
    }
  }
  // Vertical pass, a row at a time: each value accumulated over the taps in k order from 0,
  // then rounded and clamped (with SSE2, four values per vector, the same arithmetic).
  for (std::int64_t y = 0; y < out_h; ++y) {
    const auto yi = static_cast<std::size_t>(y);
    const float* wt = &ty.weights[yi * ty.stride];
    const std::int32_t n = ty.count[yi];
    const float* m0 = mid.data() + static_cast<std::size_t>(ty.first[yi] - top) * row;
    std::uint8_t* o = dst + y * static_cast<std::int64_t>(row);
    std::size_t i = 0;
#if defined(__SSE2__)
    const __m128 half = _mm_set1_ps(0.5f), lo = _mm_setzero_ps(), hi = _mm_set1_ps(255.0f);
    auto rounded = [&](std::size_t at) {
      __m128 sum = _mm_setzero_ps();
      for (std::int32_t k = 0; k < n; ++k)
        sum =
            _mm_add_ps(sum, _mm_mul_ps(_mm_set1_ps(wt[k]),
                                       _mm_loadu_ps(m0 + static_cast<std::size_t>(k) * row + at)));
      return _mm_cvttps_epi32(_mm_max_ps(_mm_min_ps(_mm_add_ps(sum, half), hi), lo));
    };
    for (; i + 16 <= row; i += 16) {
      const __m128i a = _mm_packs_epi32(rounded(i), rounded(i + 4));
      const __m128i b = _mm_packs_epi32(rounded(i + 8), rounded(i + 12));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i), _mm_packus_epi16(a, b));
    }
#endif
    for (; i < row; ++i) {
      float sum = 0;
      for (std::int32_t k = 0; k < n; ++k) sum += wt[k] * m0[static_cast<std::size_t>(k) * row + i];
      o[i] = static_cast<std::uint8_t>(std::clamp(sum + 0.5f, 0.0f, 255.0f));
    }
  }
  return out;
}

std::vector<TransformSchema> image_transforms() {
  std::vector<TransformSchema> out;
  out.push_back(resize_transform());
  out.push_back(center_crop_transform());
  out.push_back(random_resized_crop_transform());
  out.push_back(flip_transform());
  out.push_back(normalize_image_transform());
  return out;
}

}  // namespace flowstate
