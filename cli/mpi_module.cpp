#include "cli/mpi_module.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "flowstate/core/error.h"

#if !defined(FLOWSTATE_MPI_MODULE_NEXT_TO) || !defined(FLOWSTATE_MPI_MODULE_INSTALLED)
#error "cli/CMakeLists.txt names the MPI module's file"
#endif

namespace flowstate::cli {
namespace {

using MakeFn = Coordinator* (*)();
using SkipFn = void (*)(Coordinator*);

struct Module {
  MakeFn make = nullptr;
  SkipFn skip = nullptr;
};

/// The command's own directory (where /proc/self/exe lies).
std::filesystem::path command_dir() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path() : exe.parent_path();
}

const Module& module() {
  static const Module m = [] {
    const std::filesystem::path dir = command_dir();
    std::string tried;
    for (const char* rel : {FLOWSTATE_MPI_MODULE_NEXT_TO, FLOWSTATE_MPI_MODULE_INSTALLED}) {
      const std::string path = (dir / rel).lexically_normal().string();
      void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        const char* why = ::dlerror();
        tried += "\n  " + path + ": " + (why != nullptr ? why : "cannot be opened");
        continue;
      }
      Module out;
      out.make = reinterpret_cast<MakeFn>(::dlsym(handle, "flowstate_mpi_coordinator"));
      out.skip = reinterpret_cast<SkipFn>(::dlsym(handle, "flowstate_mpi_skip_finalize"));
      if (out.make != nullptr && out.skip != nullptr) return out;
      tried += "\n  " + path + ": not flowstate's MPI module";
    }
    throw ConfigError("flowstate-mpi.so",
                      "an MPI launcher started this process, and flowstate's MPI part (the "
                      "module flowstate-mpi.so, installed with the command) cannot be opened:" +
                          tried);
  }();
  return m;
}

}  // namespace

std::shared_ptr<Coordinator> load_mpi_coordinator() {
  return std::shared_ptr<Coordinator>(module().make());
}

void skip_mpi_finalize(Coordinator& coordinator) { module().skip(&coordinator); }

bool under_mpi_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (const char* s = std::getenv(v); s != nullptr && *s != '\0') return true;
  return false;
}

}  // namespace flowstate::cli
