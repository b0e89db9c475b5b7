"""pulse-train resume and input checks (issue 12 items 5, 6, 8, 9):
- with --relay, a run stopped by SIGUSR1 (exit 75) or killed with SIGKILL while the relay is
  ahead of the checkpoint resumes to the same checkpoint buffers, statistics rows and relay head
  as an uninterrupted run; a temporary file a killed publisher left in the relay is removed;
- a new run into a non-empty relay is refused with one line, before any file exists;
- --resume with a changed setting that alters results (lr, seed) is refused with one line naming
  the keys, files unchanged; a changed --steps is accepted and recorded in the "resumes" attribute;
- a flipped bit in a checkpoint's FP32 master is refused by its checksum, files unchanged;
- config errors (int overflow of prompts-per-step, huge group-size, non-UTF-8 or unwritable --out)
  exit non-zero with one line before any file exists;
- abandoned temporary files of checkpoint writers are removed, a live writer's (locked) file and
  names outside the temporary-file grammar stay.
    test_pulse_train_resume.py --app build/apps/pulse-train --sft-app build/apps/pulse-sft --mpiexec mpiexec
"""
import argparse
import fcntl
import os
import shlex
import signal
import shutil
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_pulse_train as base  # noqa: E402  (its launch/run/checkpoint helpers and BASE settings)

expect = base.expect

STEPS = 10
RELAY = ["--steps", str(STEPS), "--prompts-per-step", "2", "--inference-ranks", "1", "--checkpoint-every", "3",
         "--anchor-every", "2", "--keep-anchors", "2", "--absorption-every", "0"]


def run(args, np_, app, mpi, timeout=300):
    p = base.launch(args, np_, app, mpi, errors="replace")  # a non-UTF-8 path may appear in messages
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def override(args, extra):
    """args with extra's "--flag value" pairs replacing the same flags' values (CLI11 refuses a
    repeated flag); lone flags such as --resume are appended."""
    out = list(args)
    i = 0
    while i < len(extra):
        flag = extra[i]
        has_value = i + 1 < len(extra) and not str(extra[i + 1]).startswith("--")
        if has_value and flag in out:
            out[out.index(flag) + 1] = extra[i + 1]
        else:
            out += extra[i:i + 1 + has_value]
        i += 1 + has_value
    return out


def error_lines(err):
    return [line for line in err.strip().splitlines() if line.startswith("pulse-train:")]


def snapshot(folder):
    """Every file under folder with its bytes: what a refused run must leave as it was."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, folder)] = fh.read()
    return out


def relay_head(relay):
    """(version, state digest) of the relay's HEAD record (src/sync/FORMAT.md, Relay)."""
    with open(os.path.join(relay, "HEAD")) as fh:
        fields = dict(line.split(" ", 1) for line in fh.read().splitlines()[1:])
    return int(fields["version"]), fields["state"]


def kill_run(p, marker):
    """SIGKILL to mpirun's group, then to every rank whose command line holds marker (a path
    unique to this run: Open MPI may start ranks in another group), until none is left, so
    that no rank of the killed run still writes while the next one starts."""
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate()
    deadline = time.time() + 60
    while time.time() < deadline:
        alive = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    if os.fsencode(marker) in fh.read():
                        alive.append(int(pid))
            except OSError:
                pass
        if not alive:
            return
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.1)
    expect(False, f"ranks of the killed run ({marker}) still alive after 60 s")


def wait_for(predicate, p, seconds=240):
    deadline = time.time() + seconds
    while time.time() < deadline and p.poll() is None:
        try:
            if predicate():
                return True
        except (OSError, ValueError, IndexError, KeyError):
            pass
        time.sleep(0.05)
    return False


