#!/bin/sh
# cmake/debian-deps.sh against fake dpkg-query, id and apt-get: a non-root user with packages
# missing gets the one `sudo apt-get install` line naming exactly those (exit 1); root gets them
# installed; Slurm, clang and torch are needed by `test` only; PULSE_SKIP_DEPS=1 and a machine
# without dpkg go on.
#   test_deps_script.sh cmake/debian-deps.sh
set -u
SCRIPT=$1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
FAKE=$WORK/bin
mkdir -p "$FAKE" "$WORK/nodpkg"
# dpkg-query -W -f=... PKG: installed unless PKG is in $FAKE_MISSING ("all": nothing is)
cat > "$FAKE/dpkg-query" <<'SH'
#!/bin/sh
for p; do pkg=$p; done
case " $FAKE_MISSING " in *" $pkg "*|" all ") exit 1 ;; esac
printf 'install ok installed'
SH
printf '#!/bin/sh\necho "$FAKE_UID"\n' > "$FAKE/id"
printf '#!/bin/sh\necho "$*" >> "$FAKE_APT_LOG"\n' > "$FAKE/apt-get"
chmod +x "$FAKE/dpkg-query" "$FAKE/id" "$FAKE/apt-get"
for tool in grep cat; do ln -s "$(command -v $tool)" "$WORK/nodpkg/$tool"; done

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# deps MODE UID MISSING: runs the script; sets rc, out, err
deps() {
  : > "$WORK/apt.log"
  FAKE_UID=$2 FAKE_MISSING=$3 FAKE_APT_LOG=$WORK/apt.log PATH="$FAKE:$PATH" sh "$SCRIPT" "$1" > "$WORK/out" 2> "$WORK/err"
  rc=$?
  out=$(cat "$WORK/out")
  err=$(cat "$WORK/err")
}

# a user: the exact command for what is missing, one line, exit 1
deps run 1000 "libzstd-dev slurm-wlm"
[ $rc = 1 ] || fail "user, run, missing: exit $rc"
[ "$err" = "pulse: missing Debian packages; install them with: sudo apt-get install --no-install-recommends libzstd-dev (or PULSE_SKIP_DEPS=1 to use your own builds)" ] ||
  fail "user, run: slurm-wlm is test-only, libzstd-dev is needed: '$err'"
[ -z "$out" ] && [ ! -s "$WORK/apt.log" ] || fail "user, run: printed '$out' or called apt-get"
deps test 1000 "libzstd-dev slurm-wlm"
[ $rc = 1 ] && [ "$(echo "$err" | wc -l)" = 1 ] || fail "user, test: exit $rc, '$err'"
echo "$err" | grep -q "sudo apt-get install --no-install-recommends libzstd-dev slurm-wlm (" || fail "user, test: '$err'"

# nothing missing: silent, exit 0
deps test 1000 ""
[ $rc = 0 ] && [ -z "$out$err" ] || fail "user, nothing missing: exit $rc, '$out$err'"

# root (.ci/run on a clean machine): installs what is missing
deps test 0 "python3-torch clang"
[ $rc = 0 ] || fail "root, test: exit $rc ($err)"
grep -qx "install -y -q --no-install-recommends clang python3-torch" "$WORK/apt.log" || fail "root, test: apt-get $(cat "$WORK/apt.log")"
deps run 0 "python3-torch clang"
[ $rc = 0 ] && [ ! -s "$WORK/apt.log" ] || fail "root, run: torch and clang are test-only: apt-get $(cat "$WORK/apt.log")"

# the run list is part of the test list; Slurm, clang, torch, GoogleTest are test-only
deps run 1000 all
run_list=$(echo "$err" | sed 's/.*--no-install-recommends \(.*\) (or.*/\1/')
deps test 1000 all
test_list=$(echo "$err" | sed 's/.*--no-install-recommends \(.*\) (or.*/\1/')
for p in $run_list; do
  case " $test_list " in *" $p "*) ;; *) fail "$p is in the run list but not the test list" ;; esac
done
for p in slurm-wlm clang python3-torch libgtest-dev pybind11-dev; do
  case " $run_list " in *" $p "*) fail "$p is test-only, yet in the run list" ;; esac
  case " $test_list " in *" $p "*) ;; *) fail "$p missing from the test list" ;; esac
done
for p in libopenmpi-dev libhdf5-openmpi-dev libtrilinos-kokkos-dev python3-h5py python3-matplotlib; do
  case " $run_list " in *" $p "*) ;; *) fail "$p missing from the run list" ;; esac
done

# PULSE_SKIP_DEPS=1: no check at all
PULSE_SKIP_DEPS=1 FAKE_UID=1000 FAKE_MISSING=all PATH="$FAKE:$PATH" sh "$SCRIPT" run > /dev/null 2>&1 || fail "PULSE_SKIP_DEPS=1 must exit 0"
# without dpkg: the package names and the cluster hint, exit 0
out=$(PATH="$WORK/nodpkg" /bin/sh "$SCRIPT" run 2>&1)
rc=$?
[ $rc = 0 ] && echo "$out" | grep -q "not Debian" && echo "$out" | grep -q "Kokkos_ROOT" || fail "without dpkg: exit $rc, '$out'"
# an unknown mode is an error
PATH="$FAKE:$PATH" sh "$SCRIPT" everything > /dev/null 2>&1 && fail "an unknown mode must fail"

[ $failures = 0 ] && echo "debian-deps.sh: all cases pass" || exit 1
