"""The Slurm scripts on a real single-node Slurm (jobs/local-slurm in a temporary folder, stopped
at the end whatever happens):
  - measure.sbatch with the smoke config and a two-element seeds.sbatch array complete, their HDF5
    files have one row per configured step, and each job folder has its report;
  - a job told to stop the way Slurm warns before the time limit (`scancel --signal=USR1 --batch`,
    what `--signal=B:USR1@120` delivers) checkpoints, requeues itself, resumes with --resume and
    ends with the full step count in the same HDF5 file;
  - the same with Slurm's own time limit: --time=1 (the minimum, one minute) and
    --signal=B:USR1@50, so Slurm itself signals the batch shell; the requeued job gets a longer
    limit and finishes the run. Slurm may deliver the signal up to a minute early, so it can
    come at any point of the run: the test passes wherever it lands and prints when it came;
  - a stop signal sent as soon as the job runs (during the start-up of the script and of
    pulse-train) requeues the job, which finishes the run.
    python3 tests/jobs/test_slurm.py --app build/apps/pulse-train
Fails when Slurm or munge is not installed (`make deps` installs them).
"""
import os
import shutil
import subprocess
import sys
import time
import tomllib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOCAL_SLURM = os.path.join(ROOT, "jobs", "local-slurm")
SMOKE = "jobs/configs/smoke.toml"
TIMEOUT_S = 240


@pytest.fixture(scope="module")
def slurm(tmp_path_factory, request):
    d = tmp_path_factory.mktemp("slurm")
    env = dict(os.environ, PULSE_SLURM_CPUS="6")  # two 3-rank jobs at a time
    p = subprocess.run([LOCAL_SLURM, "start", str(d / "slurm")], env=env, capture_output=True, text=True)
    request.addfinalizer(lambda: subprocess.run([LOCAL_SLURM, "stop", str(d / "slurm")], check=False))
    assert p.returncode == 0, p.stderr
    conf = p.stdout.strip().split("=", 1)[1]
    app = os.path.abspath(request.config.getoption("--app"))
    env = dict(os.environ, SLURM_CONF=conf, PULSE_ROOT=ROOT, PULSE_BUILD=os.path.dirname(os.path.dirname(app)),
               PULSE_RUNS=str(d / "runs"), PULSE_PYTHON=sys.executable, PULSE_CONFIG=SMOKE,
               # ranks outnumber cores here: let Open MPI yield instead of spinning
               OMPI_MCA_mpi_yield_when_idle="1")
    return d, env


def sbatch(env, cwd, *args):
    p = subprocess.run(["sbatch", "--parsable", "--export=ALL", *args], env=env, cwd=cwd, capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().split(";")[0]


def job_info(env, job):
    """scontrol's key=value fields of a job (array tasks: one dict each)."""
    p = subprocess.run(["scontrol", "-o", "show", "job", job], env=env, capture_output=True, text=True)
    jobs = []
    for line in p.stdout.splitlines():
        fields = {}
        for tok in line.split():
            if "=" in tok:
                k, v = tok.split("=", 1)
                fields[k] = v
        jobs.append(fields)
    return jobs


def wait_done(env, jobs, deadline, on_pending=None):
    """Poll until every job (and array task) has left the queue; returns scontrol's records."""
    while True:
        infos = [i for j in jobs for i in job_info(env, j)]
        pending = [i for i in infos if i.get("JobState") in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING",
                                                            "REQUEUED", "SUSPENDED")]
        if infos and not pending:
            return infos
        if on_pending:
            on_pending(pending)
        if time.monotonic() > deadline:
            pytest.fail(f"jobs {jobs} still queued after the timeout: "
                        + "; ".join(f"{i.get('JobId')} {i.get('JobState')} {i.get('Reason')}" for i in pending))
        time.sleep(2)


