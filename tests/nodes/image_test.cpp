// decode_image (nodes/decode_image.h), the codecs (nodes/image_codec.h) and the image
// transforms (nodes/image_transforms.h). The pixel check against PIL is
// tests/python/test_images.py.
#include "flowstate/nodes/decode_image.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include "flowstate/config/inspect.h"
#include "flowstate/config/yaml.h"
#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"
#include "flowstate/nodes/image_codec.h"
#include "flowstate/nodes/image_transforms.h"
#include "flowstate/nodes/sources/tar.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

/// A small synthetic JPEG (sides 24..48) and its pixels.
std::string small_jpeg(std::uint64_t i, RgbImage* pixels = nullptr) {
  RgbImage img = synthetic_image(3, i, 24, 48);
  std::string jpeg = encode_jpeg(img.pixels, img.width, img.height, 95);
  if (pixels != nullptr) *pixels = std::move(img);
  return jpeg;
}

/// The offset of the first SOF0 marker's height field in a baseline JPEG.
std::size_t sof_dims(const std::string& jpeg) {
  for (std::size_t i = 2; i + 9 < jpeg.size(); ++i)
    if (static_cast<unsigned char>(jpeg[i]) == 0xff &&
        static_cast<unsigned char>(jpeg[i + 1]) == 0xc0)
      return i + 5;
  ADD_FAILURE() << "no SOF0";
  return 0;
}

std::string with_dims(std::string jpeg, unsigned height, unsigned width) {
  const std::size_t at = sof_dims(jpeg);
  jpeg[at] = static_cast<char>(height >> 8);
  jpeg[at + 1] = static_cast<char>(height & 0xff);
  jpeg[at + 2] = static_cast<char>(width >> 8);
  jpeg[at + 3] = static_cast<char>(width & 0xff);
  return jpeg;
}

std::string decode_error(const std::string& bytes, ImageDecodeLimits limits = {}) {
  try {
    decode_image_bytes(as_bytes(bytes), limits);
  } catch (const ImageError& e) {
    return e.what();
  }
  return "(decoded)";
}

TEST(ImageCodec, DecodesAJpegToRgbHwcCloseToItsPixels) {
  RgbImage img;
  const std::string jpeg = small_jpeg(1, &img);
  ASSERT_EQ(sniff_image(as_bytes(jpeg)), ImageFormat::kJpeg);
  const Tensor t = decode_image_bytes(as_bytes(jpeg), {});
  EXPECT_EQ(t.dtype(), DType::kUInt8);
  EXPECT_EQ(t.shape(), (Shape{img.height, img.width, 3}));
  // Lossy at quality 95: close on average to what was encoded.
  const auto* p = static_cast<const std::uint8_t*>(t.data());
  double diff = 0;
  for (std::size_t i = 0; i < img.pixels.size(); ++i) diff += std::abs(p[i] - img.pixels[i]);
  EXPECT_LT(diff / static_cast<double>(img.pixels.size()), 8.0);
}

TEST(ImageCodec, DownscalesAJpegWhileDecoding) {
  RgbImage img = synthetic_image(3, 5, 300, 400);
  const std::string jpeg = encode_jpeg(img.pixels, img.width, img.height, 90);
  const auto [h, w] = jpeg_scaled_size(img.height, img.width, 100);
  EXPECT_GE(std::min(h, w), 100);
  EXPECT_LT(static_cast<std::int64_t>(h) * w, static_cast<std::int64_t>(img.height) * img.width);
  // The next smaller factor would go below 100 on the shorter side.
  const int shorter = std::min(img.height, img.width);
  EXPECT_LT((shorter * (8 * std::min(h, w) / shorter - 1) + 7) / 8, 100);
  const Tensor t = decode_image_bytes(as_bytes(jpeg), {.min_size = 100});
  EXPECT_EQ(t.shape(), (Shape{h, w, 3}));
  // An image already below min_size decodes at full size.
  EXPECT_EQ(jpeg_scaled_size(50, 60, 100), (std::pair<int, int>{50, 60}));
  EXPECT_EQ(jpeg_scaled_size(800, 600, 0), (std::pair<int, int>{800, 600}));
  EXPECT_EQ(jpeg_scaled_size(800, 600, 224), (std::pair<int, int>{300, 225}));  // 3/8
}

TEST(ImageCodec, RefusesBadImagesWithTheirReason) {
  const std::string jpeg = small_jpeg(2);
  EXPECT_THAT(decode_error("<html>hello</html>"),
              HasSubstr("not a JPEG or PNG image (18 bytes starting 3c 68 74 6d 6c 3e 68 65)"));
  EXPECT_EQ(decode_error(""), "not an image: 0 bytes");
  EXPECT_THAT(decode_error(jpeg.substr(0, jpeg.size() / 2)), HasSubstr("bad JPEG data"));
  EXPECT_THAT(decode_error(jpeg.substr(0, 40)), HasSubstr("JPEG"));
  EXPECT_THAT(decode_error(with_dims(jpeg, 0, 0)), HasSubstr("not a valid JPEG"));
  EXPECT_EQ(decode_error(with_dims(jpeg, 30000, 30000)),
            "a JPEG of 30000x30000 pixels exceeds max_pixels (100000000)");
  EXPECT_THAT(decode_error(jpeg, {.max_pixels = 100}),
              HasSubstr("pixels exceeds max_pixels (100)"));
  // A failed decode leaves the thread's decoder usable.
  EXPECT_EQ(decode_error(jpeg), "(decoded)");
  const std::string png_signature = "\x89PNG\r\n\x1a\n";
  EXPECT_THAT(decode_error(png_signature + "garbage"), HasSubstr("not a valid PNG"));
  EXPECT_THAT(decode_error(png_signature), HasSubstr("truncated PNG data"));
}

