# Dependency lookup: find_package only. Every package comes from Debian's repositories;
# scripts/install-deps.sh installs them all. A missing one names the package to install.
include(FindPackageHandleStandardArgs)

macro(flowstate_require pkg debian)
  find_package(${pkg} ${ARGN} QUIET)
  if(NOT ${pkg}_FOUND)
    message(FATAL_ERROR "flowstate needs ${pkg}: install the Debian package '${debian}' "
                        "(or run scripts/install-deps.sh)")
  endif()
endmacro()

set(THREADS_PREFER_PTHREAD_FLAG ON)
find_package(Threads REQUIRED)
flowstate_require(TBB libtbb-dev CONFIG)
flowstate_require(cereal libcereal-dev CONFIG)
flowstate_require(yaml-cpp libyaml-cpp-dev CONFIG)
flowstate_require(nlohmann_json nlohmann-json3-dev CONFIG)
flowstate_require(simdjson libsimdjson-dev CONFIG)

find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(XXHASH QUIET IMPORTED_TARGET libxxhash)
endif()
if(NOT XXHASH_FOUND)
  message(FATAL_ERROR "flowstate needs xxhash: install the Debian packages 'libxxhash-dev' and 'pkg-config'")
endif()
# SentencePiece (the tokenize node): Debian's libsentencepiece-dev ships a .pc file only.
# Images (decode_image, flowstate gen images): JPEG through TurboJPEG, PNG through libpng; the
# crop-only JPEG decode through libjpeg-turbo's libjpeg API (same library, libjpeg62-turbo-dev).
if(PkgConfig_FOUND)
  pkg_check_modules(SENTENCEPIECE QUIET IMPORTED_TARGET sentencepiece)
  pkg_check_modules(TURBOJPEG QUIET IMPORTED_TARGET libturbojpeg)
  pkg_check_modules(LIBJPEG QUIET IMPORTED_TARGET libjpeg)
endif()
if(NOT SENTENCEPIECE_FOUND)
  message(FATAL_ERROR "flowstate needs SentencePiece: install the Debian packages 'libsentencepiece-dev' and 'pkg-config'")
endif()
if(NOT TURBOJPEG_FOUND)
  message(FATAL_ERROR "flowstate needs TurboJPEG: install the Debian packages 'libturbojpeg0-dev' and 'pkg-config'")
endif()
if(NOT LIBJPEG_FOUND)
  message(FATAL_ERROR "flowstate needs libjpeg-turbo's libjpeg API: install the Debian packages 'libjpeg62-turbo-dev' and 'pkg-config'")
endif()
flowstate_require(PNG libpng-dev)
# Remote sources (s3://, http(s)://): libcurl, whose SigV4 signs the S3 requests.
flowstate_require(CURL libcurl4-openssl-dev)

find_path(DLPACK_INCLUDE_DIR dlpack/dlpack.h)
if(NOT DLPACK_INCLUDE_DIR)
  message(FATAL_ERROR "flowstate needs DLPack: install the Debian package 'libdlpack-dev'")
endif()

# CUDA: device_copy uses only the runtime API, so plain C++ sources link CUDA::cudart and
# nvcc is not needed.
set(FLOWSTATE_HAVE_CUDA OFF)
if(NOT FLOWSTATE_WITH_CUDA STREQUAL "OFF")
  if(EXISTS /usr/local/cuda AND NOT CUDAToolkit_ROOT)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(FLOWSTATE_HAVE_CUDA ON)
  elseif(FLOWSTATE_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "FLOWSTATE_WITH_CUDA=ON but the CUDA Toolkit was not found "
                        "(expected under /usr/local/cuda)")
  endif()
endif()
message(STATUS "flowstate: CUDA device_copy ${FLOWSTATE_HAVE_CUDA}")

# MPI: the coordinator of multi-rank jobs (mpi/). Open MPI from Debian: openmpi-bin (mpirun)
# and libopenmpi-dev. Tests that start jobs under mpirun are registered only with it.
set(FLOWSTATE_HAVE_MPI OFF)
if(NOT FLOWSTATE_WITH_MPI STREQUAL "OFF")
  find_package(MPI QUIET COMPONENTS CXX)
  if(MPI_CXX_FOUND AND MPIEXEC_EXECUTABLE)
    set(FLOWSTATE_HAVE_MPI ON)
  elseif(FLOWSTATE_WITH_MPI STREQUAL "ON")
    message(FATAL_ERROR "FLOWSTATE_WITH_MPI=ON but MPI was not found: install the Debian packages "
                        "'openmpi-bin' and 'libopenmpi-dev' (or run scripts/install-deps.sh)")
  endif()
endif()
message(STATUS "flowstate: MPI coordinator ${FLOWSTATE_HAVE_MPI}")

if(FLOWSTATE_BUILD_TESTS)
  flowstate_require(GTest libgtest-dev CONFIG)
endif()
if(FLOWSTATE_BUILD_BENCH)
  flowstate_require(benchmark libbenchmark-dev CONFIG)
endif()
