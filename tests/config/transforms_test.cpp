// The built-in map transforms: values, views, error texts, and random_crop's determinism
// across worker counts and restores.
#include "flowstate/config/transforms.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "flowstate/config/yaml.h"
#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::TempDir;

Params params(std::vector<std::pair<std::string, ParamValue>> values) {
  values.emplace(values.begin(), "field", std::string("data"));
  return Params("t", std::move(values));
}

SampleFn sample_fn(const std::string& name, const Params& p) {
  const TransformSchema* t = TransformRegistry::builtin().find(name);
  EXPECT_NE(t, nullptr) << name;
  return t->make_sample(p);
}

template <class T>
Tensor tensor(std::vector<T> values, Shape shape) {
  Tensor t(dtype_of<T>(), shape);
  std::memcpy(t.data(), values.data(), values.size() * sizeof(T));
  return t;
}

template <class T>
std::vector<T> values(const Tensor& t) {
  auto v = t.values<T>();
  return {v.begin(), v.end()};
}

Sample run_fn(const SampleFn& fn, Tensor t, std::uint64_t index = 0) {
  Sample s;
  s.ref = {0, 0, index};
  s.set("data", std::move(t));
  MapContext ctx{0, ElementRng(1, index)};
  fn(s, ctx);
  return s;
}

std::string error_text(const SampleFn& fn, Tensor t) {
  try {
    run_fn(fn, std::move(t));
  } catch (const ConfigError& e) {
    return e.key() + " | " + e.what();
  } catch (const DataError& e) {
    return "DataError | " + std::string(e.what());
  }
  return "no error";
}

TEST(DecodeTransform, ReadsLittleEndianValuesWithoutCopying) {
  Tensor bytes = tensor<std::uint8_t>({1, 0, 2, 0, 0xff, 0xff, 0x34, 0x12}, Shape{8});
  Sample s = run_fn(sample_fn("decode", params({{"dtype", std::string("uint16")}})), bytes);
  const Tensor& t = s.at("data");
  EXPECT_EQ(t.shape(), Shape{4});
  EXPECT_EQ(values<std::uint16_t>(t), (std::vector<std::uint16_t>{1, 2, 0xffff, 0x1234}));
  EXPECT_EQ(t.buffer(), bytes.buffer());
}

TEST(DecodeTransform, InfersOneDimensionOfTheShape) {
  Tensor bytes = tensor<std::uint8_t>({1, 0, 2, 0, 3, 0, 4, 0}, Shape{8});
  Sample s = run_fn(sample_fn("decode", params({{"dtype", std::string("int16")},
                                                {"shape", std::vector<std::int64_t>{2, -1}}})),
                    bytes);
  EXPECT_EQ(s.at("data").shape(), (Shape{2, 2}));
  EXPECT_EQ(values<std::int16_t>(s.at("data")), (std::vector<std::int16_t>{1, 2, 3, 4}));
}

TEST(DecodeTransform, CopiesUnalignedBytes) {
  Tensor bytes = tensor<std::uint8_t>({9, 1, 0, 0, 0}, Shape{5});
  Tensor view(bytes.buffer(), 1, DType::kUInt8, Shape{4});  // odd address
  Sample s = run_fn(sample_fn("decode", params({{"dtype", std::string("uint32")}})), view);
  EXPECT_EQ(values<std::uint32_t>(s.at("data")), (std::vector<std::uint32_t>{1}));
}

TEST(DecodeTransform, AShapeThatDoesNotFitTheRecordIsAClearError) {
  Tensor bytes(DType::kUInt8, Shape{8});
  EXPECT_EQ(error_text(sample_fn("decode", params({{"dtype", std::string("uint16")},
                                                   {"shape", std::vector<std::int64_t>{3}}})),
                       bytes),
            "DataError | t.shape: field 'data' holds 8 bytes per sample, but uint16 [3] needs 6 "
            "bytes (in record 0:0)");
  EXPECT_EQ(error_text(sample_fn("decode", params({{"dtype", std::string("uint64")}})),
                       Tensor(DType::kUInt8, Shape{12})),
            "DataError | t.dtype: field 'data' holds 12 bytes per sample, not a multiple of the "
            "8-byte uint64 (in record 0:0)");
  EXPECT_EQ(error_text(sample_fn("decode", params({{"dtype", std::string("uint32")},
                                                   {"shape", std::vector<std::int64_t>{-1, 3}}})),
                       bytes),
            "DataError | t.shape: field 'data' holds 8 bytes per sample, but uint32 [-1, 3] "
            "cannot cover them evenly (in record 0:0)");
}

TEST(DecodeTransform, WorksOnWholeBatchesAfterBatch) {
  const TransformSchema* t = TransformRegistry::builtin().find("decode");
  BatchFn fn = t->make_batch(params({{"dtype", std::string("uint16")}}));
  Batch b;
  b.fields.set("data", tensor<std::uint8_t>({1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0}, Shape{3, 4}));
  MapContext ctx{0, ElementRng(1, 2)};
  fn(b, ctx);
  EXPECT_EQ(b["data"].shape(), (Shape{3, 2}));
  EXPECT_EQ(values<std::uint16_t>(b["data"]), (std::vector<std::uint16_t>{1, 2, 3, 4, 5, 6}));
}