// ---- crop-only decoding ----

/// The box decode at scale m/8 of `box`: out sizes that make decode_image_box pick exactly m.
DecodedBox box_at_scale(const std::string& jpeg, CropBox box, int m) {
  const std::int64_t oh = box.height * m / 8, ow = box.width * m / 8;
  DecodedBox d = decode_image_box(
      as_bytes(jpeg), {}, [&](std::int64_t, std::int64_t) { return box; }, oh, ow);
  EXPECT_EQ(d.scale_num, m);
  return d;
}

TEST(ImageCodec, ACropDecodeEqualsTheWholeScaledDecodeInsideTheBox) {
  // libjpeg's skip and crop change nothing inside the box: the rows and columns decoded equal
  // those of the whole image decoded at the same scale, for every scale and many boxes.
  for (std::uint64_t i = 0; i < 4; ++i) {
    RgbImage img = synthetic_image(7, i, 300, 500);
    const std::string jpeg = encode_jpeg(img.pixels, img.width, img.height, 90);
    ElementRng rng(1, i);
    for (int m = 1; m <= 8; ++m) {
      const DecodedBox whole = box_at_scale(jpeg, {0, 0, img.height, img.width}, m);
      ASSERT_EQ(whole.pixels.shape()[0], (img.height * m + 7) / 8);
      const std::int64_t ww = whole.pixels.shape()[1];
      for (int k = 0; k < 6; ++k) {
        CropBox box;
        box.height =
            64 + static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(img.height - 64)));
        box.width =
            64 + static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(img.width - 64)));
        box.top = static_cast<std::int64_t>(
            rng.below(static_cast<std::uint64_t>(img.height - box.height + 1)));
        box.left = static_cast<std::int64_t>(
            rng.below(static_cast<std::uint64_t>(img.width - box.width + 1)));
        const DecodedBox d = box_at_scale(jpeg, box, m);
        const double s = m / 8.0;
        EXPECT_DOUBLE_EQ(d.height, static_cast<double>(box.height) * s);
        const auto y0 =
            static_cast<std::int64_t>(std::llround(static_cast<double>(box.top) * s - d.top));
        const auto x0 =
            static_cast<std::int64_t>(std::llround(static_cast<double>(box.left) * s - d.left));
        // The decoded part covers the box.
        ASSERT_GE(d.top, 0.0);
        ASSERT_GE(d.left, 0.0);
        ASSERT_LE(d.top + d.height, static_cast<double>(d.pixels.shape()[0]) + 1e-9);
        ASSERT_LE(d.left + d.width, static_cast<double>(d.pixels.shape()[1]) + 1e-9);
        const auto* a = static_cast<const std::uint8_t*>(d.pixels.data());
        const auto* b = static_cast<const std::uint8_t*>(whole.pixels.data());
        const std::int64_t rw = d.pixels.shape()[1];
        // Every pixel the box touches equals the whole decode's.
        std::int64_t differ = 0;
        const auto ty = static_cast<std::int64_t>(std::floor(d.top));
        const auto tx = static_cast<std::int64_t>(std::floor(d.left));
        const auto ey = static_cast<std::int64_t>(std::ceil(d.top + d.height));
        const auto ex = static_cast<std::int64_t>(std::ceil(d.left + d.width));
        for (std::int64_t y = ty; y < ey; ++y)
          differ += std::memcmp(a + (y * rw + tx) * 3, b + ((y0 + y) * ww + x0 + tx) * 3,
                                static_cast<std::size_t>((ex - tx) * 3)) != 0;
        EXPECT_EQ(differ, 0) << "image " << i << " scale " << m << "/8 box " << box.top << ","
                             << box.left << " " << box.height << "x" << box.width;
      }
    }
  }
}