def compare_runs(ref_dir, ref_out, dir_, out, what):
    s_ref, b_ref = base.checkpoint_buffers(os.path.join(ref_dir, "ref.ckpt"))
    s_got, b_got = base.checkpoint_buffers(os.path.join(dir_, os.path.basename(out)[:-3] + ".ckpt"))
    expect(s_ref == s_got == STEPS, f"{what}: final checkpoints at {s_ref} and {s_got}")
    differ = sorted(k for k in b_ref.keys() | b_got.keys() if b_ref.get(k) != b_got.get(k))
    expect(not differ, f"{what}: resumed run differs from the uninterrupted one in {differ[:5]}")
    with h5py.File(ref_out, "r") as a, h5py.File(out, "r") as b:
        for name in ("step", "changed", "loss", "reward", "patch_bytes", "policy_version"):
            x, y = a[f"/steps/{name}"][:], b[f"/steps/{name}"][:]
            expect(x.shape == y.shape and np.array_equal(x, y), f"{what}: /steps/{name} differs: {x} vs {y}")
        # What crossed the wire in each step (issue 27 class 8): the versions a resumed run makes
        # again while the relay already holds them are recovery, not the run's traffic.
        for name in ("bytes_sent", "bytes_recv", "patch_bytes_recv", "trainer_bytes_sent", "trainer_bytes_recv"):
            x, y = a[f"/ranks/{name}"][:], b[f"/ranks/{name}"][:]
            rows = sorted(set(np.nonzero(x != y)[0].tolist())) if x.shape == y.shape else "shape"
            expect(x.shape == y.shape and np.array_equal(x, y), f"{what}: /ranks/{name} differs in rows {rows}: "
                   f"{x.tolist()} vs {y.tolist()}")


def check_relay_resume(app, mpi, tmp):
    ref_out, ref_relay = os.path.join(tmp, "ref.h5"), os.path.join(tmp, "ref-relay")
    code, _, e = run(override(base.BASE, RELAY + ["--out", ref_out, "--relay", ref_relay]), 2, app, mpi)
    expect(code == 0, f"relay reference run: exit {code}: {e.strip()[-300:]}")
    ref_head = relay_head(ref_relay)
    expect(ref_head[0] == STEPS, f"reference relay head {ref_head}")

    # SIGUSR1: checkpoint after the current step, exit 75, resume.
    out, relay = os.path.join(tmp, "sig.h5"), os.path.join(tmp, "sig-relay")
    args = override(base.BASE, RELAY + ["--out", out, "--relay", relay])
    p = base.launch(args, 2, app, mpi)
    wait_for(lambda: relay_head(relay)[0] >= 2, p)
    os.killpg(p.pid, signal.SIGUSR1)
    _, err = p.communicate(timeout=240)
    expect(p.returncode == 75, f"relay SIGUSR1: exit {p.returncode}, expected 75: {err.strip()[-300:]}")
    code, _, e = run(args + ["--resume"], 2, app, mpi)
    expect(code == 0, f"relay resume after exit 75: exit {code}: {e.strip()[-300:]}")
    compare_runs(tmp, ref_out, tmp, out, "relay, exit 75")
    expect(relay_head(relay) == ref_head, f"relay, exit 75: head {relay_head(relay)} != {ref_head}")

    # SIGKILL once the relay is ahead of the checkpoint, so the resumed run makes versions the
    # relay already holds; a killed publisher's temporary file is left in the relay.
    out, relay = os.path.join(tmp, "kill.h5"), os.path.join(tmp, "kill-relay")
    ckpt = os.path.join(tmp, "kill.ckpt")
    args = override(base.BASE, RELAY + ["--out", out, "--relay", relay])
    p = base.launch(args, 2, app, mpi)

    def ahead():
        with open(os.path.join(ckpt, "LATEST")) as fh:
            return relay_head(relay)[0] > int(fh.read().split()[0]) >= 3
    wait_for(ahead, p)
    kill_run(p, out)
    with open(os.path.join(ckpt, "LATEST")) as fh:
        latest = int(fh.read().split()[0])
    expect(relay_head(relay)[0] > latest and latest < STEPS,
           f"relay SIGKILL: killed at checkpoint {latest}, relay head {relay_head(relay)}: not ahead of it")
    stale = os.path.join(relay, "anchor-6.safetensors.tmp.Ab12Cd")
    with open(stale, "wb") as fh:
        fh.write(b"partial anchor")
    code, _, e = run(args + ["--resume"], 2, app, mpi)
    expect(code == 0, f"relay resume after SIGKILL: exit {code}: {e.strip()[-300:]}")
    compare_runs(tmp, ref_out, tmp, out, "relay, SIGKILL")
    expect(relay_head(relay) == ref_head, f"relay, SIGKILL: head {relay_head(relay)} != {ref_head}")
    expect(not os.path.exists(stale), "relay: a killed publisher's temporary file was not removed")

    # A new run into the used relay: one line, nothing written anywhere.
    before = snapshot(tmp)
    code, _, e = run(override(base.BASE, RELAY + ["--out", os.path.join(tmp, "new.h5"), "--relay", relay]), 2, app, mpi)
    expect(code != 0 and len(error_lines(e)) == 1 and "relay" in error_lines(e)[0],
           f"new run into a used relay: exit {code}, {e.strip()[-300:]!r}")
    expect(snapshot(tmp) == before, "new run into a used relay changed files")


