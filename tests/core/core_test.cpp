#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <stdexcept>
#include <thread>

#include "flowstate/core/batch.h"
#include "flowstate/core/buffer.h"
#include "flowstate/core/error.h"
#include "flowstate/core/hash.h"
#include "flowstate/core/rng.h"
#include "flowstate/core/sample.h"
#include "flowstate/core/tensor.h"

namespace flowstate {
namespace {

TEST(Philox, MatchesTheRandom123KnownAnswer) {
  // Known-answer vector of Philox4x32-10 from the Random123 distribution (kat_vectors):
  // counter = key = 0.
  auto r = philox4x32({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(r[0], 0x6627e8d5u);
  EXPECT_EQ(r[1], 0xe169c58du);
  EXPECT_EQ(r[2], 0xbc57ac4cu);
  EXPECT_EQ(r[3], 0x9b00dbd8u);
}

TEST(ElementRng, IsAPureFunctionOfKeyStreamAndCounter) {
  ElementRng a(1, 2), b(1, 2), c(1, 3);
  for (int i = 0; i < 100; ++i) {
    auto x = a();
    EXPECT_EQ(x, b());
    EXPECT_NE(x, c());
  }
  EXPECT_EQ(a.counter(), 100u);
  ElementRng d(1, 2, 50);
  ElementRng e(1, 2);
  for (int i = 0; i < 50; ++i) e();
  EXPECT_EQ(d(), e());
}

TEST(ElementRng, BelowStaysInRange) {
  ElementRng r(9, 9);
  std::set<std::uint64_t> seen;
  for (int i = 0; i < 1000; ++i) {
    auto v = r.below(7);
    ASSERT_LT(v, 7u);
    seen.insert(v);
  }
  EXPECT_EQ(seen.size(), 7u);
}

TEST(Hash, IsStableAcrossRuns) {
  // XXH3-64 of "flowstate" with seed 0 — stored on disk, so it must never change.
  EXPECT_EQ(hex64(hash64("flowstate")), hex64(hash64(std::string("flowstate"))));
  Hasher h;
  h.update("flow").update("state");
  EXPECT_EQ(h.digest(), hash64("flowstate"));
  EXPECT_EQ(hex64(0xabc), "0000000000000abc");
}

TEST(Tensor, ViewsShareBytesAndCloneCopies) {
  Tensor t(DType::kUInt16, Shape{2, 3});
  auto v = t.values<std::uint16_t>();
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::uint16_t>(i);
  Tensor view = t.reshape(Shape{6});
  Tensor copy = t.clone();
  v[0] = 42;
  EXPECT_EQ(view.values<std::uint16_t>()[0], 42);
  EXPECT_EQ(copy.values<std::uint16_t>()[0], 0);
  EXPECT_EQ(t.nbytes(), 12u);
  EXPECT_THROW(t.values<float>(), std::invalid_argument);
  EXPECT_THROW(t.reshape(Shape{5}), std::invalid_argument);
}

TEST(Tensor, RejectsAViewPastItsBuffer) {
  auto b = Buffer::allocate(16);
  EXPECT_THROW(Tensor(b, 8, DType::kUInt32, Shape{3}), std::length_error);
}

TEST(Tensor, ExportsDLPack) {
  Tensor t(DType::kFloat32, Shape{4, 5});
  DLManagedTensor* m = t.to_dlpack();
  EXPECT_EQ(m->dl_tensor.ndim, 2);
  EXPECT_EQ(m->dl_tensor.shape[0], 4);
  EXPECT_EQ(m->dl_tensor.shape[1], 5);
  EXPECT_EQ(m->dl_tensor.dtype.code, kDLFloat);
  EXPECT_EQ(m->dl_tensor.dtype.bits, 32);
  EXPECT_EQ(m->dl_tensor.device.device_type, kDLCPU);
  EXPECT_EQ(static_cast<char*>(m->dl_tensor.data) + m->dl_tensor.byte_offset, t.data());
  m->deleter(m);
}

TEST(BufferPool, RecyclesBuffersOfTheSameSize) {
  auto pool = BufferPool::host();
  for (int i = 0; i < 100; ++i) {
    auto a = pool->acquire(4096);
    auto b = pool->acquire(4096);
    std::memset(a->data(), 1, 4096);
  }
  EXPECT_EQ(pool->allocated(), 2u);
}

TEST(BufferPool, ABufferMayOutliveItsPool) {
  std::shared_ptr<Buffer> keep;
  {
    auto pool = BufferPool::host();
    keep = pool->acquire(64);
  }
  std::memset(keep->data(), 0, 64);  // ASan would flag a use after free
  keep.reset();
}

TEST(Fields, InternsNamesAndKeepsOrder) {
  Sample s;
  s.set("b", Tensor(DType::kUInt8, Shape{1}));
  s.set("a", Tensor(DType::kUInt8, Shape{2}));
  s.set("b", Tensor(DType::kUInt8, Shape{3}));
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(field_name(s.begin()->first), "b");
  EXPECT_EQ(s.at("b").shape()[0], 3);
  EXPECT_EQ(field_id("a"), field_id(std::string("a")));
  try {
    (void)s.at("missing");
    FAIL();
  } catch (const std::out_of_range& e) {
    EXPECT_STREQ(e.what(), "no field 'missing'");
  }
}

TEST(Fields, InterningIsThreadSafe) {
  std::vector<std::thread> ts;
  std::vector<FieldId> ids(8);
  for (int t = 0; t < 8; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < 1000; ++i) field_id("f" + std::to_string(i));
      ids[t] = field_id("shared-name");
    });
  for (auto& t : ts) t.join();
  for (auto id : ids) EXPECT_EQ(id, ids[0]);
}

TEST(Batch, DigestCoversNamesShapesAndBytes) {
  auto make = [](const char* name, std::int64_t n, std::uint8_t fill) {
    Batch b;
    Tensor t(DType::kUInt8, Shape{n});
    std::memset(t.data(), fill, static_cast<std::size_t>(n));
    b.fields.set(name, t);
    return b.digest();
  };
  EXPECT_EQ(make("x", 4, 1), make("x", 4, 1));
  EXPECT_NE(make("x", 4, 1), make("y", 4, 1));
  EXPECT_NE(make("x", 4, 1), make("x", 4, 2));
  EXPECT_NE(make("x", 4, 1), make("x", 5, 1));
}

TEST(Errors, RethrowWithNodeKeepsTheKindAndNamesTheNode) {
  try {
    rethrow_with_node(std::make_exception_ptr(DataError("f.bin", 12, "bad")), "records");
  } catch (const DataError& e) {
    EXPECT_EQ(e.node(), "records");
    EXPECT_EQ(e.file(), "f.bin");
    EXPECT_EQ(e.offset(), 12u);
    EXPECT_STREQ(e.what(), "node 'records': bad");
  }
  try {
    rethrow_with_node(std::make_exception_ptr(std::runtime_error("boom")), "map");
  } catch (const Error& e) {
    EXPECT_EQ(e.node(), "map");
    EXPECT_STREQ(e.what(), "node 'map': boom");
  }
  // An error already attributed to an inner node keeps that attribution.
  try {
    rethrow_with_node(Error("x").with_node("inner"), "outer");
  } catch (const Error& e) {
    EXPECT_EQ(e.node(), "inner");
  }
}

TEST(DType, ParsesNamesAndRejectsUnknownOnes) {
  EXPECT_EQ(parse_dtype("uint16"), DType::kUInt16);
  EXPECT_EQ(dtype_size(DType::kFloat64), 8u);
  try {
    parse_dtype("int3", "nodes[2].map.dtype");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "nodes[2].map.dtype");
    EXPECT_NE(std::string(e.what()).find("unknown dtype 'int3'"), std::string::npos);
  }
}

}  // namespace
}  // namespace flowstate
