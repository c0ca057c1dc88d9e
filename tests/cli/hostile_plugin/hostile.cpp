// A plugin whose node fails on purpose, for tests/cli/plugin_errors_test.cpp: `fail_at` passes
// its upstream's samples through, and throws in `pull` once `after` samples have passed, or in
// `restore`, a std::runtime_error, a std::bad_alloc or an int (`throw 42`), as a user's buggy
// node might (its options are free: a resume with another `what` restores the same state). Built
// like examples/plugin/ (no flowstate library linked: the symbols resolve to the executable's).
#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>

#include "flowstate/config/plugins.h"
#include "flowstate/core/error.h"
#include "flowstate/nodes/definition.h"
#include "flowstate/nodes/node.h"
#include "flowstate/nodes/options.h"

namespace flowstate::hostile {

struct FailOptions {
  std::string in = "pull";             ///< pull | restore
  std::string what = "runtime_error";  ///< runtime_error | bad_alloc | int | data_error
  std::uint64_t after = 0;             ///< samples passed before a pull throws

  static constexpr auto table() {
    return std::tuple{
        param("in", &FailOptions::in, {.free = true, .doc = "pull or restore"}),
        param("what", &FailOptions::what,
              {.free = true, .doc = "runtime_error, bad_alloc, int or data_error"}),
        param("after", &FailOptions::after, {.free = true, .doc = "samples before a pull throws"})};
  }
};

struct FailState {
  std::uint64_t passed = 0;
  template <class Archive>
  void serialize(Archive& ar, std::uint32_t) {
    ar(passed);
  }
  static constexpr auto inspect_fields() {
    return std::make_tuple(std::pair{"passed", &FailState::passed});
  }
};

}  // namespace flowstate::hostile

CEREAL_CLASS_VERSION(flowstate::hostile::FailState, 1);

namespace flowstate::hostile {

[[noreturn]] void fail(const std::string& what, const std::string& where) {
  if (what == "bad_alloc") throw std::bad_alloc();
  if (what == "int") throw 42;
  if (what == "data_error") throw DataError("hostile.bin", 7, "a bad record in " + where);
  throw std::runtime_error("hostile failure in " + where);
}

class FailNode final : public StatefulSpineNode<FailState> {
 public:
  FailNode(std::string name, FailOptions o)
      : StatefulSpineNode(std::move(name)), o_(std::move(o)) {}
  std::uint64_t size(std::uint64_t epoch) const override { return upstream_->size(epoch); }
  void start_epoch(std::uint64_t epoch) override { upstream_->start_epoch(epoch); }
  std::size_t pull(std::span<Ref> out) override {
    if (o_.in == "pull" && state_.passed >= o_.after) fail(o_.what, "pull");
    const std::size_t got = upstream_->pull(out);
    state_.passed += got;
    return got;
  }
  void restore(InArchive& ar) override {
    if (o_.in == "restore") fail(o_.what, "restore");
    StatefulSpineNode::restore(ar);
  }

 private:
  FailOptions o_;
};

const NodeDef& fail_node() {
  static const NodeDef def = define_node<FailOptions>(
      {.type = "fail_at", .phase = Phase::kPerSample, .doc = "throws in pull or restore"},
      [](BuildContext& ctx, const FailOptions& o) {
        ctx.add(std::make_unique<FailNode>(ctx.name(), o));
      },
      inspect_fields<FailState>);
  return def;
}

}  // namespace flowstate::hostile

extern "C" void flowstate_register_plugin(flowstate::PluginRegistry& r) {
  r.add(flowstate::hostile::fail_node());
}