def check_resume_settings(app, mpi, tmp):
    out = os.path.join(tmp, "cfg.h5")
    ckpt = os.path.join(tmp, "cfg.ckpt")
    args = base.BASE + ["--steps", "4", "--prompts-per-step", "2", "--checkpoint-every", "2", "--out", out]
    code, _, e = run(args, 1, app, mpi)
    expect(code == 0, f"settings run: exit {code}: {e.strip()[-300:]}")
    before = snapshot(tmp)
    for extra, keys in ((["--lr", "5e-4"], "lr"), (["--seed", "7"], "seed"),
                        (["--seed", "7", "--group-size", "2"], "group-size, seed")):
        code, _, e = run(override(args, extra + ["--resume"]), 1, app, mpi)
        lines = error_lines(e)
        expect(code != 0 and len(lines) == 1 and f"in {keys} (" in lines[0],
               f"--resume {extra}: exit {code}, {e.strip()[-300:]!r}")
        expect(snapshot(tmp) == before, f"--resume {extra} changed files")
    # A flipped bit in the FP32 master: refused by the checksum.
    path = os.path.join(ckpt, "rank-0-step-4.safetensors")
    tensors, _ = base.safetensors_ref.read(path)
    master = tensors["master"][1]
    data = bytearray(open(path, "rb").read())
    offset = data.find(master.tobytes())
    expect(offset > 0, "master buffer not found in the checkpoint file")
    data[offset + 4 * (master.size // 2) + 1] ^= 0x10
    with open(path, "wb") as fh:
        fh.write(data)
    before = snapshot(tmp)
    code, _, e = run(override(args, ["--steps", "6", "--resume"]), 1, app, mpi)
    lines = error_lines(e)
    expect(code != 0 and len(lines) == 1 and "checksum" in lines[0],
           f"flipped master bit: exit {code}, {e.strip()[-300:]!r}")
    expect(snapshot(tmp) == before, "flipped master bit: files changed")
    data[offset + 4 * (master.size // 2) + 1] ^= 0x10
    with open(path, "wb") as fh:
        fh.write(data)
    # Another run's statistics file (same settings, so every row would merge in): refused by the
    # run id both files hold (issue 27), files unchanged.
    other = os.path.join(tmp, "other.h5")
    code, _, e = run(override(args, ["--out", other]), 1, app, mpi)
    expect(code == 0, f"second run: exit {code}: {e.strip()[-300:]}")
    own = open(out, "rb").read()
    shutil.copyfile(other, out)
    before = snapshot(tmp)
    code, _, e = run(override(args, ["--steps", "6", "--resume"]), 1, app, mpi)
    lines = error_lines(e)
    expect(code != 0 and len(lines) == 1 and "statistics file of another run" in lines[0],
           f"--resume with another run's statistics file: exit {code}, {e.strip()[-300:]!r}")
    expect(snapshot(tmp) == before, "--resume with another run's statistics file: files changed")
    with open(out, "wb") as fh:
        fh.write(own)
    # More steps: allowed, recorded; abandoned temporary files of checkpoint writers go, a live
    # (locked) one and a name outside the grammar stay.
    abandoned = [os.path.join(ckpt, n) for n in ("rank-0-step-6.safetensors.tmp.q1W2e3", "LATEST.tmp.Zz09aB")]
    kept = [os.path.join(ckpt, n) for n in ("rank-0-step-6.safetensors.tmp.bak", "notes.tmp.abcdef",
                                            "LATEST.tmp.LiVe01")]
    for path in abandoned + kept:
        with open(path, "wb") as fh:
            fh.write(b"x")
    live = open(kept[-1], "rb")
    fcntl.flock(live, fcntl.LOCK_EX)
    code, _, e = run(override(args, ["--steps", "6", "--resume"]), 1, app, mpi)
    live.close()
    expect(code == 0, f"--resume --steps 6: exit {code}: {e.strip()[-300:]}")
    with h5py.File(out, "r") as f:
        expect(list(f["/steps/step"][:]) == list(range(1, 7)), "--resume --steps 6 ends with steps 1..6")
        resumes = [r.decode() if isinstance(r, bytes) else r for r in f.attrs["resumes"]]
        expect(len(resumes) == 1 and resumes[0].startswith("after step 4 ") and resumes[0].endswith("steps 4 -> 6"),
               f"resumes attribute {resumes}")
        expect("steps = 6" in f.attrs["config"], "config attribute does not hold the resumed settings")
    expect(not any(os.path.exists(p) for p in abandoned), "abandoned checkpoint temporary files were not removed")
    expect(all(os.path.exists(p) for p in kept), "a live or foreign temporary file was removed")


def check_config_errors(app, mpi, tmp):
    bad = os.path.join(tmp, "bad")
    os.makedirs(bad)
    blocker = os.path.join(bad, "a_file")
    open(blocker, "w").close()
    cases = [
        (["--prompts-per-step", "1073741824"], "prompts-per-step overflowing an int"),
        (["--prompts-per-step", "2", "--group-size", "100000"], "group-size 100000"),
        (["--prompts-per-step", "4096", "--group-size", "1024"], "a batch too large for one rank"),
        (["--prompts-per-step", "2", "--out", os.fsencode(bad) + b"/run\xff.h5"], "non-UTF-8 out"),
        (["--prompts-per-step", "2", "--out", os.path.join(blocker, "run.h5")], "out below a file"),
        (["--prompts-per-step", "2", "--out", bad], "out is a folder"),
        (["--prompts-per-step", "2", "--out", os.path.join(bad, 'q"uote.h5')], "out with a quote"),
    ]
    before = snapshot(bad)
    for args, what in cases:
        full = override(base.BASE + ["--steps", "2", "--out", os.path.join(bad, "x.h5")], args)
        code, _, err = run(full, 1, app, mpi, timeout=120)
        lines = error_lines(err)
        expect(code != 0 and len(lines) == 1, f"{what}: exit {code}, error lines {err.strip()[-300:]!r}")
        expect(snapshot(bad) == before, f"{what}: files created: {sorted(snapshot(bad))}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--app", required=True)
    parser.add_argument("--sft-app", required=True)
    parser.add_argument("--mpiexec", required=True)
    parser.add_argument("--mpi-flags", default="")
    parser.add_argument("--only", default="", help="comma-separated subset: relay,settings,config")
    args = parser.parse_args()
    mpi = [args.mpiexec] + shlex.split(args.mpi_flags)
    only = set(args.only.split(",")) if args.only else {"relay", "settings", "config"}
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "sft")
        subprocess.run([args.sft_app, "--model", "tiny", "--digits", "1", "--steps", "100", "--eval-every", "100",
                        "--out", init], check=True, stdout=subprocess.DEVNULL)
        base.BASE.extend(["--init", os.path.join(init, "model.safetensors")])
        for name, check in (("config", check_config_errors), ("settings", check_resume_settings),
                            ("relay", check_relay_resume)):
            if name in only:
                d = os.path.join(tmp, name)
                os.makedirs(d)
                check(args.app, mpi, d)
    if base.failures:
        print(f"{len(base.failures)} failure(s)")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