TEST(ImageCodec, ACropDecodeDiffersFromDecodingWholeThenCroppingOnlyByTheScaledIdct) {
  // The fused crop (the box decoded at M/8, then resized to 224) against the reference (the
  // whole image decoded at full size, the box cropped and resized to 224): the pixel
  // difference docs/DECISIONS.md quotes. 300-800 px images, torchvision's default ranges.
  double sum = 0, count = 0, worst_mean = 0;
  int worst = 0;
  std::map<int, int> scales;
  for (std::uint64_t i = 0; i < 40; ++i) {
    RgbImage img = synthetic_image(9, i, 300, 800);
    const std::string jpeg = encode_jpeg(img.pixels, img.width, img.height, 90);
    ElementRng rng(3, i);
    CropBox box;
    const DecodedBox d = decode_image_box(
        as_bytes(jpeg), {},
        [&](std::int64_t h, std::int64_t w) {
          return box = random_resized_crop_box(h, w, CropRange{}, rng);
        },
        224, 224);
    ++scales[d.scale_num];
    const Tensor fused = resize_box(d.pixels, d.top, d.left, d.height, d.width, 224, 224);
    const Tensor reference = resize_region(decode_image_bytes(as_bytes(jpeg), {}), box.top,
                                           box.left, box.height, box.width, 224, 224);
    const auto f = fused.values<std::uint8_t>();
    const auto r = reference.values<std::uint8_t>();
    double image_sum = 0;
    for (std::size_t k = 0; k < f.size(); ++k) {
      const int diff = std::abs(static_cast<int>(f[k]) - static_cast<int>(r[k]));
      image_sum += diff;
      worst = std::max(worst, diff);
    }
    sum += image_sum;
    count += static_cast<double>(f.size());
    worst_mean = std::max(worst_mean, image_sum / static_cast<double>(f.size()));
  }
  std::string used;
  for (auto [m, n] : scales) used += " " + std::to_string(m) + "/8: " + std::to_string(n);
  std::cout << "fused crop vs whole decode + crop: mean |diff| " << sum / count
            << ", worst image mean " << worst_mean << ", max " << worst << "; scales" << used
            << "\n";
  EXPECT_GT(scales.size(), 1u);  // the boxes were decoded at several scales
  EXPECT_LT(sum / count, 1.5);
  EXPECT_LT(worst_mean, 3.0);
}

TEST(ImageCodec, ACropDecodeRefusesBadImagesAsTheWholeDecodeDoes) {
  const RgbImage img = synthetic_image(3, 1, 200, 300);
  const std::string jpeg = encode_jpeg(img.pixels, img.width, img.height, 90);
  auto error = [](const std::string& bytes) -> std::string {
    try {
      decode_image_box(
          as_bytes(bytes), {},
          [](std::int64_t h, std::int64_t w) {
            return CropBox{0, 0, std::min<std::int64_t>(h, 16), std::min<std::int64_t>(w, 16)};
          },
          16, 16);
    } catch (const ImageError& e) {
      return e.what();
    }
    return "(decoded)";
  };
  EXPECT_EQ(error(jpeg), "(decoded)");
  // Truncated below the box (the box is the top-left corner): still refused.
  EXPECT_THAT(error(jpeg.substr(0, jpeg.size() * 3 / 4)), HasSubstr("bad JPEG data"));
  EXPECT_THAT(error(jpeg.substr(0, 40)), HasSubstr("JPEG"));
  EXPECT_THAT(error(with_dims(jpeg, 0, 0)), HasSubstr("not a valid JPEG"));
  EXPECT_EQ(error(with_dims(jpeg, 30000, 30000)),
            "a JPEG of 30000x30000 pixels exceeds max_pixels (100000000)");
  EXPECT_THAT(error("<html>hello</html>"), HasSubstr("not a JPEG or PNG image"));
  EXPECT_EQ(error(jpeg), "(decoded)");
}

// ---- the node in pipelines ----

/// `n` samples of small JPEGs and labels in one tar; the samples in `bad` hold bytes that are
/// not an image.
std::string write_image_tar(const TempDir& dir, std::uint64_t n, std::set<std::uint64_t> bad = {}) {
  std::string tar;
  for (std::uint64_t i = 0; i < n; ++i) {
    char key[16];
    std::snprintf(key, sizeof(key), "%06llu", static_cast<unsigned long long>(i));
    append_tar_member(tar, std::string(key) + ".jpg",
                      bad.count(i) != 0 ? std::string("not an image") : small_jpeg(i));
    append_tar_member(tar, std::string(key) + ".cls", std::to_string(i % 10));
  }
  append_tar_end(tar);
  const std::string path = dir / "images.tar";
  std::ofstream(path, std::ios::binary).write(tar.data(), static_cast<std::streamsize>(tar.size()));
  return path;
}

std::string augment_yaml(const std::string& tar, const std::string& on_error) {
  return "seed: 11\nsource: {type: tar, paths: \"" + tar +
         "\", fields: [jpg, cls]}\n"
         "nodes:\n"
         "  - shuffle: {mode: global}\n"
         "  - decode_image: {min_size: 20, on_error: " +
         on_error +
         "}\n"
         "  - map: {fn: random_resized_crop, size: [16, 20]}\n"
         "  - map: {fn: flip}\n"
         "  - map: {fn: normalize_image}\n"
         "  - map: {fn: parse_int, field: cls}\n"
         "  - batch: {size: 4}\n";
}

TEST(DecodeImage, AugmentedBatchesStackToBatchChannelsHeightWidth) {
  TempDir dir;
  const std::string tar = write_image_tar(dir, 10);
  Loader l(from_yaml_string(augment_yaml(tar, "error")), {.epochs = 1});
  std::size_t samples = 0;
  while (auto b = l.next()) {
    const Tensor& x = (*b)["jpg"];
    EXPECT_EQ(x.dtype(), DType::kFloat32);
    EXPECT_EQ(x.shape(), (Shape{static_cast<std::int64_t>(b->info.num_samples), 3, 16, 20}));
    const Tensor& y = (*b)["cls"];
    EXPECT_EQ(y.dtype(), DType::kInt64);
    for (std::size_t i = 0; i < b->info.refs.size(); ++i)
      EXPECT_EQ(y.values<std::int64_t>()[i], static_cast<std::int64_t>(b->info.refs[i].index % 10));
    samples += b->info.num_samples;
  }
  EXPECT_EQ(samples, 10u);
}

