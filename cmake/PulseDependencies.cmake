# Every dependency of pulse, found the same way on Debian and on a cluster's modules.
# Point CMake at other installs with <Pkg>_ROOT (Kokkos_ROOT, HDF5_ROOT, MPI_HOME) or
# PKG_CONFIG_PATH (OpenBLAS, zstd, lz4, xxHash, libsodium).

include(PulseKokkos)

# ---- MPI and HDF5 ----
# Rank 0 writes the statistics file with serial HDF5 calls, so a serial HDF5 serves as well as a
# parallel one (Debian's parallel build is the one on the package list).
find_package(MPI REQUIRED COMPONENTS C CXX)
set(HDF5_PREFER_PARALLEL TRUE)
find_package(HDF5 REQUIRED COMPONENTS C)
message(STATUS "pulse: HDF5 ${HDF5_VERSION} (parallel: ${HDF5_IS_PARALLEL}; either serves)")

# ---- codecs, hashing, signing, BLAS (pkg-config names as Debian and Spack install them) ----
find_package(PkgConfig REQUIRED)
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
pkg_check_modules(LZ4 REQUIRED IMPORTED_TARGET liblz4)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
pkg_check_modules(SODIUM REQUIRED IMPORTED_TARGET libsodium)

# ---- GEMM: cuBLAS with a CUDA Kokkos, OpenBLAS otherwise ----
set(PULSE_HAVE_CUBLAS OFF)
if(PULSE_KOKKOS_CUDA)
  find_package(CUDAToolkit REQUIRED)
  set(PULSE_HAVE_CUBLAS ON)
  set(PULSE_BLAS_TARGET CUDA::cublas)
else()
  pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
  set(PULSE_BLAS_TARGET PkgConfig::OPENBLAS)
endif()

# ---- command line, JSON ----
find_package(CLI11 REQUIRED)
find_package(nlohmann_json 3 REQUIRED)

# ---- Python: Debian's interpreter (python3-torch, numpy, h5py are apt packages; a pyenv or
# conda python first on PATH usually lacks them) ----
if(NOT PULSE_PYTHON)
  find_program(PULSE_PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
  if(NOT PULSE_PYTHON)
    find_program(PULSE_PYTHON NAMES python3)
  endif()
endif()

# ---- the Python module (pybind11) ----
# PULSE_ENABLE_PYTHON: AUTO (the default) decides at every configure, so the module appears as
# soon as pybind11 does (make run configures before the test packages are installed, make test
# after); ON requires pybind11; OFF leaves the module out. PULSE_PYTHON_MODULE is the decision.
set(PULSE_ENABLE_PYTHON AUTO CACHE STRING "Build the pulse Python module (import pulse): AUTO, ON or OFF")
set_property(CACHE PULSE_ENABLE_PYTHON PROPERTY STRINGS AUTO ON OFF)
set(PYTHON_EXECUTABLE ${PULSE_PYTHON})
if(PULSE_ENABLE_PYTHON STREQUAL "AUTO")
  find_package(pybind11 CONFIG QUIET)
  # Not in CUDA builds: the module is host code, untested under nvcc_wrapper.
  if(pybind11_FOUND AND NOT PULSE_KOKKOS_CUDA)
    set(PULSE_PYTHON_MODULE ON)
  else()
    set(PULSE_PYTHON_MODULE OFF)
    set(PULSE_PYTHON_MODULE_MISSING "pybind11 was not found (Debian: pybind11-dev python3-pybind11, in make test's list)")
    if(PULSE_KOKKOS_CUDA)
      set(PULSE_PYTHON_MODULE_MISSING "a CUDA build leaves it out (configure with -DPULSE_ENABLE_PYTHON=ON to try)")
    endif()
  endif()
elseif(PULSE_ENABLE_PYTHON)
  find_package(pybind11 CONFIG REQUIRED)
  set(PULSE_PYTHON_MODULE ON)
else()
  set(PULSE_PYTHON_MODULE OFF)
endif()
message(STATUS "pulse: Python module ${PULSE_PYTHON_MODULE} (PULSE_ENABLE_PYTHON=${PULSE_ENABLE_PYTHON})")

# ---- tests and benchmarks ----
if(PULSE_ENABLE_TESTS)
  find_package(GTest REQUIRED)
endif()
if(PULSE_ENABLE_BENCHMARKS)
  find_package(benchmark REQUIRED)
endif()
