// A rank that dies inside a checkpoint, for mpi_test.cpp: under mpirun, every rank runs the
// YAML pipeline with an MpiCoordinator — resuming from the newest step every rank verifies —
// and checkpoints every EVERY steps, appending "<step> <epoch> <index> <digest>" per batch to
// digests-<rank>.txt (the format of `flowstate run --digests`). Rank KILL_RANK kills itself
// with SIGKILL as soon as its part of checkpoint KILL_STEP is durable, before the commit.
//
//   mpirun -np 4 mpi_worker PIPELINE.yaml CKPT_DIR EVERY KILL_RANK KILL_STEP
#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>

#include "flowstate/config/yaml.h"
#include "flowstate/core/hash.h"
#include "flowstate/graph/loader.h"
#include "flowstate/mpi/mpi_coordinator.h"

int main(int argc, char** argv) {
  using namespace flowstate;
  if (argc != 6) {
    std::fprintf(stderr, "usage: mpi_worker PIPELINE.yaml CKPT_DIR EVERY KILL_RANK KILL_STEP\n");
    return 2;
  }
  auto coordinator = std::make_shared<MpiCoordinator>();
  try {
    const PipelineConfig config = load_yaml_file(argv[1]);
    const std::string dir = argv[2];
    const std::uint64_t every = std::stoull(argv[3]), kill_rank = std::stoull(argv[4]),
                        kill_step = std::stoull(argv[5]);
    const std::uint64_t rank = coordinator->rank();
    Loader loader(config.pipeline, {.epochs = config.epochs, .coordinator = coordinator});
    loader.restore(dir);
    std::FILE* out = std::fopen(("digests-" + std::to_string(rank) + ".txt").c_str(), "a");
    if (out == nullptr) throw Error("cannot open the digests file");
    while (auto b = loader.next()) {
      const BatchInfo& info = b->info;
      std::fprintf(out, "%llu %llu %llu %s\n", static_cast<unsigned long long>(info.step),
                   static_cast<unsigned long long>(info.epoch),
                   static_cast<unsigned long long>(info.index_in_epoch),
                   hex64(b->digest()).c_str());
      std::fflush(out);
      if ((info.step + 1) % every != 0) continue;
      CheckpointWriteOptions options;
      if (rank == kill_rank && info.step + 1 == kill_step)
        options.hook = [](std::string_view phase) {
          if (phase == "part-written") ::raise(SIGKILL);
        };
      loader.save_checkpoint(dir, options);
    }
    std::fclose(out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_worker: %s\n", e.what());
    coordinator->skip_finalize();
    return 1;
  }
  return 0;
}
