#include "flowstate/mpi/mpi_coordinator.h"

#include <mpi.h>

#include <climits>

#include "flowstate/core/error.h"

namespace flowstate {

MpiCoordinator::MpiCoordinator() {
  int initialized = 0, provided = 0;
  MPI_Initialized(&initialized);
  if (initialized == 0) {
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    owns_ = true;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_SERIALIZED)
    throw Error("MPI provides thread level " + std::to_string(provided) +
                "; flowstate's checkpoints need MPI_THREAD_SERIALIZED or higher");
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  rank_ = static_cast<std::uint64_t>(rank);
  world_ = static_cast<std::uint64_t>(size);
}

MpiCoordinator::~MpiCoordinator() {
  if (!owns_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized == 0) MPI_Finalize();
}

std::vector<std::string> MpiCoordinator::all_gather(std::string_view message) {
  std::lock_guard lock(mu_);
  if (message.size() > static_cast<std::size_t>(INT_MAX))
    throw Error("all_gather: a message of " + std::to_string(message.size()) +
                " bytes is too long");
  const int n = static_cast<int>(world_);
  int mine = static_cast<int>(message.size());
  std::vector<int> sizes(static_cast<std::size_t>(n));
  MPI_Allgather(&mine, 1, MPI_INT, sizes.data(), 1, MPI_INT, MPI_COMM_WORLD);
  std::vector<int> offsets(static_cast<std::size_t>(n));
  long long total = 0;
  for (int r = 0; r < n; ++r) {
    offsets[static_cast<std::size_t>(r)] = static_cast<int>(total);
    total += sizes[static_cast<std::size_t>(r)];
  }
  if (total > INT_MAX) throw Error("all_gather: " + std::to_string(total) + " bytes in all");
  std::string all(static_cast<std::size_t>(total), '\0');
  MPI_Allgatherv(message.data(), mine, MPI_CHAR, all.data(), sizes.data(), offsets.data(), MPI_CHAR,
                 MPI_COMM_WORLD);
  std::vector<std::string> out(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    out[static_cast<std::size_t>(r)] =
        all.substr(static_cast<std::size_t>(offsets[r]), static_cast<std::size_t>(sizes[r]));
  return out;
}

void MpiCoordinator::barrier() {
  std::lock_guard lock(mu_);
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace flowstate
