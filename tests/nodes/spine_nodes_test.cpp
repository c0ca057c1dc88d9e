// The save/restore oracle (STYLE.md) for every stateful spine node, at two levels: the Ref
// stream of a bare node chain, and whole pipelines through the Loader.
#include <gtest/gtest.h>

#include <sstream>

#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/batch.h"
#include "flowstate/nodes/builtin.h"
#include "flowstate/nodes/shard.h"
#include "flowstate/nodes/shuffle.h"
#include "flowstate/nodes/sources/records.h"
#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::TempDir;

// ---- Ref level ----

using Chain = std::vector<std::unique_ptr<SpineNode>>;
using ChainFactory = std::function<Chain()>;

Chain connect(Chain c) {
  for (std::size_t i = 0; i < c.size(); ++i) c[i]->connect(i ? c[i - 1].get() : nullptr);
  return c;
}

// Pulls the chain's last node through `epochs` epochs in chunks of `chunk`, from wherever
// its state is. Returns (epoch, ref index) pairs.
std::vector<std::pair<std::uint64_t, std::uint64_t>> pull_all(Chain& c, std::uint64_t epoch,
                                                              std::uint64_t epochs,
                                                              std::size_t chunk, bool start,
                                                              std::size_t limit = SIZE_MAX) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
  std::vector<Ref> buf(chunk);
  for (; epoch < epochs; ++epoch) {
    if (start) c.back()->start_epoch(epoch);
    start = true;
    for (;;) {
      std::size_t want = std::min(chunk, limit - out.size());
      if (want == 0) return out;
      std::size_t n = c.back()->pull(std::span(buf.data(), want));
      for (std::size_t i = 0; i < n; ++i) out.emplace_back(epoch, buf[i].index);
      if (n < want) break;
    }
  }
  return out;
}

std::string save_chain(const Chain& c) {
  std::ostringstream os(std::ios::binary);
  {
    OutArchive ar(os);
    for (const auto& n : c) n->snapshot()->save(ar);
  }
  return os.str();
}

void load_chain(Chain& c, const std::string& bytes) {
  std::istringstream is(bytes, std::ios::binary);
  InArchive ar(is);
  for (auto& n : c) n->restore(ar);
}

// Breakpoints: 0, 1, mid, last of epoch 0, end of epoch 0, mid epoch 1.
void check_ref_oracle(const ChainFactory& make, std::size_t chunk) {
  Chain full_chain = make();
  auto full = pull_all(full_chain, 0, 2, chunk, true);
  const std::size_t per_epoch = full.size() / 2;
  ASSERT_GT(per_epoch, 2u);
  for (std::size_t k : {std::size_t{0}, std::size_t{1}, per_epoch / 2, per_epoch - 1, per_epoch,
                        per_epoch + per_epoch / 2}) {
    SCOPED_TRACE("breakpoint " + std::to_string(k));
    Chain a = make();
    auto got = pull_all(a, 0, 2, 7, true, k);
    ASSERT_EQ(got.size(), k);
    std::string saved = save_chain(a);
    a.clear();
    Chain b = make();
    load_chain(b, saved);
    // Continue in the epoch of the breakpoint; at an epoch's end the next pull returns 0.
    std::uint64_t epoch = k < per_epoch ? 0 : 1;
    bool fresh = k == 0 || k == per_epoch;  // the consumer starts the next epoch
    auto rest = pull_all(b, epoch, 2, chunk, fresh);
    got.insert(got.end(), rest.begin(), rest.end());
    ASSERT_EQ(got, full);
  }
}

class SpineNodes : public ::testing::Test {
 protected:
  void SetUp() override { glob_ = testing::write_records(dir_.str(), 1003, 16, 4); }
  std::unique_ptr<SpineNode> records() const {
    return std::make_unique<RecordsSource>("records", RecordsOptions{{glob_}, 16});
  }
  TempDir dir_;
  std::string glob_;
};

TEST_F(SpineNodes, RecordsSourcePassesTheOracle) {
  check_ref_oracle(
      [&] {
        Chain c;
        c.push_back(records());
        return connect(std::move(c));
      },
      64);
}

