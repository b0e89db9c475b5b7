# shellcheck shell=bash
# Shared by the jobs/*.sbatch scripts (sourced, not run). One measurement run with:
#  - the launcher: srun --mpi=pmix inside a Slurm allocation when this Slurm has PMIx, else mpirun
#    (with --oversubscribe, and --allow-run-as-root when root);
#  - time limits: the scripts ask for `--signal=B:USR1@120`, which Slurm delivers to this batch
#    shell only (B:), not to the ranks. The trap below forwards it as SIGUSR1 to srun or mpirun,
#    both of which pass SIGUSR1 on to every rank; pulse-train then checkpoints at the end of the
#    current step and exits 75 (during its start-up: after checkpointing the initial state as
#    step 0). SIGTERM (scancel, or the time limit itself) is forwarded the same way, as SIGUSR1,
#    because mpirun answers SIGTERM by killing the ranks. A signal before pulse-train starts, or
#    one that kills it in the instant before its handlers are set, also requeues;
#  - requeue: exit code 75 -> `scontrol requeue $SLURM_JOB_ID`; the requeued job finds
#    RUN.ckpt/LATEST and adds --resume, so the same HDF5 file continues (without a checkpoint it
#    starts the run afresh).
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
    # --kill-on-bad-exit: a rank that dies takes the others down instead of leaving them in MPI.
    LAUNCH=(srun --mpi=pmix --ntasks="$PULSE_NP" --kill-on-bad-exit=1)
  else
    LAUNCH=(mpirun -n "$PULSE_NP" --oversubscribe)
    [[ $(id -u) == 0 ]] && LAUNCH+=(--allow-run-as-root)
  fi
}

# A stop signal may come at any moment, from the job's first second on (Slurm delivers --signal
# up to a minute early), so the traps are set as soon as this file is sourced. A stop that comes
# before pulse-train runs is remembered: pulse_run then requeues without starting it.
_pulse_child=""
_pulse_stop=""
_pulse_forward() {
  _pulse_stop=$1
  echo "pulse-job: $1 received ${SECONDS} s into the job script, asking pulse-train to checkpoint and stop ($(date -u +%FT%TZ))" >&2
  _pulse_deliver
}
# SIGUSR1 to the launcher, which passes it to every rank (called again right after the launch,
# for a stop that came between the launch and `_pulse_child=$!`), and again every 2 s until the
# launcher exits, from a background loop: srun drops a signal that reaches it before its ranks
# run (seen on a loaded node), and pulse-train takes repeats as one. A rank signalled in the
# instant between its exec and main, before pulse-train sets its handlers, dies of it: pulse_run
# then requeues (nothing was done that a checkpoint does not hold).
_pulse_resender=""
_pulse_deliver() {
  [[ -n $_pulse_child && -z $_pulse_resender ]] && kill -0 "$_pulse_child" 2>/dev/null || return 0
  local child=$_pulse_child
  (
    trap '' USR1  # Slurm signals every process of the batch step, this loop included
    while kill -USR1 "$child" 2>/dev/null; do sleep 2; done
  ) &
  _pulse_resender=$!
}
trap '_pulse_forward USR1' USR1
trap '_pulse_forward TERM' TERM

# Requeues this Slurm job (or tells the user to run again); returns 75.
_pulse_requeue() {
  if [[ -n ${SLURM_JOB_ID:-} ]]; then
    echo "pulse-job: $1, requeueing job $SLURM_JOB_ID" >&2
    scontrol requeue "$SLURM_JOB_ID"
  else
    echo "pulse-job: $1; run the same command again to continue" >&2
  fi
  return 75
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
  trap '_pulse_forward USR1' USR1  # again: an earlier pulse_run of a sweep ended by ignoring USR1
  trap '_pulse_forward TERM' TERM
  if [[ -n $_pulse_stop ]]; then
    _pulse_requeue "stopped by $_pulse_stop before pulse-train started"
    return
  fi
  echo "pulse-job: ${LAUNCH[*]} $PULSE_TRAIN ${args[*]} (restart ${SLURM_RESTART_COUNT:-0})" >&2
  "${LAUNCH[@]}" "$PULSE_TRAIN" "${args[@]}" &
  _pulse_child=$!
  [[ -n $_pulse_stop ]] && _pulse_deliver
  local rc
  while :; do
    wait "$_pulse_child"
    rc=$?
    # wait returns >128 when a trapped signal interrupts it; the child still runs then
    ((rc > 128)) && kill -0 "$_pulse_child" 2>/dev/null && continue
    break
  done
  _pulse_child=""
  [[ -n $_pulse_resender ]] && kill "$_pulse_resender" 2>/dev/null
  _pulse_resender=""
  # The run is over: a time-limit USR1 arriving now (during the report) must not kill the shell.
  trap '' USR1
  trap - TERM
  if ((rc == 75)); then
    # pulse-train checkpointed (or, stopped during its SFT warm start, wrote nothing): the next
    # attempt resumes when OUT.ckpt/LATEST exists and starts afresh otherwise.
    _pulse_requeue "pulse-train stopped"
    return
  elif ((rc > 128)) && [[ -n $_pulse_stop ]]; then
    # Killed by the forwarded signal in the instant before its handlers were set (process start):
    # nothing of this attempt is lost that its last checkpoint does not hold.
    _pulse_requeue "pulse-train was killed by the forwarded stop signal (exit $rc) before it could checkpoint"
    return
  elif ((rc == 0)) && [[ ! -f $out ]]; then
    # srun can exit 0 when a job step is aborted before its tasks launch
    echo "pulse-job: the launcher exited 0 but $out does not exist" >&2
    return 1
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
