# shellcheck shell=bash
# Shared by the jobs/*.sbatch scripts (sourced, not run). One measurement run with:
#  - the launcher: srun --mpi=pmix inside a Slurm allocation when this Slurm has PMIx, else mpirun
#    (with --oversubscribe, and --allow-run-as-root when root);
#  - time limits: the scripts ask for `--signal=B:USR1@120`, which Slurm delivers to this batch
#    shell only (B:), not to the ranks. The trap below forwards it as SIGUSR1 to srun or mpirun,
#    both of which pass SIGUSR1 on to every rank; pulse-train then checkpoints at the end of the
#    current step and exits 75. SIGTERM (scancel, or the time limit itself) is forwarded the same
#    way, as SIGUSR1, because mpirun answers SIGTERM by killing the ranks;
#  - requeue: exit code 75 -> `scontrol requeue $SLURM_JOB_ID`; the requeued job finds
#    RUN.ckpt/LATEST and adds --resume, so the same HDF5 file continues.
#
# Environment (all optional):
#   PULSE_ROOT    repository root (default: the submit folder, so submit from the repository root)
#   PULSE_BUILD   build folder (default $PULSE_ROOT/build); the app is $PULSE_BUILD/apps/pulse-train
#   PULSE_RUNS    where runs/<job-id>/ folders go (default $PULSE_ROOT/runs)
#   PULSE_CONFIG  run config (default jobs/configs/default.toml)
#   PULSE_ARGS    extra pulse-train flags, word-split (e.g. "--steps 50 --quiet")
#   PULSE_NP      ranks (default $SLURM_NTASKS, else 2)
#   PULSE_LAUNCHER  srun or mpirun, to override the detection
#   PULSE_PYTHON  python with h5py, numpy, matplotlib for the report (default /usr/bin/python3)
set -uo pipefail

PULSE_BUILD=${PULSE_BUILD:-$PULSE_ROOT/build}
PULSE_RUNS=${PULSE_RUNS:-$PULSE_ROOT/runs}
PULSE_CONFIG=${PULSE_CONFIG:-jobs/configs/default.toml}
PULSE_PYTHON=${PULSE_PYTHON:-/usr/bin/python3}
PULSE_NP=${PULSE_NP:-${SLURM_NTASKS:-2}}
PULSE_TRAIN=$PULSE_BUILD/apps/pulse-train
cd "$PULSE_ROOT" || exit 1
# pulse-train runs need the app and a config (measure-checkpoints.sbatch needs neither).
if [[ ${PULSE_JOB_APP:-pulse-train} == pulse-train ]]; then
  [[ -x $PULSE_TRAIN ]] || { echo "pulse-job: no $PULSE_TRAIN (build it, or set PULSE_BUILD)" >&2; exit 1; }
  [[ -f $PULSE_CONFIG ]] || { echo "pulse-job: no config $PULSE_CONFIG" >&2; exit 1; }
fi

# Folder of this job's outputs: runs/<array-job-id> for arrays, runs/<job-id> for single jobs.
pulse_job_dir() {
  local id=${SLURM_ARRAY_JOB_ID:-${SLURM_JOB_ID:-local-$(date +%Y%m%d-%H%M%S)-$$}}
  echo "$PULSE_RUNS/$id"
}

pulse_launcher() {
  local kind=${PULSE_LAUNCHER:-}
  if [[ -z $kind ]]; then
    kind=mpirun
    if [[ -n ${SLURM_JOB_ID:-} ]] && command -v srun >/dev/null && srun --mpi=list 2>&1 | grep -q pmix; then
      kind=srun
    fi
  fi
  if [[ $kind == srun ]]; then
    LAUNCH=(srun --mpi=pmix --ntasks="$PULSE_NP")
  else
    LAUNCH=(mpirun -n "$PULSE_NP" --oversubscribe)
    [[ $(id -u) == 0 ]] && LAUNCH+=(--allow-run-as-root)
  fi
}

_pulse_child=""
_pulse_forward() {
  [[ -n $_pulse_child ]] && kill -0 "$_pulse_child" 2>/dev/null || return 0
  echo "pulse-job: $1 received, asking pulse-train to checkpoint and stop ($(date -u +%FT%TZ))" >&2
  kill -USR1 "$_pulse_child"
}

