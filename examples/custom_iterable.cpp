// A user's own iterable type as a pipeline source (DESIGN.md §9): sixteen integers in a class
// of our own, prepared into batches of four on the device (host memory where there is none),
// trained on with gradient accumulation, checkpointed mid-epoch, and resumed in a fresh
// Loader that must see exactly the batches of the uninterrupted run.
//
//   1. runs two epochs uninterrupted, recording every batch and the trainer's weight;
//   2. runs again and stops after an optimizer step mid-epoch, writing a checkpoint (and the
//      trainer's weight beside it) into a directory;
//   3. restores a fresh Loader from that directory and finishes: every later batch, and the
//      final weight, must equal the uninterrupted run's.
//
// Usage: custom_iterable [--dir DIR]   (default: a fresh temporary directory, removed after)
// Prints one line per batch and ends with "custom_iterable: OK ..." (exit 0), or says what
// differs (exit 1).
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <optional>
#include <string>
#include <vector>

#ifdef FLOWSTATE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "flowstate/core/error.h"
#include "flowstate/graph/loader.h"
#include "flowstate/nodes/builtin.h"
#include "flowstate/nodes/sources/iterable.h"
#include "flowstate/tools/accumulate.h"

namespace fs = std::filesystem;
using namespace flowstate;

namespace {

/// The user's own container: sixteen integers behind const begin()/end(). Its iterators are
/// pointers — random access, with a size — so from_range addresses it by index and a resume
/// costs O(1). (A forward-only iterable works too, and resumes by replaying its epoch.)
class Sixteen {
 public:
  Sixteen() {
    for (int i = 0; i < 16; ++i) values_[i] = i * i;
  }
  const int* begin() const { return values_.data(); }
  const int* end() const { return values_.data() + values_.size(); }

 private:
  std::array<int, 16> values_{};
};

constexpr std::uint64_t kBatch = 4;
constexpr std::uint64_t kMicroBatches = 3;  // 4 batches per epoch: windows of 3, then 1
constexpr double kLearningRate = 0.01;

Pipeline make_pipeline(const Sixteen& numbers) {
  // Each int becomes one sample; the default Collate<int> stacks a batch into an int32
  // Tensor [4], and ToDevice<Tensor> moves it with device_copy.
  return Pipeline::Builder()
      .seed(7)
      .source(from_range(numbers, {.name = "sixteen"}))
      .shuffle({})  // random access: a new order per epoch, still resumable in O(1)
      .map(map_value<int>([](int& v) { v += 1; }), {.name = "plus_one"})
      .batch({.size = kBatch})
      .device_copy({.device = "auto"})
      .build();
}

/// The values of an int32 tensor, wherever it lives.
std::vector<int> to_host(const Tensor& t) {
  std::vector<int> out(static_cast<std::size_t>(t.numel()));
  if (t.device().kind == MemoryKind::kDevice) {
#ifdef FLOWSTATE_HAVE_CUDA
    cudaError_t err = cudaMemcpy(out.data(), t.data(), t.nbytes(), cudaMemcpyDeviceToHost);
    if (err != cudaSuccess) throw Error(std::string("cudaMemcpy: ") + cudaGetErrorString(err));
#endif
  } else {
    std::memcpy(out.data(), t.data(), t.nbytes());
  }
  return out;
}

/// A one-weight "model" fitting the mean of the values: loss = mean((w - x)^2).
struct Trainer {
  GradientAccumulator acc{kMicroBatches, kBatch};
  double weight = 0;
  double grad = 0;  // accumulated since the last step
  int steps = 0;