TEST(DecodeImage, ABadImageIsADataErrorNamingTheRecordAndField) {
  TempDir dir;
  const std::string tar = write_image_tar(dir, 6, {4});
  Loader l(from_yaml_string(augment_yaml(tar, "error")), {.epochs = 1});
  try {
    while (l.next()) {
    }
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_THAT(e.what(), HasSubstr("node 'decode_image': field 'jpg' of record 0:4: not a JPEG "
                                    "or PNG "
                                    "image (12 bytes starting 6e 6f 74 20 61 6e 20 69)"));
  }
}

TEST(DecodeImage, SkipsBadImagesWhenToldAndTheyLeaveTheProvenance) {
  TempDir dir;
  const std::set<std::uint64_t> bad{1, 4, 7};
  const std::string tar = write_image_tar(dir, 12, bad);
  Loader l(from_yaml_string(augment_yaml(tar, "skip")), {.epochs = 2});
  std::multiset<std::uint64_t> seen;
  std::size_t batches = 0;
  while (auto b = l.next()) {
    ++batches;
    for (const Ref& r : b->info.refs) seen.insert(r.index);
    EXPECT_EQ((*b)["jpg"].shape()[0], static_cast<std::int64_t>(b->info.num_samples));
  }
  EXPECT_EQ(seen.size(), 18u);  // 9 good images, 2 epochs
  EXPECT_EQ(batches, 6u);       // batches of 4, 4, 1 per epoch: the skip happens in the spine
  for (auto i : bad) EXPECT_EQ(seen.count(i), 0u) << i;
}

TEST(DecodeImage, CountsWhatItSkippedInItsState) {
  TempDir dir;
  const std::string tar = write_image_tar(dir, 12, {1, 4, 7});
  Loader l(from_yaml_string(augment_yaml(tar, "skip")), {.epochs = 1});
  while (l.next()) {
  }
  const std::string state = describe_state(l.state(), StateSource{});
  EXPECT_THAT(state, ::testing::ContainsRegex("\"dropped\": ?3[,}]")) << state;
}

TEST(DecodeImage, PassesTheSaveRestoreOracleFromOneWorkerToTwo) {
  TempDir dir;
  const std::string tar = write_image_tar(dir, 14, {5});
  for (const char* on_error : {"error", "skip"}) {
    // The error pipeline reads the good records only (records 0..4 and 6..13 are good, but a
    // shuffle reaches record 5): it has its own tar.
    TempDir good;
    const std::string path = std::string(on_error) == "skip" ? tar : write_image_tar(good, 14);
    auto make = [&] { return from_yaml_string(augment_yaml(path, on_error)); };
    testing::expect_save_restore(make, {.epochs = 2, .workers = 1}, {.epochs = 2, .workers = 2});
    testing::expect_save_restore(make, {.epochs = 2, .workers = 2}, {.epochs = 2, .workers = 1});
  }
}

TEST(DecodeImage, TheCppBuilderFormEqualsTheYamlForm) {
  TempDir dir;
  const std::string tar = write_image_tar(dir, 8);
  auto digests = [](Pipeline p) {
    std::vector<std::uint64_t> out;
    Loader l(std::move(p), {.epochs = 1});
    while (auto b = l.next()) out.push_back(b->digest());
    return out;
  };
  Pipeline::Builder b;
  b.seed(11)
      .tar({.paths = {tar}, .fields = {"jpg"}})
      .add(decode_image_node(), DecodeImageOptions{.min_size = 20})
      .batch({.size = 1});
  const std::string yaml = "seed: 11\nsource: {type: tar, paths: \"" + tar +
                           "\", fields: [jpg]}\nnodes:\n  - decode_image: {min_size: 20}\n"
                           "  - batch: {size: 1}\n";
  EXPECT_EQ(digests(b.build()), digests(from_yaml_string(yaml)));
}

TEST(DecodeImage, RefusesBadOptionsAtBuildTime) {
  try {
    from_yaml_string(
        "source: {type: records, paths: x, record_bytes: 8}\nnodes:\n"
        "  - decode_image: {on_error: ignore}\n  - batch: {size: 1}\n");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("on_error"));
    EXPECT_THAT(e.what(), HasSubstr("error, skip"));
  }
}

// ---- bad images in the node ----

/// A tar of `n` small JPEGs where the samples in `replace` hold the given bytes instead.
std::string write_tar_with(const TempDir& dir, std::uint64_t n,
                           const std::map<std::uint64_t, std::string>& replace) {
  std::string tar;
  for (std::uint64_t i = 0; i < n; ++i) {
    char key[16];
    std::snprintf(key, sizeof(key), "%06llu", static_cast<unsigned long long>(i));
    auto it = replace.find(i);
    append_tar_member(tar, std::string(key) + ".jpg",
                      it != replace.end() ? it->second : small_jpeg(i));
    append_tar_member(tar, std::string(key) + ".cls", std::to_string(i % 10));
  }
  append_tar_end(tar);
  const std::string path = dir / "bad.tar";
  std::ofstream(path, std::ios::binary).write(tar.data(), static_cast<std::streamsize>(tar.size()));
  return path;
}

