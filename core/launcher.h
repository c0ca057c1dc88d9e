// Where this process sits in a multi-process job, as its launcher says through the
// environment: mpirun (Open MPI), any PMI launcher (MPICH, Intel MPI), srun (Slurm) and
// torchrun. `shard` reads rank and world from it, `device_copy: {device: auto}` the local
// rank, `flowstate run` all three.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace flowstate {

/// What the launcher's environment says; unset where no launcher variable is set.
struct LaunchEnv {
  std::optional<std::uint64_t> rank;   ///< RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID
  std::optional<std::uint64_t> world;  ///< WORLD_SIZE, OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS
  std::optional<std::uint64_t>
      local_rank;  ///< LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID
  /// The variable `rank` came from ("OMPI_COMM_WORLD_RANK"), for messages.
  std::string rank_variable;
};

/// Reads the launcher's variables, first found wins in the order listed on each member.
/// Throws ConfigError (key `what` + " (environment NAME)") naming a variable that is set but
/// is not a non-negative integer.
LaunchEnv launch_env(const std::string& what = "launcher");

}  // namespace flowstate
