// The `flowstate` command's MPI part as a module (flowstate-mpi.so), opened by the command
// (cli/mpi_module.cpp) only when an MPI launcher started it. Linked into the command, Open
// MPI's libraries (libmpi, open-pal, open-rte, hwloc, libevent, udev: ~3.5 ms of CPU on a
// 2-core VM) were loaded, relocated and initialised by every process, though only runs under
// a launcher use them (bench/RESULTS.md, "Issue 26: W2 CPU per token").
//
// The module holds MpiCoordinator and links MPI; flowstate's own symbols (Error, Coordinator)
// it takes from the command, which exports them (cli/CMakeLists.txt: ENABLE_EXPORTS).
#include "flowstate/mpi/mpi_coordinator.h"

extern "C" {

/// A new MpiCoordinator (MPI initialised); throws Error as its constructor does.
__attribute__((visibility("default"))) flowstate::Coordinator* flowstate_mpi_coordinator() {
  return new flowstate::MpiCoordinator();
}

/// MpiCoordinator::skip_finalize on `c`, a coordinator flowstate_mpi_coordinator() made.
__attribute__((visibility("default"))) void flowstate_mpi_skip_finalize(flowstate::Coordinator* c) {
  static_cast<flowstate::MpiCoordinator*>(c)->skip_finalize();
}
}
