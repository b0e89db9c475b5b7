#!/usr/bin/env bash
# GPU check of pulse on a machine with a CUDA GPU: builds pulse against a CUDA Kokkos (or takes
# an existing CUDA build), runs the kernel tests and the kernel benchmarks on the GPU, and checks
# that the GPU kernels reproduce the CPU kernels bit for bit. Everything it writes goes to DIR:
#   device.txt            nvidia-smi -L and the Kokkos configuration
#   gtest_<test>.json     GoogleTest results (--gtest_output=json) of each kernel test
#   bench_kernels.json    pulse-bench-kernels --benchmark_format=json (bytes/s, fraction of the
#                         bound in the label, copy_fraction = of the device-to-device deep_copy)
#   digest_gpu.txt        kernel_digest --check on the GPU (also compares with host loops)
#   digest_serial.txt     kernel_digest --check --serial: the same binary on Kokkos::Serial
#   digest_cpu.txt        kernel_digest in a CPU build, when one is available (see below)
#   *.log                 output of every step;  summary.txt  one line per step, PASS/FAIL/SKIP
# Exit status 0 when every step that ran passed. Aims to finish within 8 minutes (PULSE_GPU_DEADLINE_S).
#
#   tests/gpu/check.sh DIR
# Environment:
#   KOKKOS_CUDA_ROOT     install prefix of a Kokkos built with Kokkos_ENABLE_CUDA (its
#                        bin/nvcc_wrapper is the compiler); required unless PULSE_CUDA_BUILD is set.
#                        With CUDA 13 it must be Kokkos >= 4.7: 4.6.01 (CI's ../shared/vendor) does
#                        not compile against CUDA 13's runtime API (cudaMemAdvise, cudaMemPrefetchAsync,
#                        cudaGraphAddDependencies changed); with CUDA 12 4.6.01 is fine. Configure it
#                        with -DKokkos_ARCH_<GPU>=ON and -DCMAKE_CXX_FLAGS=-arch=sm_<cc> for CUDA 13.
#   PULSE_CUDA_ARCH      compute capability without the dot (90 for H100/H200); default: what
#                        nvidia-smi reports for the first GPU
#   PULSE_CUDA_BUILD     an existing CUDA build folder of this tree: used as it is, targets
#                        brought up to date (default: build-gpu-check under the repository)
#   PULSE_CPU_BUILD      a CPU build folder of this tree for the CPU digests; otherwise one is
#                        configured in build-gpu-check-cpu with KOKKOS_HOST_ROOT (or the system
#                        Kokkos) and only kernel_digest is built; the comparison is skipped if that fails
#   KOKKOS_HOST_ROOT     a host-only Kokkos for that CPU build (optional)
#   PULSE_CUDA_AWARE_MPI ON or OFF (default OFF) for a fresh CUDA configure
#   PULSE_GPU_JOBS       parallel compile jobs (default: cores, at most one per 12 GB of memory:
#                        nvcc's cicc can take 10 GB on the model sources)
#   PULSE_GPU_DEADLINE_S overall time limit in seconds (default 480)
#   PULSE_GPU_TESTS      the GoogleTest binaries to run (default: the kernel and model-layer tests)
#   PULSE_GPU_BENCH_SIZES benchmark sizes as a regex alternation (default 16777216|268435456)
#   MPIEXEC              MPI launcher for test_comm (default mpiexec)
set -u

