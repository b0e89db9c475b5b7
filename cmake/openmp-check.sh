#!/bin/sh
# make test-openmp: pulse against a threaded Kokkos (OpenMP), built from the Kokkos 4.6.01 source
# release that CI keeps beside the clone (../shared/vendor; a user's clone has none: skipped).
# Runs the unit, MPI and app tests with 2 OpenMP threads and checks that kernel_digest prints the
# same digests with the Serial build (build/) and with OpenMP at 1, 2 and 4 threads.
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
KOKKOS=$PWD/$OMP/kokkos
if [ ! -f "$KOKKOS/install/lib/cmake/Kokkos/KokkosConfig.cmake" ] && [ ! -f "$KOKKOS/install/lib64/cmake/Kokkos/KokkosConfig.cmake" ]; then
  mkdir -p "$KOKKOS"
  tar -xJf "$TARBALL" -C "$KOKKOS"
  cmake -S "$KOKKOS/kokkos-4.6.01" -B "$KOKKOS/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=17 \
    -DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_OPENMP=ON -DKokkos_ENABLE_TESTS=OFF \
    -DCMAKE_INSTALL_PREFIX="$KOKKOS/install" >/dev/null
  cmake --build "$KOKKOS/build" -j "$JOBS" >/dev/null
  cmake --install "$KOKKOS/build" >/dev/null
fi
cmake -S . -B "$OMP" -DKokkos_ROOT="$KOKKOS/install" -DPULSE_ENABLE_BENCHMARKS=OFF -DPULSE_ENABLE_PYTHON=OFF \
  ${PULSE_PYTHON:+-DPULSE_PYTHON=$PULSE_PYTHON} >/dev/null
cmake --build "$OMP" -j "$JOBS"
(cd "$OMP" && ctest --output-on-failure -j "$JOBS" -L 'unit|mpi|app' -E 'fuzz|slurm|install|compile_fail|random_kill|pulse_measure')

# The bit-exact kernels must not depend on the backend or the thread count.
"$SERIAL/tests/kernel_digest" >"$OMP/digest-serial.txt" 2>/dev/null
for threads in 1 2 4; do
  OMP_NUM_THREADS=$threads "$OMP/tests/kernel_digest" >"$OMP/digest-openmp-$threads.txt" 2>/dev/null
  if ! cmp -s "$OMP/digest-serial.txt" "$OMP/digest-openmp-$threads.txt"; then
    echo "pulse: kernel_digest differs between Serial and OpenMP at $threads threads:"
    diff "$OMP/digest-serial.txt" "$OMP/digest-openmp-$threads.txt" || true
    exit 1
  fi
done
echo "pulse: OpenMP tests passed; kernel_digest identical for Serial and OpenMP at 1, 2 and 4 threads"
