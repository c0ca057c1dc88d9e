// MpiCoordinator: the Coordinator (core/coordinator.h) of a job started by mpirun, srun or any
// MPI launcher. Built when flowstate is configured with MPI (FLOWSTATE_WITH_MPI=AUTO finds
// Open MPI from Debian's openmpi-bin and libopenmpi-dev); `flowstate run` uses it whenever the
// launcher says there is more than one rank.
//
//   auto coord = std::make_shared<flowstate::MpiCoordinator>();   // MPI_Init_thread if needed
//   flowstate::Loader loader(pipeline, {.coordinator = coord});
#pragma once

#include <mutex>

#include "flowstate/core/coordinator.h"

namespace flowstate {

/// The ranks of MPI_COMM_WORLD. Thread-safe: calls from several threads of a rank are
/// serialized (a Loader's async checkpoint runs its collectives on a thread of its own).
class MpiCoordinator final : public Coordinator {
 public:
  /// Initializes MPI with MPI_THREAD_SERIALIZED unless the program already did (then it needs
  /// at least that level); throws Error when MPI cannot provide it.
  MpiCoordinator();
  /// Finalizes MPI when this object initialized it.
  ~MpiCoordinator() override;
  MpiCoordinator(const MpiCoordinator&) = delete;
  MpiCoordinator& operator=(const MpiCoordinator&) = delete;

  std::uint64_t rank() const override { return rank_; }
  std::uint64_t world() const override { return world_; }
  std::vector<std::string> all_gather(std::string_view message) override;
  void barrier() override;
  /// Leaves MPI unfinalized at destruction: for a rank that is failing on its own, whose
  /// MPI_Finalize would wait for ranks still inside a collective. The launcher ends the job
  /// when it exits.
  void skip_finalize() { owns_ = false; }

 private:
  std::mutex mu_;
  std::uint64_t rank_ = 0;
  std::uint64_t world_ = 1;
  bool owns_ = false;
};

}  // namespace flowstate