  /// Backward on one batch; steps the optimizer when the accumulator says so.
  bool train(const Batch& b, const std::vector<int>& xs) {
    double batch_grad = 0;  // d/dw of the batch's mean loss
    for (int x : xs) batch_grad += 2 * (weight - x) / static_cast<double>(xs.size());
    grad += acc.loss_scale(b.info) * batch_grad;
    if (!acc.step_after(b.info)) return false;
    weight -= kLearningRate * grad * acc.step_scale(b.info);
    grad = 0;
    ++steps;
    return true;
  }
};

struct Seen {
  std::uint64_t step, epoch, index;
  bool last;
  std::vector<int> values;
  bool operator==(const Seen&) const = default;
};

std::string show(const Seen& s) {
  std::string v;
  for (int x : s.values) v += (v.empty() ? "" : ", ") + std::to_string(x);
  return "step " + std::to_string(s.step) + " epoch " + std::to_string(s.epoch) + " batch " +
         std::to_string(s.index) + (s.last ? " (last of epoch)" : "") + ": [" + v + "]";
}

/// Consumes batches until the loader ends, or until `stop` says so after a batch.
template <class Stop>
std::vector<Seen> consume(Loader& loader, Trainer& trainer, std::string* device, Stop stop) {
  std::vector<Seen> seen;
  while (auto b = loader.next()) {
    const Tensor& values = batch_value<int>(*b);  // Collate<int>::type is Tensor
    if (device != nullptr) *device = values.device().to_string();
    Seen s{b->info.step, b->info.epoch, b->info.index_in_epoch, b->info.is_last_in_epoch,
           to_host(values)};
    const bool stepped = trainer.train(*b, s.values);
    std::printf("  %s%s\n", show(s).c_str(), stepped ? "  -> optimizer step" : "");
    seen.push_back(std::move(s));
    if (stop(*b, stepped)) break;
  }
  return seen;
}

int run(const fs::path& dir) {
  const Sixteen numbers;
  std::string device;

  std::printf("uninterrupted run:\n");
  Trainer full_trainer;
  Loader full(make_pipeline(numbers), {.epochs = 2});
  std::vector<Seen> expect =
      consume(full, full_trainer, &device, [](const Batch&, bool) { return false; });

  // Stop at the first optimizer step inside an epoch: the loader's checkpoint and the
  // trainer's weight then describe the same moment (no half-accumulated gradient).
  std::printf("interrupted run:\n");
  Trainer trainer;
  std::vector<Seen> got;
  {
    Loader loader(make_pipeline(numbers), {.epochs = 2});
    got = consume(loader, trainer, nullptr,
                  [](const Batch& b, bool stepped) { return stepped && !b.info.is_last_in_epoch; });
    const std::string written = loader.save_checkpoint((dir / "ckpt").string());
    std::ofstream(dir / "trainer.txt")
        << std::setprecision(17) << trainer.weight << ' ' << trainer.steps << '\n';
    std::printf("  checkpoint: %s\n", written.c_str());
  }

  std::printf("resumed run:\n");
  Trainer resumed_trainer;
  std::ifstream(dir / "trainer.txt") >> resumed_trainer.weight >> resumed_trainer.steps;
  Loader resumed(make_pipeline(numbers), {.epochs = 2});
  std::optional<CheckpointFound> found = resumed.restore((dir / "ckpt").string());
  if (!found) {
    std::printf("custom_iterable: FAILED: no checkpoint under %s\n", (dir / "ckpt").c_str());
    return 1;
  }
  std::vector<Seen> rest =
      consume(resumed, resumed_trainer, nullptr, [](const Batch&, bool) { return false; });
  got.insert(got.end(), rest.begin(), rest.end());

  if (got != expect) {
    std::printf("custom_iterable: FAILED: the resumed run's batches differ\n");
    return 1;
  }
  if (resumed_trainer.weight != full_trainer.weight ||
      resumed_trainer.steps != full_trainer.steps) {
    std::printf("custom_iterable: FAILED: weight %.17g after %d steps, expected %.17g after %d\n",
                resumed_trainer.weight, resumed_trainer.steps, full_trainer.weight,
                full_trainer.steps);
    return 1;
  }
  std::printf(
      "custom_iterable: OK: %zu batches of %llu on %s, %d optimizer steps; resumed after %llu "
      "batches, identical to the uninterrupted run (weight %.6f)\n",
      expect.size(), static_cast<unsigned long long>(kBatch), device.c_str(), full_trainer.steps,
      static_cast<unsigned long long>(found->step), full_trainer.weight);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  fs::path dir;
  bool temporary = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--dir") == 0 && i + 1 < argc) {
      dir = argv[++i];
    } else {
      std::fprintf(stderr, "usage: custom_iterable [--dir DIR]\n");
      return 2;
    }
  }
  if (dir.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "custom-iterable-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      std::perror("mkdtemp");
      return 1;
    }
    dir = tmpl;
    temporary = true;
  }
  int rc = 1;
  try {
    fs::create_directories(dir);
    rc = run(dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "custom_iterable: error: %s\n", e.what());
  }
  if (temporary) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  return rc;
}
