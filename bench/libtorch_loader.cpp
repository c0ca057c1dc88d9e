// W1 on LibTorch's data loader, for the side-by-side comparison (compare.sh): a map-style
// dataset over the memory-mapped record files (each example a uint8 [1024] tensor copied out
// of the mapping), RandomSampler, batch 256, Stack collate into one [256, 1024] tensor,
// `--workers` worker threads. Prints one JSON line with samples/s over --batches batches after
// --warmup; epochs restart as needed (a new epoch re-shuffles, like W1's).
//
//   libtorch_loader --data DIR [--workers 2] [--batches 2048] [--warmup 50]
#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace {

constexpr std::int64_t kRecordBytes = 1024;
constexpr std::size_t kBatch = 256;

double process_cpu_s() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return s(ru.ru_utime) + s(ru.ru_stime);
}

struct Mapping {
  const std::uint8_t* data = nullptr;
  std::size_t size = 0;
};

class RecordsDataset
    : public torch::data::datasets::Dataset<RecordsDataset, torch::data::TensorExample> {
 public:
  explicit RecordsDataset(const std::string& dir) {
    glob_t g{};
    const std::string pattern = dir + "/part-*.bin";
    if (::glob(pattern.c_str(), 0, nullptr, &g) != 0 || g.gl_pathc == 0)
      throw std::runtime_error("no file matches " + pattern);
    first_.push_back(0);
    for (std::size_t i = 0; i < g.gl_pathc; ++i) {  // glob sorts
      int fd = ::open(g.gl_pathv[i], O_RDONLY);
      struct stat st {};
      if (fd < 0 || ::fstat(fd, &st) != 0) throw std::runtime_error("cannot open a record file");
      void* p = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
      ::close(fd);
      if (p == MAP_FAILED) throw std::runtime_error("cannot map a record file");
      maps_.push_back({static_cast<const std::uint8_t*>(p), static_cast<std::size_t>(st.st_size)});
      first_.push_back(first_.back() + static_cast<std::size_t>(st.st_size) / kRecordBytes);
    }
    ::globfree(&g);
  }

  torch::data::TensorExample get(std::size_t index) override {
    const auto k = static_cast<std::size_t>(std::upper_bound(first_.begin(), first_.end(), index) -
                                            first_.begin() - 1);
    const std::uint8_t* rec = maps_[k].data + (index - first_[k]) * kRecordBytes;
    // A copy, as a dataset returning an owning tensor must make.
    torch::Tensor t = torch::empty({kRecordBytes}, torch::kUInt8);
    std::memcpy(t.data_ptr<std::uint8_t>(), rec, kRecordBytes);
    return {t};
  }

  torch::optional<std::size_t> size() const override { return first_.back(); }

 private:
  std::vector<Mapping> maps_;
  std::vector<std::size_t> first_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  std::size_t workers = 2, batches = 2048, warmup = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--data")
      dir = v;
    else if (k == "--workers")
      workers = std::stoul(v);
    else if (k == "--batches")
      batches = std::stoul(v);
    else if (k == "--warmup")
      warmup = std::stoul(v);
    else {
      std::fprintf(stderr,
                   "usage: libtorch_loader --data DIR [--workers N] [--batches N] "
                   "[--warmup N]\n");
      return 2;
    }
  }
  try {
    torch::manual_seed(1234);
    auto dataset =
        RecordsDataset(dir).map(torch::data::transforms::Stack<torch::data::TensorExample>());
    auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
        std::move(dataset), torch::data::DataLoaderOptions().batch_size(kBatch).workers(workers));

    using Clock = std::chrono::steady_clock;
    std::size_t seen = 0, samples = 0;
    Clock::time_point t0;
    double cpu0 = 0;
    bool done = false;
    while (!done) {  // one pass per epoch
      for (auto& batch : *loader) {
        if (batch.data.size(0) != static_cast<std::int64_t>(kBatch) && batch.data.size(0) == 0)
          throw std::runtime_error("empty batch");
        if (seen == warmup) {
          t0 = Clock::now();
          cpu0 = process_cpu_s();
        }
        if (seen >= warmup) samples += static_cast<std::size_t>(batch.data.size(0));
        if (++seen == warmup + batches) {
          done = true;
          break;
        }
      }
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    const double cpu = process_cpu_s() - cpu0;
    std::printf(
        "{\"impl\": \"libtorch\", \"what\": \"w1\", \"workers\": %zu, \"samples_per_s\": %.1f, "
        "\"cpu_ns_per_sample\": %.1f, \"batches\": %zu, \"seconds\": %.4f, "
        "\"intra_op_threads\": %d}\n",
        workers, static_cast<double>(samples) / s, cpu * 1e9 / static_cast<double>(samples),
        batches, s, torch::get_num_threads());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "libtorch_loader: %s\n", e.what());
    return 1;
  }
  return 0;
}