/// The bad images issue 24 names, with what their error says.
std::vector<std::pair<std::string, std::string>> bad_images() {
  const std::string jpeg = small_jpeg(2);
  return {{jpeg.substr(0, jpeg.size() / 2), "bad JPEG data"},
          {"not an image", "not a JPEG or PNG image (12 bytes"},
          {with_dims(jpeg, 0, 0), "not a valid JPEG"},
          {with_dims(jpeg, 30000, 30000), "a JPEG of 30000x30000 pixels exceeds max_pixels"}};
}

std::string decode_yaml(const std::string& tar, const std::string& decode) {
  return "seed: 11\nsource: {type: tar, paths: \"" + tar +
         "\", fields: [jpg, cls]}\nnodes:\n  - decode_image: " + decode +
         "\n  - map: {fn: center_crop, size: 8}\n  - map: {fn: parse_int, field: cls}\n"
         "  - batch: {size: 3}\n";
}

TEST(DecodeImage, EachKindOfBadImageIsADataErrorOrSkippedAndCounted) {
  const std::vector<std::string> decodes = {"{min_size: 20", "{random_resized_crop: [16, 20]"};
  for (const auto& [bytes, reason] : bad_images())
    for (const auto& decode : decodes) {
      SCOPED_TRACE(reason + " / " + decode);
      TempDir dir;
      const std::string tar = write_tar_with(dir, 7, {{3, bytes}});
      try {
        Loader l(from_yaml_string(decode_yaml(tar, decode + "}")), {.epochs = 1});
        while (l.next()) {
        }
        ADD_FAILURE() << "no error";
      } catch (const DataError& e) {
        EXPECT_THAT(e.what(),
                    HasSubstr("node 'decode_image': field 'jpg' of record 0:3: " + reason));
      }
      Loader l(from_yaml_string(decode_yaml(tar, decode + ", on_error: skip}")), {.epochs = 1});
      std::set<std::uint64_t> seen;
      while (auto b = l.next())
        for (const Ref& r : b->info.refs) seen.insert(r.index);
      EXPECT_EQ(seen, (std::set<std::uint64_t>{0, 1, 2, 4, 5, 6}));
      const std::string state = describe_state(l.state(), StateSource{});
      EXPECT_THAT(state, ::testing::ContainsRegex("\"dropped\": ?1[,}]")) << state;
    }
}

// ---- the fused crop ----

TEST(DecodeImage, TheFusedCropMakesImagesOfItsSizeAndResumesExactly) {
  TempDir dir;
  const std::string tar = write_image_tar(dir, 14, {5});
  auto yaml = [&](const std::string& on_error) {
    return "seed: 11\nsource: {type: tar, paths: \"" + tar +
           "\", fields: [jpg, cls]}\nnodes:\n  - shuffle: {mode: global}\n"
           "  - decode_image: {random_resized_crop: [16, 20], scale_min: 0.3, on_error: " +
           on_error +
           "}\n  - map: {fn: flip}\n  - map: {fn: normalize_image}\n"
           "  - map: {fn: parse_int, field: cls}\n  - batch: {size: 4}\n";
  };
  Loader l(from_yaml_string(yaml("skip")), {.epochs = 1});
  std::size_t samples = 0;
  while (auto b = l.next()) {
    EXPECT_EQ((*b)["jpg"].shape(),
              (Shape{static_cast<std::int64_t>(b->info.num_samples), 3, 16, 20}));
    samples += b->info.num_samples;
  }
  EXPECT_EQ(samples, 13u);
  auto make = [&] { return from_yaml_string(yaml("skip")); };
  testing::expect_save_restore(make, {.epochs = 2, .workers = 1}, {.epochs = 2, .workers = 2});
  testing::expect_save_restore(make, {.epochs = 2, .workers = 2}, {.epochs = 2, .workers = 1});
}

