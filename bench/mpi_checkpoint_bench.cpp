// The cost of one checkpoint of many ranks against one of a single process (bench/RESULTS.md,
// issue 12): every rank runs PIPELINE.yaml to step 1, then saves COUNT checkpoints (steps 1,
// 2, ...) with Loader::save_checkpoint and times each; rank 0 prints the median and the 90th
// percentile. With --single, the Loader has no coordinator (write_checkpoint, the format of
// one process); otherwise its coordinator is MPI's (write_group_checkpoint).
//
//   mpirun -np 4 mpi_checkpoint_bench PIPELINE.yaml CKPT_DIR COUNT
//   mpi_checkpoint_bench PIPELINE.yaml CKPT_DIR COUNT --single
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "flowstate/config/yaml.h"
#include "flowstate/graph/loader.h"
#include "flowstate/mpi/mpi_coordinator.h"

int main(int argc, char** argv) {
  using namespace flowstate;
  if (argc < 4) {
    std::fprintf(stderr, "usage: mpi_checkpoint_bench PIPELINE.yaml CKPT_DIR COUNT [--single]\n");
    return 2;
  }
  const bool single = argc > 4 && std::strcmp(argv[4], "--single") == 0;
  std::shared_ptr<MpiCoordinator> mpi;
  if (!single) mpi = std::make_shared<MpiCoordinator>();
  const std::string dir = argv[2];
  const int count = std::stoi(argv[3]);
  Loader loader(load_yaml_file(argv[1]).pipeline, {.epochs = 0, .coordinator = mpi});
  std::vector<double> ms;
  std::size_t state_bytes = 0;
  for (int i = 0; i < count; ++i) {
    loader.next();
    state_bytes = loader.state().size();
    const auto t0 = std::chrono::steady_clock::now();
    loader.save_checkpoint(dir, {.keep = 2});
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  if (!mpi || mpi->rank() == 0)
    std::printf("%s: %d checkpoints of %zu-byte states: median %.2f ms, p90 %.2f ms\n",
                single ? "single process" : ("world " + std::to_string(mpi->world())).c_str(),
                count, state_bytes, ms[ms.size() / 2], ms[ms.size() * 9 / 10]);
  return 0;
}