def check_run(path, seed=None):
    import h5py

    with h5py.File(path, "r") as f:
        cfg = tomllib.loads(f.attrs["config"])
        steps = cfg["steps"]
        assert f["steps/step"][()].tolist() == list(range(1, steps + 1)), f"{path}: rows are not steps 1..{steps}"
        for name, d in f["steps"].items():
            assert d.shape[0] == steps, f"{path}:/steps/{name} has {d.shape[0]} rows, config steps {steps}"
        if seed is not None:
            assert cfg["seed"] == seed, f"{path}: seed {cfg['seed']}, array task {seed}"
        return steps


def check_report(folder, runs):
    import csv

    with open(os.path.join(folder, "report", "summary.csv"), newline="") as f:
        assert sorted(r["run"] for r in csv.DictReader(f)) == sorted(runs)
    with open(os.path.join(folder, "report", "sparsity.png"), "rb") as f:
        assert f.read(4) == b"\x89PNG"


def steps_alive(job):
    """Whether a slurmstepd of the job still runs here (an aborted step lingers up to 32 s)."""
    return subprocess.run(["pgrep", "-f", rf"^slurmstepd: \[{job}\."], capture_output=True).returncode == 0


def releaser(env, job, *updates):
    """on_pending hook: Slurm holds a requeued job for about two minutes (BeginTime); start it
    once the last attempt's job steps are gone (once per requeue), applying `updates` (scontrol
    update fields) as well. Released while an aborted step of the last attempt still winds down,
    the new attempt's step of the same id fails to launch (srun's launch aborted by a signal)."""
    seen, done = {}, set()

    def release(pending):
        for i in pending:
            restarts = int(i.get("Restarts", 0))
            if i.get("Reason") != "BeginTime" or restarts == 0 or restarts in done:
                continue
            waited = time.monotonic() - seen.setdefault(restarts, time.monotonic())
            if not steps_alive(job) or waited > 40:
                subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now", *updates], env=env, check=True)
                done.add(restarts)

    return release


def log_of(d, job):
    with open(d / f"slurm-{job}.out") as f:
        return f.read()


def test_measure_and_seed_array(slurm):
    d, env = slurm
    start = time.monotonic()
    single = sbatch(env, d, "--ntasks=3", "--output=slurm-%j.out", os.path.join(ROOT, "jobs", "measure.sbatch"))
    array = sbatch(env, d, "--ntasks=3", "--array=0-1", "--output=slurm-%A_%a.out", os.path.join(ROOT, "jobs", "seeds.sbatch"))
    infos = wait_done(env, [single, array], start + TIMEOUT_S)
    print(f"measure + 2-seed array: {time.monotonic() - start:.0f} s")
    for i in infos:
        assert (i["JobState"], i["ExitCode"]) == ("COMPLETED", "0:0"), f"job {i['JobId']}: {i['JobState']} {i['ExitCode']}"
    runs = d / "runs"
    check_run(runs / single / "run.h5")
    check_report(runs / single, ["run"])
    for seed in (0, 1):
        check_run(runs / array / f"seed-{seed}.h5", seed=seed)
    check_report(runs / array, ["seed-0", "seed-1"])  # the last task's report covers both seeds


def test_requeue_resumes_the_same_file(slurm):
    d, env = slurm
    env = dict(env, PULSE_ARGS="--steps 30 --checkpoint-every 1")
    start = time.monotonic()
    job = sbatch(env, d, "--ntasks=3", "--output=slurm-%j.out", os.path.join(ROOT, "jobs", "measure.sbatch"))
    ckpt = d / "runs" / job / "run.ckpt" / "LATEST"
    while not ckpt.exists():
        state = job_info(env, job)[0]["JobState"]
        assert state in ("PENDING", "RUNNING"), f"job {job} {state} before its first checkpoint:\n" + log_of(d, job)
        assert time.monotonic() < start + TIMEOUT_S, "no checkpoint before the timeout"
        time.sleep(0.5)
    # what --signal=B:USR1@120 does before the time limit: USR1 to the batch shell only
    subprocess.run(["scancel", "--signal=USR1", "--batch", job], env=env, check=True)
    info = wait_done(env, [job], start + TIMEOUT_S, on_pending=releaser(env, job))[0]
    print(f"requeue test: {time.monotonic() - start:.0f} s")
    log = log_of(d, job)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), log
    assert int(info["Restarts"]) >= 1, f"job was not requeued:\n{log}"
    assert "requeueing job" in log and "--resume" in log, log
    assert check_run(d / "runs" / job / "run.h5") == 30