TEST(DecodeImage, TheFusedCropsOptionsAreChecked) {
  auto error = [](const std::string& decode) -> std::string {
    try {
      from_yaml_string(
          "source: {type: records, paths: x, record_bytes: 8}\nnodes:\n"
          "  - decode_image: " +
          decode + "\n  - batch: {size: 1}\n");
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "(built)";
  };
  EXPECT_THAT(error("{random_resized_crop: 224, min_size: 224}"),
              HasSubstr("min_size and random_resized_crop cannot both be set"));
  EXPECT_THAT(error("{random_resized_crop: 224, scale_min: 0.9, scale_max: 0.5}"),
              HasSubstr("scale_min (0.900000) is greater than scale_max (0.500000)"));
  EXPECT_THAT(error("{random_resized_crop: [0]}"), HasSubstr("sides must be between 1 and 65536"));
  EXPECT_THAT(error("{random_resized_crop: [1, 2, 3]}"), HasSubstr("one size or [height, width]"));
}

// ---- transforms ----

/// A transform's per-sample function from YAML-like parameters.
SampleFn transform(const std::string& name,
                   std::vector<std::pair<std::string, ParamValue>> values = {}) {
  for (auto& t : image_transforms())
    if (t.name == name) {
      // Defaults as YAML fills them in.
      for (const auto& row : t.params)
        if (row.default_value && std::none_of(values.begin(), values.end(),
                                              [&](const auto& v) { return v.first == row.name; }))
          values.emplace_back(row.name, *row.default_value);
      return t.make_sample(Params(name, std::move(values)));
    }
  ADD_FAILURE() << name;
  return {};
}

Sample image_sample(std::int64_t h, std::int64_t w, std::uint64_t seed = 1) {
  Sample s;
  s.ref = Ref{.source = 0, .shard = 0, .index = seed};
  Tensor t(DType::kUInt8, Shape{h, w, 3});
  auto v = t.values<std::uint8_t>();
  ElementRng rng(seed, 0, 0);
  for (auto& x : v) x = static_cast<std::uint8_t>(rng.below(256));
  s.set("jpg", t);
  return s;
}

std::vector<std::uint8_t> pixels(const Sample& s) {
  auto v = s.at("jpg").values<std::uint8_t>();
  return {v.begin(), v.end()};
}

TEST(ImageTransforms, FlipMirrorsWithProbabilityP) {
  Sample s = image_sample(3, 5);
  const Tensor in = s.at("jpg");
  MapContext ctx{0, ElementRng(1, 2)};
  transform("flip", {{"p", 1.0}})(s, ctx);
  const Tensor& out = s.at("jpg");
  for (std::int64_t y = 0; y < 3; ++y)
    for (std::int64_t x = 0; x < 5; ++x)
      for (std::int64_t c = 0; c < 3; ++c)
        EXPECT_EQ(out.values<std::uint8_t>()[(y * 5 + x) * 3 + c],
                  in.values<std::uint8_t>()[(y * 5 + 4 - x) * 3 + c]);
  Sample t = image_sample(3, 5);
  const auto before = pixels(t);
  transform("flip", {{"p", 0.0}})(t, ctx);
  EXPECT_EQ(pixels(t), before);
  // p = 0.5: about half of many records are flipped.
  int flipped = 0;
  auto flip = transform("flip");
  for (std::uint64_t r = 0; r < 400; ++r) {
    Sample u = image_sample(1, 2, r);
    const auto b = pixels(u);
    MapContext c{0, ElementRng(9, r)};
    flip(u, c);
    flipped += pixels(u) != b ? 1 : 0;
  }
  EXPECT_GT(flipped, 150);
  EXPECT_LT(flipped, 250);
}

TEST(ImageTransforms, ResizeKeepsTheAspectRatioForOneSizeAndIsTheIdentityAtScaleOne) {
  Sample s = image_sample(40, 60);
  const auto before = pixels(s);
  MapContext ctx{0, ElementRng(1, 2)};
  transform("resize", {{"size", std::vector<std::int64_t>{40, 60}}})(s, ctx);
  EXPECT_EQ(pixels(s), before);
  transform("resize", {{"size", std::vector<std::int64_t>{20}}})(s, ctx);
  EXPECT_EQ(s.at("jpg").shape(), (Shape{20, 30, 3}));
  // Shrinking by 2 averages: a 2x2 block of one value stays that value.
  Sample flat;
  flat.ref = Ref{};
  Tensor t(DType::kUInt8, Shape{8, 8, 3});
  for (auto& x : t.values<std::uint8_t>()) x = 77;
  flat.set("jpg", t);
  transform("resize", {{"size", std::vector<std::int64_t>{4, 4}}})(flat, ctx);
  for (auto x : pixels(flat)) EXPECT_EQ(x, 77);
}

TEST(ImageTransforms, CenterCropRoundsAsTorchvisionAndPadsWithZeros) {
  Sample s = image_sample(5, 7);
  const Tensor in = s.at("jpg");
  MapContext ctx{0, ElementRng(1, 2)};
  transform("center_crop", {{"size", std::vector<std::int64_t>{2, 4}}})(s, ctx);
  // top = round(1.5) = 2, left = round(1.5) = 2 (ties to even).
  const auto out = pixels(s);
  for (std::int64_t y = 0; y < 2; ++y)
    for (std::int64_t x = 0; x < 4; ++x)
      for (std::int64_t c = 0; c < 3; ++c)
        EXPECT_EQ(out[static_cast<std::size_t>((y * 4 + x) * 3 + c)],
                  in.values<std::uint8_t>()[((y + 2) * 7 + x + 2) * 3 + c]);
  Sample small = image_sample(2, 2);
  transform("center_crop", {{"size", std::vector<std::int64_t>{4}}})(small, ctx);
  const auto padded = pixels(small);
  EXPECT_EQ(padded[0], 0);                                            // row 0 is padding
  EXPECT_EQ(padded[(1 * 4 + 1) * 3], pixels(image_sample(2, 2))[0]);  // (1, 1) is (0, 0)
}

TEST(ImageTransforms, RandomResizedCropFallsBackToTheCentreCropOfTheClampedRatio) {
  // Scale 1 and ratio 1 on a 2:1 image: no attempt fits (71 > 50), so the centre 50x50.
  Sample s = image_sample(50, 100);
  const Tensor in = s.at("jpg");
  MapContext ctx{0, ElementRng(1, 2)};
  transform("random_resized_crop", {{"size", std::vector<std::int64_t>{50}},
                                    {"scale_min", 1.0},
                                    {"ratio_min", 1.0},
                                    {"ratio_max", 1.0}})(s, ctx);
  const auto out = pixels(s);
  for (std::int64_t y = 0; y < 50; ++y)
    for (std::int64_t x = 0; x < 50; ++x)
      ASSERT_EQ(out[static_cast<std::size_t>((y * 50 + x) * 3)],
                in.values<std::uint8_t>()[(y * 100 + x + 25) * 3]);
}

TEST(ImageTransforms, RandomResizedCropDrawsFromTheRecordsGenerator) {
  auto crop = transform("random_resized_crop", {{"size", std::vector<std::int64_t>{8}}});
  auto run = [&](std::uint64_t record) {
    Sample s = image_sample(30, 40);
    MapContext ctx{0, ElementRng(5, record)};
    crop(s, ctx);
    EXPECT_EQ(s.at("jpg").shape(), (Shape{8, 8, 3}));
    return pixels(s);
  };
  EXPECT_EQ(run(1), run(1));
  EXPECT_NE(run(1), run(2));
}

TEST(ImageTransforms, NormalizeImageMakesChannelsFirstFloats) {
  Sample s = image_sample(2, 3);
  const Tensor in = s.at("jpg");
  MapContext ctx{0, ElementRng(1, 2)};
  transform("normalize_image")(s, ctx);
  const Tensor& out = s.at("jpg");
  EXPECT_EQ(out.dtype(), DType::kFloat32);
  EXPECT_EQ(out.shape(), (Shape{3, 2, 3}));
  const double mean[3] = {0.485, 0.456, 0.406}, sd[3] = {0.229, 0.224, 0.225};
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 6; ++i)
      EXPECT_FLOAT_EQ(
          out.values<float>()[c * 6 + i],
          static_cast<float>((in.values<std::uint8_t>()[i * 3 + c] / 255.0 - mean[c]) / sd[c]));
}

