#include "flowstate/core/launcher.h"

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "flowstate/core/error.h"

namespace flowstate {
namespace {

std::optional<std::uint64_t> env_uint(std::initializer_list<const char*> names,
                                      const std::string& what, std::string* found = nullptr) {
  for (const char* n : names) {
    const char* v = std::getenv(n);
    if (v == nullptr || *v == '\0') continue;
    std::uint64_t x = 0;
    auto [p, ec] = std::from_chars(v, v + std::strlen(v), x);
    if (ec != std::errc() || *p != '\0')
      throw ConfigError(
          what + " (environment " + n + ")",
          std::string("environment variable ") + n + "='" + v + "' is not a non-negative integer");
    if (found != nullptr) *found = n;
    return x;
  }
  return std::nullopt;
}

}  // namespace

LaunchEnv launch_env(const std::string& what) {
  LaunchEnv e;
  e.rank = env_uint({"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}, what,
                    &e.rank_variable);
  e.world = env_uint({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}, what);
  e.local_rank = env_uint(
      {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}, what);
  return e;
}

}  // namespace flowstate