if [ $# -ne 1 ]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
OUT=$(mkdir -p "$1" && cd "$1" && pwd) || { echo "check.sh: cannot create $1" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
START=$(date +%s)
DEADLINE=${PULSE_GPU_DEADLINE_S:-480}
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
FAILED=0

note() { echo "$*" | tee -a "$SUMMARY"; }
remaining() { echo $((DEADLINE - ($(date +%s) - START))); }

# step NAME COMMAND...: runs COMMAND with the time that is left, logs to NAME.log, records the result.
step() {
  local name=$1
  shift
  local left
  left=$(remaining)
  if [ "$left" -le 5 ]; then
    note "SKIP $name (deadline of ${DEADLINE}s reached)"
    FAILED=1
    return 1
  fi
  local t0 rc dt
  t0=$(date +%s)
  timeout "$left" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  dt=$(($(date +%s) - t0))
  if [ $rc -eq 0 ]; then
    note "PASS $name (${dt}s)"
  else
    if [ $rc -eq 124 ]; then
      note "FAIL $name (timed out after ${dt}s; see $name.log)"
    else
      note "FAIL $name (exit $rc, ${dt}s; see $name.log)"
    fi
    FAILED=1
  fi
  return $rc
}

default_jobs() {
  local cores mem_gb
  cores=$(nproc)
  mem_gb=$(awk '/MemTotal/ { print int($2 / 1048576) }' /proc/meminfo)
  local by_mem=$((mem_gb / 12))
  [ "$by_mem" -lt 1 ] && by_mem=1
  [ "$by_mem" -lt "$cores" ] && echo "$by_mem" || echo "$cores"
}
JOBS=${PULSE_GPU_JOBS:-$(default_jobs)}

# test_bf16 last: its host reference over all 2^32 floats takes a minute or two of CPU.
KERNEL_TESTS=${PULSE_GPU_TESTS:-test_adamw test_sparsity test_absorption test_gate test_patch test_gemm test_model_layers test_gpt_decoder test_bf16}
MPI_TESTS="test_comm test_comm_staged test_loco"
TARGETS="$KERNEL_TESTS $MPI_TESTS kernel_digest pulse-bench-kernels"

if command -v nvidia-smi > /dev/null; then nvidia-smi -L > "$OUT/device.txt" 2>&1; else echo "nvidia-smi not found" > "$OUT/device.txt"; fi

# ---- the CUDA build ----
CUDA_BUILD=${PULSE_CUDA_BUILD:-$ROOT/build-gpu-check}
if [ ! -f "$CUDA_BUILD/CMakeCache.txt" ]; then
  if [ -z "${KOKKOS_CUDA_ROOT:-}" ]; then
    echo "check.sh: set KOKKOS_CUDA_ROOT (a CUDA Kokkos install) or PULSE_CUDA_BUILD (a CUDA build)" >&2
    exit 2
  fi
  # nvcc_wrapper compiles for its default_arch when no -arch is given: sm_70 in Kokkos 4.6, which
  # CUDA 13 no longer supports, so CMake's first compiler check would fail. Name the GPU's own.
  CUDA_ARCH=${PULSE_CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. ')}
  step configure_cuda cmake -S "$ROOT" -B "$CUDA_BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DKokkos_ROOT="$KOKKOS_CUDA_ROOT" -DCMAKE_CXX_COMPILER="$KOKKOS_CUDA_ROOT/bin/nvcc_wrapper" \
    ${CUDA_ARCH:+"-DCMAKE_CXX_FLAGS=-arch=sm_$CUDA_ARCH"} \
    -DPULSE_CUDA_AWARE_MPI="${PULSE_CUDA_AWARE_MPI:-OFF}" || { note "cannot continue without a CUDA build"; exit 1; }
fi
if ! grep -q "^CMAKE_CXX_COMPILER:.*nvcc_wrapper" "$CUDA_BUILD/CMakeCache.txt"; then
  note "WARN $CUDA_BUILD does not look like a CUDA build (no nvcc_wrapper in its cache)"
fi
grep -E "^(Kokkos_DIR|CMAKE_CXX_COMPILER|PULSE_CUDA_AWARE_MPI)[:=]" "$CUDA_BUILD/CMakeCache.txt" >> "$OUT/device.txt"
# shellcheck disable=SC2086
step build_cuda cmake --build "$CUDA_BUILD" --parallel "$JOBS" --target $TARGETS ||
  note "some targets did not build; the steps below run what exists"

BIN="$CUDA_BUILD/tests"
BENCH="$CUDA_BUILD/apps/bench/pulse-bench-kernels"

# ---- bit identity, CPU against GPU: first, because it is the quickest and the most telling ----
if [ -x "$BIN/kernel_digest" ]; then
  step digest_gpu sh -c "'$BIN/kernel_digest' --check > '$OUT/digest_gpu.txt'"
  # The same binary on the host backend its Kokkos carries (Serial, unless that Kokkos was built
  # without it): CPU against GPU without a second build.
  KOKKOS_PREFIX=$(sed -n 's#^Kokkos_DIR:[A-Z]*=\(.*\)/lib[^/]*/cmake/Kokkos$#\1#p' "$CUDA_BUILD/CMakeCache.txt")
  if grep -qs "define KOKKOS_ENABLE_SERIAL" "$KOKKOS_PREFIX/include/KokkosCore_config.h"; then
    step digest_serial sh -c "'$BIN/kernel_digest' --check --serial > '$OUT/digest_serial.txt'" &&
      [ -s "$OUT/digest_gpu.txt" ] && step digest_serial_vs_gpu diff "$OUT/digest_serial.txt" "$OUT/digest_gpu.txt"
  else
    note "SKIP digest_serial (no Kokkos::Serial in $KOKKOS_PREFIX)"
  fi
fi
CPU_BUILD=${PULSE_CPU_BUILD:-}
if [ -z "$CPU_BUILD" ]; then
  CPU_BUILD=$ROOT/build-gpu-check-cpu
  if [ ! -f "$CPU_BUILD/CMakeCache.txt" ]; then
    step configure_cpu cmake -S "$ROOT" -B "$CPU_BUILD" -DCMAKE_BUILD_TYPE=Release -DPULSE_ENABLE_BENCHMARKS=OFF \
      ${KOKKOS_HOST_ROOT:+-DKokkos_ROOT="$KOKKOS_HOST_ROOT"}
  fi
fi
if [ -f "$CPU_BUILD/CMakeCache.txt" ]; then
  step build_cpu_digest cmake --build "$CPU_BUILD" --parallel "$(nproc)" --target kernel_digest
fi
if [ -x "$CPU_BUILD/tests/kernel_digest" ] && [ -s "$OUT/digest_gpu.txt" ]; then
  step digest_cpu sh -c "'$CPU_BUILD/tests/kernel_digest' > '$OUT/digest_cpu.txt'"
  step digest_cpu_vs_gpu diff "$OUT/digest_cpu.txt" "$OUT/digest_gpu.txt"
else
  note "SKIP digest_cpu_vs_gpu (no CPU build of kernel_digest; digest_gpu still compares with host loops)"
fi

# ---- kernel benchmarks: 2^24 and 2^28 elements by default ----
if [ -x "$BENCH" ]; then
  step bench_kernels "$BENCH" --benchmark_format=json --benchmark_out="$OUT/bench_kernels.json" \
    --benchmark_out_format=json "--benchmark_filter=/(${PULSE_GPU_BENCH_SIZES:-16777216|268435456})/"
  if [ -s "$OUT/bench_kernels.json" ] && command -v python3 > /dev/null; then
    python3 - "$OUT/bench_kernels.json" >> "$SUMMARY" << 'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print("bandwidths (target on a GPU: AdamW and DiffCompact copy_fraction >= 0.60)")
print(f"copy_bytes_per_second {float(d['context']['copy_bytes_per_second']) / 1e9:.1f} GB/s, "
      f"triad {float(d['context']['triad_bytes_per_second']) / 1e9:.1f} GB/s")
for b in d["benchmarks"]:
    if b["name"].split("/")[0] in ("BM_AdamWMixed", "BM_AdamWBf16", "BM_DiffCompact", "BM_DiffCount", "BM_CastToBf16"):
        print(f"  {b['name']:<40} {b['bytes_per_second'] / 1e9:8.1f} GB/s  copy_fraction {b['copy_fraction']:.2f}")
EOF
  fi
else
  note "FAIL bench_kernels (not built)"
  FAILED=1
fi

# ---- GoogleTest on the GPU: the collectives with device views, then the kernel tests ----
MPIEXEC=${MPIEXEC:-mpiexec}
MPIEXEC_FLAGS=""
if "$MPIEXEC" --version 2>/dev/null | grep -q "Open MPI\|OpenRTE"; then
  MPIEXEC_FLAGS="--oversubscribe"
  [ "$(id -u)" = 0 ] && MPIEXEC_FLAGS="$MPIEXEC_FLAGS --allow-run-as-root"
fi
for t in $MPI_TESTS; do
  if [ -x "$BIN/$t" ]; then
    # shellcheck disable=SC2086
    step "gtest_${t}_np1" "$MPIEXEC" -n 1 $MPIEXEC_FLAGS "$BIN/$t" --gtest_output="json:$OUT/gtest_${t}_np1.json"
    # shellcheck disable=SC2086
    step "${t}_np2" "$MPIEXEC" -n 2 $MPIEXEC_FLAGS "$BIN/$t"
  else
    note "FAIL $t (not built)"
    FAILED=1
  fi
done
for t in $KERNEL_TESTS; do
  if [ -x "$BIN/$t" ]; then
    step "gtest_$t" "$BIN/$t" --gtest_output="json:$OUT/gtest_$t.json"
  else
    note "FAIL gtest_$t (not built)"
    FAILED=1
  fi
done

note "total $(($(date +%s) - START))s; results in $OUT"
exit $FAILED