TEST(CastTransform, SaturatesFloatsAndWrapsIntegers) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Sample s = run_fn(sample_fn("cast", params({{"dtype", std::string("int8")}})),
                    tensor<float>({1.7f, -2.9f, nan, 1e10f, -1e10f}, Shape{5}));
  EXPECT_EQ(s.at("data").dtype(), DType::kInt8);
  EXPECT_EQ(values<std::int8_t>(s.at("data")), (std::vector<std::int8_t>{1, -2, 0, 127, -128}));
  s = run_fn(sample_fn("cast", params({{"dtype", std::string("uint8")}})),
             tensor<std::uint16_t>({0, 300, 65535}, Shape{3}));
  EXPECT_EQ(values<std::uint8_t>(s.at("data")), (std::vector<std::uint8_t>{0, 44, 255}));
  s = run_fn(sample_fn("cast", params({{"dtype", std::string("bool")}})),
             tensor<std::int32_t>({0, 5, -1}, Shape{3}));
  EXPECT_EQ(values<bool>(s.at("data")), (std::vector<bool>{false, true, true}));
  s = run_fn(sample_fn("cast", params({{"dtype", std::string("float64")}})),
             tensor<std::uint8_t>({0, 200}, Shape{2, 1}));
  EXPECT_EQ(s.at("data").shape(), (Shape{2, 1}));
  EXPECT_EQ(values<double>(s.at("data")), (std::vector<double>{0.0, 200.0}));
}

TEST(CastTransform, ToFloat16RoundsToNearestEvenAndBackIsExact) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // 1 + 2^-11 is a tie (to even: 1), 65520 overflows, 2^-25 is half the smallest subnormal.
  const std::vector<float> in{
      1.0f, 1.0f + 0x1p-11f, 1.0f + 0x1.8p-10f, 65520.0f, -1e9f, 0x1p-25f, 0x1.8p-24f, -0.0f, nan,
      inf};
  Sample s = run_fn(sample_fn("cast", params({{"dtype", std::string("float16")}})),
                    tensor<float>(in, Shape{2, 5}));
  EXPECT_EQ(s.at("data").dtype(), DType::kFloat16);
  EXPECT_EQ(s.at("data").shape(), (Shape{2, 5}));
  std::vector<std::uint16_t> bits;
  for (Float16 h : s.at("data").values<Float16>()) bits.push_back(h.bits);
  EXPECT_EQ(bits, (std::vector<std::uint16_t>{0x3C00, 0x3C00, 0x3C02, 0x7C00, 0xFC00, 0x0000,
                                              0x0002, 0x8000, 0x7E00, 0x7C00}));
  // Back to float32, exactly; to integers as float32 values go (NaN -> 0, saturating).
  const Tensor half = s.at("data");
  s = run_fn(sample_fn("cast", params({{"dtype", std::string("float32")}})), half);
  const auto back = values<float>(s.at("data"));
  EXPECT_EQ(back[2], 1.0f + 0x1p-9f);
  EXPECT_EQ(back[6], 0x1p-23f);
  EXPECT_TRUE(std::isnan(back[8]));
  s = run_fn(sample_fn("cast", params({{"dtype", std::string("int16")}})), half);
  EXPECT_EQ(values<std::int16_t>(s.at("data")),
            (std::vector<std::int16_t>{1, 1, 1, 32767, -32768, 0, 0, 0, 0, 32767}));
  // From float64 in one rounding: 1 + 2^-11 + 2^-40 is above the tie (float would lose it).
  s = run_fn(sample_fn("cast", params({{"dtype", std::string("float16")}})),
             tensor<double>({1.0 + 0x1p-11 + 0x1p-40, 3.0}, Shape{2}));
  EXPECT_EQ(s.at("data").values<Float16>()[0].bits, 0x3C01);
  s = run_fn(sample_fn("cast", params({{"dtype", std::string("bfloat16")}})),
             tensor<std::int32_t>({1, -3, 257, 1 << 30}, Shape{4}));
  std::vector<float> bf;
  for (BFloat16 h : s.at("data").values<BFloat16>()) bf.push_back(h);
  EXPECT_EQ(bf, (std::vector<float>{1.0f, -3.0f, 256.0f, 1073741824.0f}));  // 257: tie to even
  s = run_fn(sample_fn("cast", params({{"dtype", std::string("bool")}})),
             tensor<Float16>({Float16(0.0), Float16(-0.0), Float16(0.5)}, Shape{3}));
  EXPECT_EQ(values<bool>(s.at("data")), (std::vector<bool>{false, false, true}));
}