TEST_F(SpineNodes, InterleavedShardPassesTheOracle) {
  check_ref_oracle(
      [&] {
        Chain c;
        c.push_back(records());
        c.push_back(std::make_unique<ShardNode>(
            "shard", ShardOptions{.rank = 2, .world = 3, .mode = ShardMode::kInterleave}));
        return connect(std::move(c));
      },
      50);
}

TEST_F(SpineNodes, ContiguousShardPassesTheOracle) {
  check_ref_oracle(
      [&] {
        Chain c;
        c.push_back(records());
        c.push_back(std::make_unique<ShardNode>(
            "shard", ShardOptions{.rank = 1, .world = 4, .mode = ShardMode::kContiguous}));
        return connect(std::move(c));
      },
      33);
}

TEST_F(SpineNodes, GlobalShufflePassesTheOracle) {
  check_ref_oracle(
      [&] {
        Chain c;
        c.push_back(records());
        c.push_back(std::make_unique<GlobalShuffleNode>("shuffle", 77));
        return connect(std::move(c));
      },
      64);
}

TEST_F(SpineNodes, BufferShufflePassesTheOracleAcrossKeyframes) {
  // A 37-slot buffer over 1003 inputs: ~27 key-frames per epoch, and the drain at the end.
  check_ref_oracle(
      [&] {
        Chain c;
        c.push_back(records());
        c.push_back(std::make_unique<BufferShuffleNode>("shuffle", 77, 37));
        return connect(std::move(c));
      },
      64);
}

TEST_F(SpineNodes, BufferLargerThanTheDataPassesTheOracle) {
  check_ref_oracle(
      [&] {
        Chain c;
        c.push_back(records());
        c.push_back(std::make_unique<BufferShuffleNode>("shuffle", 5, 4096));
        return connect(std::move(c));
      },
      100);
}

TEST_F(SpineNodes, ShuffleReKeysEveryEpoch) {
  Chain c;
  c.push_back(records());
  c.push_back(std::make_unique<GlobalShuffleNode>("shuffle", 77));
  c = connect(std::move(c));
  auto all = pull_all(c, 0, 2, 100, true);
  std::vector<std::uint64_t> e0, e1;
  for (auto [e, i] : all) (e == 0 ? e0 : e1).push_back(i);
  EXPECT_NE(e0, e1);
  std::sort(e0.begin(), e0.end());
  std::sort(e1.begin(), e1.end());
  EXPECT_EQ(e0, e1);
}

