# Every dependency of pulse, found the same way on Debian and on a cluster's modules.
# Point CMake at other installs with <Pkg>_ROOT (Kokkos_ROOT, HDF5_ROOT, MPI_HOME) or
# PKG_CONFIG_PATH (OpenBLAS, zstd, lz4, xxHash, libsodium).

include(PulseKokkos)

# ---- MPI and parallel HDF5 ----
find_package(MPI REQUIRED COMPONENTS C CXX)
set(HDF5_PREFER_PARALLEL TRUE)
find_package(HDF5 REQUIRED COMPONENTS C)
if(NOT HDF5_IS_PARALLEL)
  message(FATAL_ERROR "pulse: HDF5 at ${HDF5_INCLUDE_DIRS} is serial; pulse needs parallel HDF5 (Debian: libhdf5-openmpi-dev, or HDF5_ROOT=<parallel install>)")
endif()

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

# ---- the Python module (pybind11): quiet find, option defaulting to found, then required ----
set(PYTHON_EXECUTABLE ${PULSE_PYTHON})
# Off by default in CUDA builds: the module is host code, untested under nvcc_wrapper.
find_package(pybind11 CONFIG QUIET)
set(_pulse_python_default OFF)
if(pybind11_FOUND AND NOT PULSE_KOKKOS_CUDA)
  set(_pulse_python_default ON)
endif()
option(PULSE_ENABLE_PYTHON "Build the pulse Python module (import pulse; needs pybind11)" ${_pulse_python_default})
if(PULSE_ENABLE_PYTHON)
  find_package(pybind11 CONFIG REQUIRED)
endif()

# ---- tests and benchmarks ----
if(PULSE_ENABLE_TESTS)
  find_package(GTest REQUIRED)
endif()
if(PULSE_ENABLE_BENCHMARKS)
  find_package(benchmark REQUIRED)
endif()