TEST(ImageTransforms, NormalizeImageToFloat16IsTheFloat32ValueRounded) {
  // Float16 element for element equal to the float32 output rounded to nearest even (numpy's
  // astype(float16) of it: tests/python/test_images.py); bfloat16 likewise; 1 and 3 channels.
  for (std::int64_t c : {3, 1}) {
    Sample s = image_sample(5, 7, 4);
    if (c == 1) {
      Tensor gray(DType::kUInt8, Shape{5, 7, 1});
      for (std::size_t i = 0; i < 35; ++i)
        gray.values<std::uint8_t>()[i] = s.at("jpg").values<std::uint8_t>()[i * 3];
      s.set("jpg", gray);
    }
    const std::vector<std::pair<std::string, ParamValue>> one{
        {"mean", std::vector<std::string>{"0.5"}}, {"std", std::vector<std::string>{"0.25"}}};
    auto with = [&](const char* dtype) {
      auto v = c == 1 ? one : std::vector<std::pair<std::string, ParamValue>>{};
      v.emplace_back("dtype", std::string(dtype));
      return v;
    };
    Sample f32 = s, f16 = s, bf16 = s;
    MapContext ctx{0, ElementRng(1, 2)};
    transform("normalize_image", c == 1 ? one : std::vector<std::pair<std::string, ParamValue>>{})(
        f32, ctx);
    transform("normalize_image", with("float16"))(f16, ctx);
    transform("normalize_image", with("bfloat16"))(bf16, ctx);
    ASSERT_EQ(f16.at("jpg").dtype(), DType::kFloat16);
    ASSERT_EQ(bf16.at("jpg").dtype(), DType::kBFloat16);
    ASSERT_EQ(f16.at("jpg").shape(), (Shape{c, 5, 7}));
    const auto want = f32.at("jpg").values<float>();
    const auto got = f16.at("jpg").values<Float16>();
    const auto got_bf = bf16.at("jpg").values<BFloat16>();
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i].bits, float16_bits(want[i])) << i;
      ASSERT_EQ(got_bf[i].bits, bfloat16_bits(want[i])) << i;
    }
  }
}

TEST(ImageTransforms, NormalizeImageDTypeIsCheckedAndFloat32KeepsTheFingerprint) {
  TempDir dir;
  const std::string tar = write_image_tar(dir, 2);
  auto yaml = [&](const std::string& normalize) {
    return "seed: 1\nsource: {type: tar, paths: \"" + tar +
           "\", fields: [jpg]}\nnodes:\n  - decode_image: {}\n  - map: {fn: normalize_image" +
           normalize + "}\n  - batch: {size: 1}\n";
  };
  EXPECT_EQ(from_yaml_string(yaml("")).fingerprint(),
            from_yaml_string(yaml(", dtype: float32")).fingerprint());
  EXPECT_NE(from_yaml_string(yaml("")).fingerprint(),
            from_yaml_string(yaml(", dtype: float16")).fingerprint());
  try {
    from_yaml_string(yaml(", dtype: int8"));
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("is not one of: float32, float16, bfloat16")) << e.what();
  }
}

