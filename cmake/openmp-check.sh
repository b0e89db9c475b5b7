#!/bin/sh
# make test-openmp: pulse against a threaded Kokkos (OpenMP), built from the Kokkos 4.6.01 source
# release that CI keeps beside the clone (../shared/vendor; a user's clone has none: skipped).
#  1. OMP_BUILD: the tests whose code runs Kokkos kernels (label backend), with 2 OpenMP threads
#     (cmake/test-targets.py builds only the targets they and step 2 run; with Ninja where it is
#     installed, since CMake's Makefiles build the targets named on one command one at a time).
#     The kernel unit tests (tests/kernels) run each case on Kokkos::Serial and on Kokkos::OpenMP,
#     each on the host code paths and with the device paths forced (tests/support/backends.hpp),
#     and compare the bits across all four.
#  2. The same build with PULSE_FORCE_DEVICE_PATHS=1 in the environment: the host backends take the
#     kernels' device code paths (teams and TeamThreadRange reductions, element-wise scans), which
#     a GPU build runs and no CPU build otherwise would. Only the tests that run those kernels
#     outside the kernel unit tests, which ran both paths in step 1 (patches, the meter, LoCo, the
#     trainers, the PyTorch oracles of AdamW and sparsity; test_code_paths reads the variable):
#     the other tests run the same code as in step 1, and skipping them keeps `.ci/run` within its
#     time budget. mpirun's local ranks inherit the variable.
#  3. kernel_digest prints the same lines in every combination: the Serial build (SERIAL_BUILD),
#     OpenMP at 1, 2 and 4 threads and Kokkos::Serial inside the OpenMP build, each on the host
#     and on the device code paths (and each with --check, which also runs the other code path).
#   cmake/openmp-check.sh [SERIAL_BUILD] [OMP_BUILD]
set -eu
SERIAL=${1:-build}
OMP=${2:-build-omp}
TARBALL=../shared/vendor/kokkos-4.6.01.tar.xz
if [ ! -f "$TARBALL" ]; then
  echo "pulse: $TARBALL not found (it sits beside CI's clone only): skipping the OpenMP build and tests"
  exit 0
fi
JOBS=$(nproc 2>/dev/null || echo 2)
# Threads may outnumber cores here: without these Kokkos warns on stderr (tests read stderr) and
# the OpenMP and OpenBLAS thread pools spin against each other.
export OMP_PROC_BIND=false OMP_WAIT_POLICY=passive OMP_NUM_THREADS=2
# Step 1 takes the host backends' own code paths, whatever the caller's environment says.
unset PULSE_FORCE_DEVICE_PATHS
# One more build of pulse: recompile only what changed since the last run where ccache exists.
LAUNCHER=""
if command -v ccache >/dev/null 2>&1; then
  LAUNCHER="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache"
fi
KOKKOS=$PWD/$OMP/kokkos
if [ ! -f "$KOKKOS/install/lib/cmake/Kokkos/KokkosConfig.cmake" ] && [ ! -f "$KOKKOS/install/lib64/cmake/Kokkos/KokkosConfig.cmake" ]; then
  mkdir -p "$KOKKOS"
  tar -xJf "$TARBALL" -C "$KOKKOS"
  # shellcheck disable=SC2086
  cmake -S "$KOKKOS/kokkos-4.6.01" -B "$KOKKOS/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=17 \
    -DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_OPENMP=ON -DKokkos_ENABLE_TESTS=OFF $LAUNCHER \
    -DCMAKE_INSTALL_PREFIX="$KOKKOS/install" >/dev/null
  cmake --build "$KOKKOS/build" -j "$JOBS" >/dev/null
  cmake --install "$KOKKOS/build" >/dev/null
fi

# 1. the OpenMP build (a folder configured before keeps its generator)
GENERATOR=""
if [ ! -f "$OMP/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1; then
  GENERATOR="-G Ninja"
fi
# shellcheck disable=SC2086
cmake -S . -B "$OMP" $GENERATOR -DKokkos_ROOT="$KOKKOS/install" -DPULSE_ENABLE_BENCHMARKS=OFF -DPULSE_ENABLE_PYTHON=OFF \
  $LAUNCHER ${PULSE_PYTHON:+-DPULSE_PYTHON=$PULSE_PYTHON} >/dev/null
# The tests whose code runs Kokkos kernels (label backend, cmake/PulseTestHarness.cmake). Only
# the targets they run are built, and those of step 2's tests (the PyTorch oracles are not backend
# tests).
OMP_SELECTION="-L backend"
# Step 2's tests: those whose kernels have a device branch (label device_paths).
FORCED_SELECTION="-L device_paths"
PYTHON=${PULSE_PYTHON:-python3}
# shellcheck disable=SC2046
cmake --build "$OMP" -j "$JOBS" --target $($PYTHON cmake/test-targets.py "$OMP" -L '^(backend|device_paths)$')
# shellcheck disable=SC2086
(cd "$OMP" && ctest --output-on-failure -j "$JOBS" $OMP_SELECTION)

# 2. the device code paths, in the same build (test_code_paths fails unless the variable forces them)
# shellcheck disable=SC2086
(cd "$OMP" && PULSE_FORCE_DEVICE_PATHS=1 ctest --output-on-failure -j "$JOBS" $FORCED_SELECTION)

# 3. The bit-exact kernels must not depend on the backend, the thread count or the code path.
"$SERIAL/tests/kernel_digest" >"$OMP/digest-serial.txt" 2>/dev/null
# same_digest NAME THREADS FORCED BINARY [--serial]: kernel_digest --check passes, takes the code
# path that FORCED (0 or 1, the value of PULSE_FORCE_DEVICE_PATHS) names, and prints the Serial
# build's lines.
same_digest() {
  name=$1 threads=$2 forced=$3
  shift 3
  if ! OMP_NUM_THREADS=$threads PULSE_FORCE_DEVICE_PATHS=$forced "$@" --check >"$OMP/digest-$name.txt" \
    2>"$OMP/digest-$name.log"; then
    echo "pulse: kernel_digest --check fails for $name:"
    cat "$OMP/digest-$name.log"
    exit 1
  fi
  path="host code paths"
  [ "$forced" = 0 ] || path="device code paths (forced)"
  if ! grep -q "$path" "$OMP/digest-$name.log"; then
    echo "pulse: kernel_digest for $name does not take the $path:"
    cat "$OMP/digest-$name.log"
    exit 1
  fi
  if ! cmp -s "$OMP/digest-serial.txt" "$OMP/digest-$name.txt"; then
    echo "pulse: kernel_digest differs between the Serial build and $name:"
    diff "$OMP/digest-serial.txt" "$OMP/digest-$name.txt" || true
    exit 1
  fi
}
for threads in 1 2 4; do
  same_digest "openmp-$threads" "$threads" 0 "$OMP/tests/kernel_digest"
  same_digest "forced-openmp-$threads" "$threads" 1 "$OMP/tests/kernel_digest"
done
same_digest "openmp-build-serial" 1 0 "$OMP/tests/kernel_digest" --serial
same_digest "forced-serial" 1 1 "$OMP/tests/kernel_digest" --serial
echo "pulse: OpenMP tests passed, also with the device code paths forced; kernel_digest identical for the" \
  "Serial build, OpenMP at 1, 2 and 4 threads and Serial, with and without the device code paths"