TEST_F(SpineNodes, BufferShuffleEmitsEveryInputOnce) {
  Chain c;
  c.push_back(records());
  c.push_back(std::make_unique<BufferShuffleNode>("shuffle", 3, 100));
  c = connect(std::move(c));
  auto all = pull_all(c, 0, 1, 64, true);
  std::vector<std::uint64_t> idx;
  for (auto [e, i] : all) idx.push_back(i);
  std::vector<std::uint64_t> sorted = idx;
  std::sort(sorted.begin(), sorted.end());
  ASSERT_EQ(sorted.size(), 1003u);
  for (std::uint64_t i = 0; i < sorted.size(); ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_NE(idx, sorted);
}

TEST_F(SpineNodes, BufferShuffleStateStaysSmall) {
  // 16384 slots over 200k inputs: a key-frame stored as varint distances fits well under
  // 64 KiB.
  TempDir big;
  auto glob = testing::write_records(big.str(), 200000, 1, 2);
  Chain c;
  c.push_back(std::make_unique<RecordsSource>("records", RecordsOptions{{glob}, 1}));
  c.push_back(std::make_unique<BufferShuffleNode>("shuffle", 3, 16384));
  c = connect(std::move(c));
  pull_all(c, 0, 1, 1000, true, 100000);
  std::string saved = save_chain(c);
  EXPECT_LT(saved.size(), 48u * 1024) << "state is " << saved.size() << " bytes";
  EXPECT_GT(saved.size(), 16384u);  // it does hold the buffer
}

TEST_F(SpineNodes, RejectsAShuffleOverANonIndexedUpstream) {
  Chain c;
  c.push_back(records());
  c.push_back(std::make_unique<BufferShuffleNode>("shuffle", 3, 10));
  c.push_back(std::make_unique<GlobalShuffleNode>("shuffle#2", 3));
  try {
    connect(std::move(c));
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'shuffle#2' needs a random-access upstream, but "
                                         "'shuffle' is not one"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(SpineNodes, RejectsAStreamShuffleThatDoesNotFollowItsSource) {
  Chain c;
  auto source = records();
  const auto* store = dynamic_cast<const RecordStore*>(source.get());
  c.push_back(std::move(source));
  c.push_back(std::make_unique<BufferShuffleNode>("shuffle", 3, 10));
  c.push_back(std::make_unique<StreamShuffleNode>("shuffle#2", 3, 10, store));
  try {
    connect(std::move(c));
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("must come right after that source"), std::string::npos)
        << e.what();
  }
}

TEST_F(SpineNodes, RestoreRejectsACursorPastTheData) {
  Chain a;
  a.push_back(records());
  a = connect(std::move(a));
  std::ostringstream os(std::ios::binary);
  {
    OutArchive ar(os);
    CursorState bad{0, 5000};
    ar(bad);
  }
  std::istringstream is(os.str(), std::ios::binary);
  InArchive ar(is);
  try {
    a[0]->restore(ar);
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("records cursor 5000 is past the source's 1003 records"),
              std::string::npos)
        << e.what();
  }
}

// ---- Loader level ----

class PipelineOracle : public ::testing::Test {
 protected:
  void SetUp() override { glob_ = testing::write_records(dir_.str(), 1000, 32, 3); }
  Pipeline::Builder base() const {
    Pipeline::Builder b;
    b.seed(42).records({.paths = {glob_}, .record_bytes = 32});
    return b;
  }
  void oracle(const std::function<Pipeline()>& make) {
    testing::expect_save_restore(make, {.epochs = 2, .workers = 2}, {.epochs = 2, .workers = 3});
  }
  TempDir dir_;
  std::string glob_;
};

TEST_F(PipelineOracle, BatchWithAShortLastBatch) {
  oracle([&] { return base().batch({.size = 64}).build(); });
}

TEST_F(PipelineOracle, BatchDropLast) {
  oracle([&] { return base().batch({.size = 64, .drop_last = true}).build(); });
}

TEST_F(PipelineOracle, Shard) {
  oracle([&] { return base().shard({.rank = 1, .world = 3}).batch({.size = 16}).build(); });
}

TEST_F(PipelineOracle, GlobalShuffle) {
  oracle(
      [&] { return base().shuffle({.mode = ShuffleMode::kGlobal}).batch({.size = 50}).build(); });
}

TEST_F(PipelineOracle, BufferShuffle) {
  oracle([&] {
    return base().shuffle({.mode = ShuffleMode::kBuffer, .size = 77}).batch({.size = 48}).build();
  });
}

TEST_F(PipelineOracle, EverythingWithARandomMap) {
  oracle([&] {
    return base()
        .shard({.rank = 0, .world = 2, .mode = ShardMode::kContiguous})
        .shuffle({.mode = ShuffleMode::kGlobal, .seed = 1})
        .shuffle({.mode = ShuffleMode::kBuffer, .size = 64})
        .map(
            [](Sample& s, MapContext& ctx) {
              Tensor t(DType::kUInt64, Shape{2});
              t.values<std::uint64_t>()[0] = ctx.rng();
              t.values<std::uint64_t>()[1] = ctx.epoch;
              s.set("noise", t);
            },
            {.name = "noise", .workers = 2})
        .batch({.size = 30})
        .map_batch(
            [](Batch& b, MapContext& ctx) {
              Tensor t(DType::kUInt64, Shape{1});
              t.values<std::uint64_t>()[0] = ctx.rng() ^ b.info.step;
              b.fields.set("batch_noise", t);
            },
            {.name = "batch_noise"})
        .prefetch({.depth = 2})
        .build();
  });
}

}  // namespace
}  // namespace flowstate