# pulse_run OUT.h5 [pulse-train flags...]: one run of the app; resumes when OUT.ckpt/LATEST exists,
# requeues the job on exit code 75. Returns the app's exit code.
pulse_run() {
  local out=$1
  shift
  local ckpt=${out%.h5}.ckpt
  mkdir -p "$(dirname "$out")"
  # shellcheck disable=SC2206
  local args=(--config "$PULSE_CONFIG" --out "$out" "$@" ${PULSE_ARGS:-})
  if [[ -f $ckpt/LATEST ]]; then
    args+=(--resume)
  elif [[ -e $out ]]; then
    args+=(--overwrite)  # an earlier attempt of this job died before its first checkpoint
  fi
  pulse_launcher
  echo "pulse-job: ${LAUNCH[*]} $PULSE_TRAIN ${args[*]} (restart ${SLURM_RESTART_COUNT:-0})" >&2
  trap '_pulse_forward USR1' USR1
  trap '_pulse_forward TERM' TERM
  "${LAUNCH[@]}" "$PULSE_TRAIN" "${args[@]}" &
  _pulse_child=$!
  local rc
  while :; do
    wait "$_pulse_child"
    rc=$?
    # wait returns >128 when a trapped signal interrupts it; the child still runs then
    ((rc > 128)) && kill -0 "$_pulse_child" 2>/dev/null && continue
    break
  done
  _pulse_child=""
  # The run is over: a time-limit USR1 arriving now (during the report) must not kill the shell.
  trap '' USR1
  trap - TERM
  if ((rc == 75)); then
    if [[ -n ${SLURM_JOB_ID:-} ]]; then
      echo "pulse-job: checkpointed, requeueing job $SLURM_JOB_ID" >&2
      scontrol requeue "$SLURM_JOB_ID"
    else
      echo "pulse-job: checkpointed; run the same command again to resume" >&2
    fi
  fi
  return $rc
}

# pulse_report DIR PATTERN: marks this task's run done and builds DIR/report from every finished
# run in DIR matching PATTERN (a glob such as 'seed-*.h5'). Array tasks take a lock, so the one
# that finishes last writes the report over all runs.
pulse_report() {
  local dir=$1 pattern=$2 f
  local files=()
  (
    flock 9
    for f in "$dir"/$pattern; do [[ -f ${f%.h5}.done ]] && files+=("$f"); done
    ((${#files[@]})) || exit 0
    echo "pulse-job: report over ${#files[@]} run(s) -> $dir/report" >&2
    HDF5_USE_FILE_LOCKING=FALSE PYTHONPATH="$PULSE_ROOT/analysis${PYTHONPATH:+:$PYTHONPATH}" \
      "$PULSE_PYTHON" -m pulse_analysis report "${files[@]}" -o "$dir/report"
  ) 9>"$dir/.report.lock"
}

# pulse_sweep PREFIX FLAG VALUES...: one run per value, PREFIX-VALUE.h5 with `FLAG VALUE`
# (a value "a:b" with FLAG "--x:--y" gives --x a --y b). Inside an array job the task id picks the
# value; without Slurm every value runs in turn. Then the report over the sweep. A script may
# define pulse_sweep_flags VALUE: it prepares what the value needs and prints more flags.
pulse_sweep() {
  local prefix=$1 flag=$2
  shift 2
  local values=("$@") dir ids i rc=0
  dir=$(pulse_job_dir)
  if [[ -n ${SLURM_ARRAY_TASK_ID:-} ]]; then
    ids=("$SLURM_ARRAY_TASK_ID")
    ((SLURM_ARRAY_TASK_ID < ${#values[@]})) ||
      { echo "pulse-job: array task $SLURM_ARRAY_TASK_ID but only ${#values[@]} values: ${values[*]}" >&2; return 1; }
  else
    mapfile -t ids < <(seq 0 $((${#values[@]} - 1)))
  fi
  for i in "${ids[@]}"; do
    local v=${values[$i]} flags=() name
    IFS=: read -r -a fs <<<"$flag"
    IFS=: read -r -a vs <<<"$v"
    for j in "${!fs[@]}"; do flags+=("${fs[$j]}" "${vs[$j]}"); done
    if declare -F pulse_sweep_flags >/dev/null; then
      local more
      more=$(pulse_sweep_flags "$v") || return 1
      read -r -a more <<<"$more"
      flags+=("${more[@]}")
    fi
    name=$prefix-${v//:/-}
    pulse_run "$dir/$name.h5" "${flags[@]}" || { rc=$?; return $rc; }
    touch "$dir/$name.done"
  done
  pulse_report "$dir" "$prefix-*.h5"
}
