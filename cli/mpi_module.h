// The MPI coordinator of a `flowstate` process that an MPI launcher started, from the module
// flowstate-mpi.so (mpi/mpi_module.cpp), opened only then: a process that no launcher started
// loads none of MPI's libraries.
#pragma once

#include <memory>

#include "flowstate/core/coordinator.h"

namespace flowstate::cli {

/// True when an MPI launcher started this process (mpirun, or a PMI/PMIx one).
bool under_mpi_launcher();

/// An MpiCoordinator (MPI initialised) from the module beside the command (build tree,
/// FLOWSTATE_MPI_MODULE_NEXT_TO) or where it is installed (FLOWSTATE_MPI_MODULE_INSTALLED,
/// relative to the command's directory). ConfigError naming the paths tried when it cannot be
/// opened; Error when MPI cannot be initialised.
std::shared_ptr<Coordinator> load_mpi_coordinator();

/// MpiCoordinator::skip_finalize on `coordinator`, one load_mpi_coordinator() returned.
void skip_mpi_finalize(Coordinator& coordinator);

}  // namespace flowstate::cli
