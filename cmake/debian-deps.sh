#!/bin/sh
# Installs the Debian packages pulse needs (make deps). As root on Debian it installs what is
# missing; elsewhere it prints the list and how to point CMake at a cluster's own modules.
set -eu

PACKAGES="build-essential cmake pkg-config git
libopenmpi-dev openmpi-bin libhdf5-openmpi-dev hdf5-tools
libtrilinos-kokkos-dev libopenblas-dev
libzstd-dev liblz4-dev libxxhash-dev libsodium-dev
libcli11-dev nlohmann-json3-dev libgtest-dev libbenchmark-dev
clang libclang-rt-14-dev
python3 python3-numpy python3-h5py python3-matplotlib python3-pytest python3-torch python3-zstandard
pybind11-dev python3-pybind11
slurm-wlm munge strace"

missing=""
if command -v dpkg-query >/dev/null 2>&1; then
  for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
  done
else
  missing="$(echo $PACKAGES)"
fi
[ -z "$missing" ] && exit 0

if [ -f /etc/debian_version ] && [ "$(id -u)" = 0 ]; then
  echo "pulse: installing Debian packages:$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -q --no-install-recommends $missing
  exit 0
fi

cat <<MSG
pulse: these Debian packages are missing:$missing
  On Debian, as root:  apt-get install --no-install-recommends$missing
  On a cluster, load the modules instead (MPI, parallel HDF5, Kokkos >= 3.4, zstd, lz4,
  xxHash, libsodium, OpenBLAS, CLI11, nlohmann-json, GoogleTest, Google Benchmark) and point
  CMake at them, e.g.
    make build CMAKE_FLAGS="-DKokkos_ROOT=\$KOKKOS_ROOT -DHDF5_ROOT=\$HDF5_ROOT"
  with PKG_CONFIG_PATH covering zstd, lz4, xxHash, libsodium and OpenBLAS.
MSG
[ -f /etc/debian_version ] && exit 1
exit 0
