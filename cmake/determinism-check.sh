#!/bin/sh
# The determinism tests (ctest label "determinism": rows across batch splits, ranks and threads,
# decoder against the full forward, trainer against sampler logprobs, kernel digests) once per
# OpenBLAS kernel set this CPU can run, at 1 and 2 BLAS threads: an AVX2 machine and an AVX-512
# machine then check the same thing. Usage: cmake/determinism-check.sh BUILD_DIR
set -eu
BUILD=${1:?usage: $0 BUILD_DIR}
sets=""
grep -qw avx2 /proc/cpuinfo 2>/dev/null && sets="$sets Haswell"
grep -qw avx512f /proc/cpuinfo 2>/dev/null && sets="$sets SkylakeX"
[ -n "$sets" ] || sets=" default"
for coretype in $sets; do
  for threads in 1 2; do
    echo "pulse: determinism tests with OPENBLAS_CORETYPE=$coretype OPENBLAS_NUM_THREADS=$threads"
    [ "$coretype" = default ] && kernels="" || kernels="OPENBLAS_CORETYPE=$coretype"
    (cd "$BUILD" && env $kernels OPENBLAS_NUM_THREADS=$threads ctest -L determinism --output-on-failure -j 2)
  done
done
