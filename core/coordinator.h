// Coordinator: how the ranks of one job talk to each other — the little a multi-rank
// checkpoint needs (DECISIONS.md, "Many ranks"). An interface, so that any engine plugs in:
// MPI (mpi/mpi_coordinator.h, built with FLOWSTATE_WITH_MPI), torch.distributed from Python,
// or threads in one process (tests).
//
//   auto coord = std::make_shared<MpiCoordinator>();          // after MPI_Init
//   Loader loader(pipeline, {.coordinator = coord});
//   loader.restore("ck");              // collective: every rank takes the same step
//   ... loader.save_checkpoint("ck");  // collective: one commit for all ranks
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace flowstate {

/// The ranks of a job. Every call is collective: each rank calls the same methods in the same
/// order (from one thread at a time per rank), and a call returns once every rank has made it.
/// A rank that dies leaves the others blocked inside a call until the launcher ends the job
/// (mpirun does so as soon as a rank exits abnormally).
class Coordinator {
 public:
  virtual ~Coordinator() = default;
  /// This process's rank, < world().
  virtual std::uint64_t rank() const = 0;
  /// Number of ranks.
  virtual std::uint64_t world() const = 0;
  /// Every rank's `message`, indexed by rank. Messages are small (a few KiB).
  virtual std::vector<std::string> all_gather(std::string_view message) = 0;
  /// Returns once every rank has called it.
  virtual void barrier() = 0;
};

}  // namespace flowstate