def launched(d, job):
    """Whether the job's pulse-job.sh has printed its launch line (srun or mpirun)."""
    path = d / f"slurm-{job}.out"
    return path.exists() and any(line.startswith(("pulse-job: srun", "pulse-job: mpirun"))
                                 for line in path.read_text().splitlines())


def signal_arrivals(log):
    """Seconds into the job script at which each stop signal came, from pulse-job's log lines."""
    return [int(line.split(" received ")[1].split()[0]) for line in log.splitlines()
            if line.startswith("pulse-job: ") and " received " in line]


def test_startup_signal_requeues_and_finishes(slurm):
    d, env = slurm
    # Long enough (5-10 s of training) that the stop reaches the ranks while they train: srun drops
    # a signal that comes before its ranks run, and pulse-job.sh sends it again every 2 s.
    steps = 150
    env = dict(env, PULSE_ARGS=f"--steps {steps} --checkpoint-every 50 --quiet")
    start = time.monotonic()
    job = sbatch(env, d, "--ntasks=3", "--output=slurm-%j.out", os.path.join(ROOT, "jobs", "measure.sbatch"))
    # The moment pulse-job.sh launches the ranks (its traps are set by then: a signal to a shell
    # that has not yet read its first line would kill it, as it would kill any batch script).
    while not launched(d, job):
        assert time.monotonic() < start + TIMEOUT_S, f"job {job} never launched pulse-train"
        time.sleep(0.02)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job], env=env, check=True)
    info = wait_done(env, [job], start + TIMEOUT_S, on_pending=releaser(env, job))[0]
    log = log_of(d, job)
    print(f"start-up signal test: {time.monotonic() - start:.0f} s; signal came {signal_arrivals(log)} s into the script")
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), log
    assert signal_arrivals(log) and "requeueing job" in log, log
    assert int(info["Restarts"]) >= 1, log
    assert check_run(d / "runs" / job / "run.h5") == steps


def test_time_limit_signal_requeues_and_resumes(slurm):
    d, env = slurm
    steps = 800  # ~80 s of training here: still running when USR1 comes, 10-40 s into the job
    env = dict(env, PULSE_ARGS=f"--steps {steps} --checkpoint-every 5 --quiet")
    start = time.monotonic()
    job = sbatch(env, d, "--ntasks=3", "--time=1", "--signal=B:USR1@50", "--output=slurm-%j.out",
                 os.path.join(ROOT, "jobs", "measure.sbatch"))
    info = wait_done(env, [job], start + TIMEOUT_S + 120, on_pending=releaser(env, job, "TimeLimit=10"))[0]
    log = log_of(d, job)
    print(f"time-limit test: {time.monotonic() - start:.0f} s; USR1 came {signal_arrivals(log)} s into the script")
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), log
    # Whether the run resumes (--resume) or starts afresh depends on when the signal came.
    assert "USR1 received" in log and "requeueing job" in log, log
    assert int(info["Restarts"]) >= 1, log
    assert check_run(d / "runs" / job / "run.h5") == steps


if __name__ == "__main__":
    if not all(shutil.which(x) for x in ("sbatch", "slurmctld", "slurmd", "munged")):
        # A listed dependency that is missing fails the test: `make deps` installs slurm-wlm and munge.
        print("FAIL: Slurm (slurm-wlm) or munge not installed: run `make deps` as root")
        sys.exit(1)
    sys.exit(pytest.main([os.path.abspath(__file__), "-q", "-s", "-p", "no:cacheprovider"] + sys.argv[1:]))