TEST(DecodeImage, Float16BatchesStackToBatchChannelsHeightWidthAndResumeExactly) {
  TempDir dir;
  const std::string tar = write_image_tar(dir, 10);
  auto yaml = [&](const char* dtype) {
    std::string y = augment_yaml(tar, "error");
    const std::string from = "{fn: normalize_image}";
    y.replace(y.find(from), from.size(),
              std::string("{fn: normalize_image, dtype: ") + dtype + "}");
    return y;
  };
  Loader half(from_yaml_string(yaml("float16")), {.epochs = 1});
  Loader full(from_yaml_string(augment_yaml(tar, "error")), {.epochs = 1});
  std::size_t samples = 0;
  while (auto b = half.next()) {
    auto f = full.next();
    ASSERT_TRUE(f.has_value());
    const Tensor& x = (*b)["jpg"];
    EXPECT_EQ(x.dtype(), DType::kFloat16);
    EXPECT_EQ(x.shape(), (Shape{static_cast<std::int64_t>(b->info.num_samples), 3, 16, 20}));
    const auto want = (*f)["jpg"].values<float>();
    const auto got = x.values<Float16>();
    for (std::size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i].bits, float16_bits(want[i]));
    samples += b->info.num_samples;
  }
  EXPECT_EQ(samples, 10u);
  auto make = [&] { return from_yaml_string(yaml("float16")); };
  testing::expect_save_restore(make, {.epochs = 2, .workers = 1}, {.epochs = 2, .workers = 2});
}

TEST(ImageTransforms, ASampleThatIsNotADecodedImageIsADataError) {
  Sample s;
  s.ref = Ref{.source = 0, .shard = 0, .index = 3};
  s.set("jpg", Tensor(DType::kUInt8, Shape{10}));
  MapContext ctx{0, ElementRng(1, 2)};
  try {
    transform("flip")(s, ctx);
    FAIL();
  } catch (const DataError& e) {
    EXPECT_THAT(e.what(), HasSubstr("field 'jpg' of record 0:3 is uint8 [10], not a decoded "
                                    "image (uint8 [H, W, C]; see decode_image)"));
  }
}

TEST(ImageTransforms, AnRgbResizeEqualsEachChannelResizedAloneBitForBit) {
  // RGB rows take their own (SIMD) horizontal pass; one-channel images the generic loop. Both
  // must accumulate alike: every value equal, for integral and fractional boxes, shrinking
  // and enlarging, and boxes that reach the image's last pixel (where the vector load would
  // read past the end and the scalar path runs).
  const std::int64_t h = 37, w = 53;
  const Tensor rgb = image_sample(h, w, 7).at("jpg");
  std::vector<Tensor> planes;
  for (std::int64_t c = 0; c < 3; ++c) {
    Tensor p(DType::kUInt8, Shape{h, w, 1});
    for (std::int64_t i = 0; i < h * w; ++i)
      p.values<std::uint8_t>()[i] = rgb.values<std::uint8_t>()[i * 3 + c];
    planes.push_back(p);
  }
  struct Box {
    double top, left, height, width;
    std::int64_t oh, ow;
  };
  const Box boxes[] = {{0, 0, 37, 53, 12, 17},           {0, 0, 37, 53, 80, 90},
                       {3.25, 5.5, 20.5, 30.75, 9, 11},  {10, 20, 27, 33, 27, 33},
                       {30.5, 40.25, 6.5, 12.75, 5, 40}, {0, 52, 37, 1, 3, 3}};
  for (const Box& b : boxes) {
    const Tensor out = resize_box(rgb, b.top, b.left, b.height, b.width, b.oh, b.ow);
    for (std::int64_t c = 0; c < 3; ++c) {
      const Tensor one = resize_box(planes[static_cast<std::size_t>(c)], b.top, b.left, b.height,
                                    b.width, b.oh, b.ow);
      for (std::int64_t i = 0; i < b.oh * b.ow; ++i)
        ASSERT_EQ(out.values<std::uint8_t>()[i * 3 + c], one.values<std::uint8_t>()[i])
            << "box " << b.top << "," << b.left << " channel " << c << " value " << i;
    }
  }
}

TEST(DecodeImage, NormalizedImagesWrittenIntoTheBatchEqualCopiedOnes) {
  // With stacking, normalize_image writes into the batch's memory (BatchSlots); padding
  // another field turns that off. The batches are the same either way.
  TempDir dir;
  const std::string tar = write_image_tar(dir, 10);
  const std::string yaml = augment_yaml(tar, "error");
  auto batches = [&](const std::string& y) {
    std::vector<std::vector<float>> out;
    Loader l(from_yaml_string(y), {.epochs = 1});
    while (auto b = l.next()) {
      auto v = (*b)["jpg"].values<float>();
      out.emplace_back(v.begin(), v.end());
    }
    return out;
  };
  const std::string padded = std::string(yaml).replace(
      yaml.find("batch: {size: 4}"), 16, "batch: {size: 4, collate: pad, fields: [cls]}");
  const auto stacked = batches(yaml);
  EXPECT_EQ(stacked.size(), 3u);
  EXPECT_EQ(stacked, batches(padded));
}

}  // namespace
}  // namespace flowstate
