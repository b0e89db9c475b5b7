#!/bin/sh
# The Debian packages pulse needs: `cmake/debian-deps.sh run` (make run: build pulse-train, run
# it, make the report) or `cmake/debian-deps.sh test` (make test: also the tests, benchmarks,
# fuzzers, Python module and local Slurm). As root on Debian it installs what is missing; as
# another user it prints the one `sudo apt-get install` command to run and exits 1. Without
# dpkg (not Debian) it names the packages and how to point CMake at a cluster's modules.
# PULSE_SKIP_DEPS=1 skips the check (your own builds or modules instead of Debian's packages).
set -eu

RUN_PACKAGES="build-essential cmake pkg-config git
libopenmpi-dev openmpi-bin libhdf5-openmpi-dev
libtrilinos-kokkos-dev libopenblas-dev
libzstd-dev liblz4-dev libxxhash-dev libsodium-dev
libcli11-dev nlohmann-json3-dev
python3 python3-numpy python3-h5py python3-matplotlib"

TEST_PACKAGES="libgtest-dev libbenchmark-dev hdf5-tools
clang libclang-rt-14-dev
python3-pytest python3-torch python3-zstandard python3-lz4 python3-xxhash
pybind11-dev python3-pybind11
slurm-wlm munge strace ninja-build"

case "${1:-test}" in
  run) PACKAGES="$RUN_PACKAGES" ;;
  test) PACKAGES="$RUN_PACKAGES $TEST_PACKAGES" ;;
  *) echo "usage: $0 run|test" >&2; exit 2 ;;
esac
[ "${PULSE_SKIP_DEPS:-0}" = 1 ] && exit 0

if ! command -v dpkg-query >/dev/null 2>&1; then
  cat <<MSG
pulse: not Debian; make sure these (or your cluster's modules for them) are present: $(echo $PACKAGES)
  Load MPI, parallel HDF5, Kokkos >= 3.4, zstd, lz4, xxHash, libsodium, OpenBLAS, CLI11 and
  nlohmann-json (for make test also GoogleTest and Google Benchmark) and point CMake at them, e.g.
    make build CMAKE_FLAGS="-DKokkos_ROOT=\$KOKKOS_ROOT -DHDF5_ROOT=\$HDF5_ROOT"
  with PKG_CONFIG_PATH covering zstd, lz4, xxHash, libsodium and OpenBLAS.
MSG
  exit 0
fi

missing=""
for p in $PACKAGES; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" = 0 ]; then
  echo "pulse: installing Debian packages:$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -q --no-install-recommends $missing
  exit 0
fi

echo "pulse: missing Debian packages; install them with: sudo apt-get install --no-install-recommends$missing (or PULSE_SKIP_DEPS=1 to use your own builds)" >&2
exit 1
