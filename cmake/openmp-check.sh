#!/bin/sh
# make test-openmp: pulse against a threaded Kokkos (OpenMP), built from the Kokkos 4.6.01 source
# release that CI keeps beside the clone (../shared/vendor; a user's clone has none: skipped).
#  1. OMP_BUILD: the tests whose code runs Kokkos kernels (label backend), with 2
#     OpenMP threads (cmake/test-targets.py builds only the targets they run).
#  2. OMP_BUILD-forced, configured with PULSE_FORCE_DEVICE_PATHS=ON: the host backends take the
#     kernels' device code paths (teams and TeamThreadRange reductions, element-wise scans), which
#     a GPU build runs and no CPU build otherwise would. Only the tests that run those kernels
#     (AdamW and its changed list, sparsity counts and compaction, the gate, patches, the meter, LoCo, the trainers,
#     the PyTorch oracles of AdamW and sparsity, pulse-train end to end): the other tests run
#     the same code as in step 1, and skipping them keeps `.ci/run` within its time budget.
#  3. kernel_digest prints the same lines in every combination: the Serial build (SERIAL_BUILD),
#     OpenMP at 1, 2 and 4 threads, Kokkos::Serial inside the OpenMP build, and the forced build
#     on Serial and on OpenMP at 1, 2 and 4 threads (each of those also with --check).
#   cmake/openmp-check.sh [SERIAL_BUILD] [OMP_BUILD]
set -eu
SERIAL=${1:-build}
OMP=${2:-build-omp}
FORCED=$OMP-forced
TARBALL=../shared/vendor/kokkos-4.6.01.tar.xz
if [ ! -f "$TARBALL" ]; then
  echo "pulse: $TARBALL not found (it sits beside CI's clone only): skipping the OpenMP build and tests"
  exit 0
fi
JOBS=$(nproc 2>/dev/null || echo 2)
# Threads may outnumber cores here: without these Kokkos warns on stderr (tests read stderr) and
# the OpenMP and OpenBLAS thread pools spin against each other.
export OMP_PROC_BIND=false OMP_WAIT_POLICY=passive OMP_NUM_THREADS=2
# Three more builds of pulse: recompile only what changed since the last run where ccache exists.
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

# 1. the OpenMP build
# shellcheck disable=SC2086
cmake -S . -B "$OMP" -DKokkos_ROOT="$KOKKOS/install" -DPULSE_ENABLE_BENCHMARKS=OFF -DPULSE_ENABLE_PYTHON=OFF \
  -DPULSE_FORCE_DEVICE_PATHS=OFF $LAUNCHER ${PULSE_PYTHON:+-DPULSE_PYTHON=$PULSE_PYTHON} >/dev/null
# The tests whose code runs Kokkos kernels (label backend, cmake/PulseTestHarness.cmake); only
# the targets they run are built.
OMP_SELECTION="-L backend"
# shellcheck disable=SC2086
cmake --build "$OMP" -j "$JOBS" --target $(${PULSE_PYTHON:-python3} cmake/test-targets.py "$OMP" $OMP_SELECTION)
# shellcheck disable=SC2086
(cd "$OMP" && ctest --output-on-failure -j "$JOBS" $OMP_SELECTION)

# 2. the OpenMP build that takes the device code paths
FORCED_TARGETS="kernel_digest test_adamw test_adamw_changes test_changed_list test_sparsity test_gate test_patch test_model test_sft_trainer test_loco
  test_train test_train_meter test_train_sync adamw_driver sparsity_driver pulse-train pulse-sft"
FORCED_TESTS='^(test_kernel_digest|test_adamw|test_adamw_changes|test_changed_list|test_sparsity|test_gate|test_patch|test_model|test_sft_trainer|test_loco_np[124]|test_train_np[124]|test_train_meter|test_train_sync_np[124]|test_adamw_torch|test_sparsity_torch|test_pulse_train)$'
# shellcheck disable=SC2086
cmake -S . -B "$FORCED" -DKokkos_ROOT="$KOKKOS/install" -DPULSE_ENABLE_BENCHMARKS=OFF -DPULSE_ENABLE_PYTHON=OFF \
  -DPULSE_FORCE_DEVICE_PATHS=ON $LAUNCHER ${PULSE_PYTHON:+-DPULSE_PYTHON=$PULSE_PYTHON} >/dev/null
# shellcheck disable=SC2086
cmake --build "$FORCED" -j "$JOBS" --target $FORCED_TARGETS
(cd "$FORCED" && ctest --output-on-failure -j "$JOBS" -R "$FORCED_TESTS")

# 3. The bit-exact kernels must not depend on the backend, the thread count or the code path.
"$SERIAL/tests/kernel_digest" >"$OMP/digest-serial.txt" 2>/dev/null
# same_digest NAME THREADS BINARY [--serial]: kernel_digest --check passes and prints the Serial build's lines.
same_digest() {
  name=$1 threads=$2
  shift 2
  if ! OMP_NUM_THREADS=$threads "$@" --check >"$OMP/digest-$name.txt" 2>"$OMP/digest-$name.log"; then
    echo "pulse: kernel_digest --check fails for $name:"
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
  same_digest "openmp-$threads" $threads "$OMP/tests/kernel_digest"
  same_digest "forced-openmp-$threads" $threads "$FORCED/tests/kernel_digest"
done
same_digest "openmp-build-serial" 1 "$OMP/tests/kernel_digest" --serial
same_digest "forced-serial" 1 "$FORCED/tests/kernel_digest" --serial
echo "pulse: OpenMP tests passed, also with the device code paths forced; kernel_digest identical for the" \
  "Serial build, OpenMP at 1, 2 and 4 threads and Serial, with and without the device code paths"
