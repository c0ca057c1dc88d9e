// The save/restore oracle of tools/testing.h: what its report says of a node that restores
// exactly, and of one that forgets part of its state.
#include "flowstate/nodes/builtin.h"
#include "flowstate/tools/testing.h"

#include <gtest/gtest.h>

#include <memory>
#include <tuple>

#include "tests/support/testing.h"

namespace flowstate {
namespace {

using testing::TempDir;

struct DropThirdState {
  std::uint64_t epoch = 0;
  std::uint64_t seen = 0;  ///< samples pulled in the epoch
  template <class Archive>
  void serialize(Archive& ar, std::uint32_t /*version*/) {
    ar(epoch, seen);
  }
};

/// Drops every third sample it sees — and, on purpose, forgets how many it has seen when it
/// is restored, so a restored run drops different samples.
class ForgetfulDropThird final : public StatefulSpineNode<DropThirdState> {
 public:
  using StatefulSpineNode::StatefulSpineNode;
  std::uint64_t size(std::uint64_t epoch) const override {
    return upstream_->size(epoch) == 0 ? 0 : kUnknownSize;
  }
  void start_epoch(std::uint64_t epoch) override {
    upstream_->start_epoch(epoch);
    state_ = {epoch, 0};
  }
  std::size_t pull(std::span<Ref> out) override {
    std::size_t n = 0;
    while (n < out.size()) {
      const std::size_t want = out.size() - n;
      chunk_.resize(want);
      const std::size_t got = upstream_->pull(chunk_);
      for (std::size_t i = 0; i < got; ++i)
        if (state_.seen++ % 3 != 2) out[n++] = chunk_[i];
      if (got < want) break;
    }
    return n;
  }
  void restore(InArchive& ar) override {
    DropThirdState s;
    ar(s);
    state_ = {s.epoch, 0};  // the bug the oracle must find
  }

 private:
  std::vector<Ref> chunk_;
};

struct DropThirdOptions {
  static constexpr auto table() { return std::tuple{}; }
};

const NodeDef& forgetful_node() {
  static const NodeDef def = define_node<DropThirdOptions>(
      {.type = "forgetful_drop_third", .phase = Phase::kPerSample, .doc = "a broken node"},
      [](BuildContext& ctx, const DropThirdOptions&) {
        ctx.add(std::make_unique<ForgetfulDropThird>(ctx.name()));
      });
  return def;
}

class SaveRestoreOracle : public ::testing::Test {
 protected:
  void SetUp() override { glob_ = testing::write_records(dir_.str(), 60, 16, 2); }
  Pipeline::Builder base() const {
    Pipeline::Builder b;
    b.seed(3).records({.paths = {glob_}, .record_bytes = 16});
    return b;
  }
  TempDir dir_;
  std::string glob_;
};

TEST_F(SaveRestoreOracle, ReportsWhatItCheckedWhenEveryRestoreIsExact) {
  auto make = [&] {
    return base().shuffle({.mode = ShuffleMode::kGlobal}).batch({.size = 8}).build();
  };
  const testing::OracleReport r = testing::check_save_restore(make, {.epochs = 2});
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(r.failures.empty());
  EXPECT_EQ(r.batches, 16u);  // 8 per epoch: 7 of 8 samples, one of 4
  // 0, 1, a fifth, the first epoch's last batch and its end, mid second epoch, the end.
  EXPECT_EQ(r.breakpoints, (std::vector<std::size_t>{0, 1, 3, 7, 8, 12, 16}));
  EXPECT_EQ(r.summary(),
            "save/restore oracle: 16 batches uninterrupted; breakpoints after 0, 1, 3, 7, 8, 12, "
            "16 batches: every restore reproduced the uninterrupted run\n");
}

TEST_F(SaveRestoreOracle, NamesTheBreakpointAndTheFirstDifferingBatch) {
  auto make = [&] {
    return base().add(forgetful_node(), DropThirdOptions{}).batch({.size = 5}).build();
  };
  const testing::OracleReport r =
      testing::check_save_restore(make, {.epochs = 2, .workers = 1}, {.epochs = 2, .workers = 2});
  EXPECT_FALSE(r.ok());
  ASSERT_FALSE(r.failures.empty());
  // Restoring at 0 batches or at an epoch's end loses nothing: the epoch starts afresh.
  EXPECT_EQ(r.failures[0].rfind("breakpoint after 1 batches: batch ", 0), 0u) << r.summary();
  EXPECT_NE(r.failures[0].find(" differs: got {step "), std::string::npos) << r.summary();
  EXPECT_NE(r.summary().find(" failed\n  breakpoint after 1 batches: "), std::string::npos)
      << r.summary();
}

}  // namespace
}  // namespace flowstate
