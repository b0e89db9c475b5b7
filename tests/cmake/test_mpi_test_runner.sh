#!/bin/sh
# cmake/mpi-test.sh against a fake launcher: a run whose tests all passed but which Open MPI
# flagged "exiting improperly" is run once more and passes only if the second run does; a failed
# test, a plain failure, or the flag twice fails at once with the launcher's status.
#   test_mpi_test_runner.sh cmake/mpi-test.sh
set -u
RUNNER=$1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# fake MODE FLAGGED_RUNS: counts its runs in $WORK/runs; prints gtest's (coloured) verdict for
# MODE (passed/failed/crashed) and, for its first FLAGGED_RUNS runs, Open MPI's message with exit 1
cat > "$WORK/fake" <<'SH'
#!/bin/sh
runs=$(($(cat "$RUNS" 2>/dev/null || echo 0) + 1)); echo $runs > "$RUNS"
case $1 in
  passed) printf '\033[0;32m[  PASSED  ] \033[m7 tests.\n' ;;
  failed) printf '\033[0;32m[  PASSED  ] \033[m6 tests.\n\033[0;31m[  FAILED  ] \033[mA.B\n' ;;
  rankfailed) printf '\033[0;32m[  PASSED  ] \033[m7 tests.\n[rank 1] A.B failed at x.cpp:3\n' ;;
  crashed) exit 139 ;;
esac
if [ "$runs" -le "$2" ]; then
  echo "mpiexec has exited due to process rank 0 with PID 0 on node vm exiting improperly."; exit 1
fi
[ "$1" = passed ] || exit 1
SH
chmod +x "$WORK/fake"

failures=0
# expect MODE FLAGGED_RUNS STATUS RUNS: the runner's exit status and how often it ran the command
expect() {
  rm -f "$WORK/runs"
  RUNS=$WORK/runs sh "$RUNNER" "$WORK/fake" "$1" "$2" > "$WORK/out" 2>&1
  status=$?
  runs=$(cat "$WORK/runs")
  if [ "$status" -ne "$3" ] || [ "$runs" -ne "$4" ]; then
    echo "FAIL: $1 flagged $2 times: exit $status after $runs runs, expected exit $3 after $4"
    cat "$WORK/out"
    failures=$((failures + 1))
  fi
}
expect passed 0 0 1       # a clean pass runs once
expect passed 1 0 2       # flagged after passing: once more, and that run decides
expect passed 2 1 2       # flagged twice: fails
expect failed 1 1 1       # a failed test is never rerun
expect rankfailed 1 1 1   # nor a failure another rank reported
expect crashed 0 139 1    # nor a crash
[ "$failures" -eq 0 ] && echo "mpi-test.sh: 6 cases as expected"
exit "$failures"