TEST(NormalizeTransform, GivesFloat32) {
  Sample s = run_fn(sample_fn("normalize", params({{"mean", 127.5}, {"std", 127.5}})),
                    tensor<std::uint8_t>({0, 255, 51}, Shape{3}));
  EXPECT_EQ(s.at("data").dtype(), DType::kFloat32);
  auto v = values<float>(s.at("data"));
  EXPECT_FLOAT_EQ(v[0], -1.0f);
  EXPECT_FLOAT_EQ(v[1], 1.0f);
  EXPECT_FLOAT_EQ(v[2], -0.6f);
}

TEST(SliceTransform, KeepsAWindowOfTheFirstDimension) {
  std::vector<std::int16_t> rows;
  for (std::int16_t i = 0; i < 20; ++i) rows.push_back(i);
  Tensor in = tensor<std::int16_t>(rows, Shape{10, 2});
  Sample s = run_fn(
      sample_fn("slice", params({{"start", std::uint64_t{3}}, {"length", std::uint64_t{3}}})), in);
  EXPECT_EQ(s.at("data").shape(), (Shape{3, 2}));
  EXPECT_EQ(values<std::int16_t>(s.at("data")), (std::vector<std::int16_t>{6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(s.at("data").buffer(), in.buffer());  // a view
  EXPECT_EQ(
      error_text(
          sample_fn("slice", params({{"start", std::uint64_t{8}}, {"length", std::uint64_t{3}}})),
          in),
      "DataError | t.length: needs 11 rows, but field 'data' has shape [10, 2] in record 0:0");
  EXPECT_EQ(
      error_text(
          sample_fn("slice", params({{"start", std::uint64_t{0}}, {"length", std::uint64_t{1}}})),
          Tensor(DType::kUInt8, Shape{})),
      "DataError | t.field: field 'data' is a scalar in record 0:0; there is no dimension to cut");
}

TEST(Transforms, AMissingFieldNamesTheFieldsThereAre) {
  Params p("nodes[2].map", {{"field", std::string("tokens")}, {"dtype", std::string("int8")}},
           {{"", "p.yaml:6:5"}, {"field", "p.yaml:6:40"}});
  EXPECT_EQ(error_text(sample_fn("cast", p), Tensor(DType::kUInt8, Shape{2})),
            "nodes[2].map.field | p.yaml:6:40: nodes[2].map.field: no field 'tokens' to "
            "transform (the fields are: data)");
}

TEST(RandomCropTransform, StaysInBoundsAndVariesPerRecord) {
  std::vector<std::uint8_t> bytes(32);
  for (int i = 0; i < 32; ++i) bytes[i] = static_cast<std::uint8_t>(i);
  SampleFn fn = sample_fn("random_crop", params({{"length", std::uint64_t{5}}}));
  std::set<std::uint8_t> starts;
  for (std::uint64_t r = 0; r < 64; ++r) {
    Sample s = run_fn(fn, tensor<std::uint8_t>(bytes, Shape{32}), r);
    auto v = values<std::uint8_t>(s.at("data"));
    ASSERT_EQ(v.size(), 5u);
    for (std::size_t i = 1; i < v.size(); ++i) EXPECT_EQ(v[i], v[0] + i);
    EXPECT_LE(v[0], 27);
    starts.insert(v[0]);
    // The same element, the same crop.
    EXPECT_EQ(
        values<std::uint8_t>(run_fn(fn, tensor<std::uint8_t>(bytes, Shape{32}), r).at("data")), v);
  }
  EXPECT_GT(starts.size(), 10u);
}

std::string crop_pipeline(const std::string& glob) {
  return "seed: 11\n"
         "source: {type: records, paths: '" +
         glob +
         "', record_bytes: 64}\n"
         "nodes:\n"
         "  - shuffle: {mode: buffer, size: 50}\n"
         "  - map: {fn: random_crop, length: 24}\n"
         "  - map: {fn: normalize, mean: 3, std: 2}\n"
         "  - batch: {size: 16}\n";
}

TEST(RandomCropTransform, IsTheSameForAnyNumberOfWorkers) {
  TempDir dir;
  const std::string glob = testing::write_records(dir.str(), 300, 64, 3);
  auto run = [&](int workers) {
    Loader l(from_yaml_string(crop_pipeline(glob), "p.yaml"), {.epochs = 2, .workers = workers});
    return testing::drain(l);
  };
  const auto one = run(1);
  ASSERT_EQ(one.size(), 2u * 19u);
  EXPECT_EQ(run(4), one);
  EXPECT_EQ(run(2), one);
}

TEST(RandomCropTransform, ResumesExactly) {
  TempDir dir;
  const std::string glob = testing::write_records(dir.str(), 200, 64, 2);
  testing::expect_save_restore([&] { return from_yaml_string(crop_pipeline(glob), "p.yaml"); },
                               {.epochs = 2, .workers = 3}, {.epochs = 2, .workers = 1});
}

}  // namespace
}  // namespace flowstate
