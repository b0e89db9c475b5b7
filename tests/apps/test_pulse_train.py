"""pulse-train end to end at np 1, 2 and 4 (trainers + inference ranks):
- the HDF5 statistics equal an independent recomputation from the BF16 anchors the run
  published to its relay (--anchor-every 1): changed counts per step and per tensor, per-step
  and k-step sparsity, and the patch sizes equal the patch files;
- every rank holds the same version after every step, trainer 0 and the inference ranks the same
  weights digest, and the other trainers, which hash nothing, record 0;
- a run killed with SIGKILL at a random step and continued with --resume ends with the same
  master weights, Adam state and BF16 weights, bit for bit, as an uninterrupted run, and the
  same statistics rows;
- SIGUSR1 checkpoints and exits 75, --resume finishes the run;
- SIGUSR1 sent to every rank as soon as its handler is in place (10-40 ms into its life when
  the machine is idle, before MPI_Init returns) exits 75 with a checkpoint of the initial state, and --resume ends with the
  same weights, bit for bit, as an uninterrupted run;
- --init given a Hugging Face folder (2 shards + index) ends as with the file, bit for bit;
- with and without an async lag, inference ranks sampling ahead and sleeping waits (the defaults)
  end with the same weights, checkpoints and statistics as sampling in turn and spinning waits
  (PULSE_GENERATE_AHEAD=0 PULSE_MPI_WAIT=spin), bit for bit; the CPU columns are consistent;
- bad configs (unknown key, negative lr, more inference ranks than ranks, unwritable output)
  and an existing output exit non-zero with a one-line error and create or change no file.
    test_pulse_train.py --app build/apps/pulse-train --mpiexec mpiexec --mpi-flags "--oversubscribe"
"""
import argparse
import glob
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_ref  # noqa: E402

from expect import expect, failures  # noqa: E402


# Small, fast settings shared by every run here (tiny model, 1-digit addition).
BASE = ["--model", "tiny", "--digits", "1", "--lr", "3e-4", "--warmup-steps", "2", "--group-size", "4",
        "--eval-every", "0", "--absorption-every", "3", "--quiet"]


def launch(args, np_, app, mpi, **kw):
    return subprocess.Popen(mpi + ["-n", str(np_), app] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, **kw)


def run(args, np_, app, mpi, timeout=300, **kw):
    p = launch(args, np_, app, mpi, **kw)
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def layouts(np_):
    """(inference ranks, prompts per step) per rank count: both roles present from np 2 on."""
    return {1: (0, 4), 2: (1, 4), 4: (2, 4)}[np_]


def bf16_weights(path):
    tensors, _ = safetensors_ref.read(path)
    return tensors


def check_statistics_against_anchors(app, mpi, np_, tmp):
    inference, prompts = layouts(np_)
    steps = 7
    relay = os.path.join(tmp, "relay")
    out = os.path.join(tmp, "stats.h5")
    code, o, e = run(BASE + ["--steps", str(steps), "--prompts-per-step", str(prompts), "--inference-ranks",
                             str(inference), "--relay", relay, "--anchor-every", "1", "--keep-anchors", "1000",
                             "--out", out], np_, app, mpi)
    expect(code == 0, f"np {np_}: relay run exit {code}: {e.strip()[-500:]}")
    if code != 0:
        return
    anchors = [bf16_weights(os.path.join(relay, f"anchor-{v}.safetensors")) for v in range(steps + 1)]
    with h5py.File(out, "r") as f:
        names = [n.decode() if isinstance(n, bytes) else n for n in f["/steps/tensor_changed"].attrs["tensor_names"]]
        n = int(f.attrs["num_parameters"])
        expect(f["/steps/step"].shape == (steps,), f"np {np_}: {f['/steps/step'].shape} step rows")
        expect(list(f["/steps/step"][:]) == list(range(1, steps + 1)), f"np {np_}: step column")
        ks = [int(k) for k in f["/kstep/sparsity"].attrs["k_values"]]
        for t in range(1, steps + 1):
            per = [int(np.count_nonzero(anchors[t][name][1].view(np.uint16) != anchors[t - 1][name][1].view(np.uint16)))
                   for name in names]
            expect(list(f["/steps/tensor_changed"][t - 1]) == per, f"np {np_}: tensor_changed at step {t}")
            expect(int(f["/steps/changed"][t - 1]) == sum(per), f"np {np_}: changed at step {t}")
            expect(abs(f["/steps/sparsity"][t - 1] - (1 - sum(per) / n)) < 1e-12, f"np {np_}: sparsity at step {t}")
            for j, k in enumerate(ks):
                got = f["/kstep/sparsity"][t - 1, j]
                if t < k:
                    expect(np.isnan(got), f"np {np_}: k={k} at step {t} should be NaN")
                    continue
                changed = sum(int(np.count_nonzero(anchors[t][m][1].view(np.uint16) != anchors[t - k][m][1].view(np.uint16)))
                              for m in names)
                expect(abs(got - (1 - changed / n)) < 1e-12, f"np {np_}: k={k} sparsity at step {t}: {got}")
            patch = os.path.join(relay, f"patch-{t - 1}-{t}.pulse")
            expect(int(f["/steps/patch_bytes"][t - 1]) == os.path.getsize(patch), f"np {np_}: patch bytes at step {t}")
            expect(int(f["/steps/dense_bytes"][t - 1]) == 2 * n, f"np {np_}: dense bytes")
            # Only the changed list (32-bit index + 16-bit value per change) and a few result counts
            # leave the device; what goes up is the rollout batch, never the model.
            d2h, h2d = int(f["/steps/d2h_bytes"][t - 1]), int(f["/steps/h2d_bytes"][t - 1])
            raw = int(f["/steps/patch_raw_bytes"][t - 1])
            expect(6 * sum(per) <= d2h <= 6 * sum(per) + 1024, f"np {np_}: d2h bytes {d2h} at step {t} ({sum(per)} changed)")
            expect(d2h <= 4 * raw + 1024, f"np {np_}: d2h bytes {d2h} above 4x the patch's raw {raw} at step {t}")
            expect(0 < h2d < 2 * n, f"np {np_}: h2d bytes {h2d} at step {t} (model {2 * n})")
        digests, versions = f["/ranks/weights_digest"][:], f["/ranks/version"][:]
        expect(digests.shape == (steps, np_), f"np {np_}: digests shape {digests.shape}")
        hashing = [0] + list(range(np_ - inference, np_))  # trainer 0 and the inference ranks
        expect(all(len(set(row[hashing])) == 1 and row[0] != 0 for row in digests),
               f"np {np_}: ranks disagree on the weights digest")
        expect(all(all(row[1:np_ - inference] == 0) for row in digests), f"np {np_}: another trainer hashed its weights")
        expect(all(list(row) == [t + 1] * np_ for t, row in enumerate(versions)), f"np {np_}: versions")
        if inference:
            recv = f["/ranks/patch_bytes_recv"][:]
            for t in range(steps):
                expect(all(recv[t, np_ - inference:] == 0), f"np {np_}: relay mode sends no patch over MPI")
            # An inference rank sends its rollouts to the trainers and receives no rollouts itself:
            # only a few control words come back (relay mode: no patch over MPI either).
            sent, got = f["/ranks/bytes_sent"][:], f["/ranks/bytes_recv"][:]
            for r in range(np_ - inference, np_):
                expect(all(got[:, r] < 256) and all(sent[:, r] > 256),
                       f"np {np_}: inference rank {r} received {list(got[:, r])} bytes, sent {list(sent[:, r])}")
        ab = [k for k in f["/absorption"].keys()] if "absorption" in f else []
        expect(ab == ["step_000003", "step_000006"], f"np {np_}: absorption groups {ab}")
        for g in ab:
            total = int(f[f"/absorption/{g}/ratio_counts"][:].sum())
            expect(total == n, f"np {np_}: absorption histogram of {g} counts {total} of {n}")
    # The final weights file equals the last anchor.
    final = bf16_weights(os.path.join(tmp, "stats.weights.safetensors"))
    expect(all(np.array_equal(final[k][1].view(np.uint16), anchors[steps][k][1].view(np.uint16)) for k in final),
           f"np {np_}: final weights differ from the last anchor")


def checkpoint_buffers(ckpt_dir):
    with open(os.path.join(ckpt_dir, "LATEST")) as fh:
        step = int(fh.read().split()[0])
    out = {}
    for path in sorted(glob.glob(os.path.join(ckpt_dir, f"rank-*-step-{step}.safetensors"))):
        tensors, _ = safetensors_ref.read(path)
        rank = os.path.basename(path).split("-")[1]
        for name, (_, array) in tensors.items():
            out[f"{rank}/{name}"] = array.tobytes()
    return step, out


def check_kill_and_resume(app, mpi, np_, tmp):
    inference, prompts = layouts(np_)
    steps = 9
    common = BASE + ["--steps", str(steps), "--prompts-per-step", str(prompts), "--inference-ranks", str(inference),
                     "--checkpoint-every", "2", "--num-iterations", "2", "--async-lag", "1"]
    ref = os.path.join(tmp, "ref.h5")
    code, _, e = run(common + ["--out", ref], np_, app, mpi)
    expect(code == 0, f"np {np_}: reference run exit {code}: {e.strip()[-300:]}")
    # Killed run: SIGKILL to the whole process group once a random checkpoint exists.
    killed = os.path.join(tmp, "killed.h5")
    ckpt = os.path.join(tmp, "killed.ckpt")
    target = random.Random(np_).choice([2, 4, 6])
    p = launch(common + ["--out", killed], np_, app, mpi)
    deadline = time.time() + 240
    while time.time() < deadline and p.poll() is None:
        try:
            with open(os.path.join(ckpt, "LATEST")) as fh:
                if int(fh.read().split()[0]) >= target:
                    break
        except (OSError, ValueError, IndexError):
            pass
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate()
    subprocess.run(["pkill", "-9", "-f", killed], check=False)
    with h5py.File(killed, "r") as f:  # readable after the kill
        rows = f["/steps/step"].shape[0]
    expect(rows >= target, f"np {np_}: killed file holds {rows} rows, checkpoint at >= {target}")
    code, o, e = run(common + ["--out", killed, "--resume"], np_, app, mpi)
    expect(code == 0, f"np {np_}: resume exit {code}: {e.strip()[-300:]}")
    s_ref, b_ref = checkpoint_buffers(os.path.join(tmp, "ref.ckpt"))
    s_kil, b_kil = checkpoint_buffers(ckpt)
    expect(s_ref == s_kil == steps, f"np {np_}: final checkpoints at {s_ref} and {s_kil}")
    expect(b_ref.keys() == b_kil.keys(), f"np {np_}: checkpoint buffers differ in names")
    differ = [k for k in b_ref if b_ref[k] != b_kil.get(k)]
    expect(not differ, f"np {np_}: resumed run differs from uninterrupted in {differ[:5]}")
    with h5py.File(ref, "r") as a, h5py.File(killed, "r") as b:
        for name in ("step", "changed", "loss", "reward", "sparsity", "patch_bytes", "rollout_version"):
            x, y = a[f"/steps/{name}"][:], b[f"/steps/{name}"][:]
            expect(x.shape == y.shape and np.array_equal(x, y), f"np {np_}: /steps/{name} differs after resume")
        # Staleness: batch of step t generated at step 1 + 2*floor((t-1)/2) from version (that step - 2), lag 1.
        expected = [max(0, (1 + 2 * ((t - 1) // 2)) - 1 - 1) for t in range(1, steps + 1)]
        expect(list(a["/steps/rollout_version"][:]) == expected,
               f"np {np_}: rollout_version {list(a['/steps/rollout_version'][:])} != {expected}")


def check_ddp_matches_single_rank(app, mpi, tmp):
    """DDP at np 2 (each trainer samples half the prompts, gradients summed with MPI_Allreduce)
    against one rank on the whole batch: the same rollouts (sampling draws are keyed by global
    row), so equal rewards, and losses and weights equal up to the order of the gradient sums."""
    common = BASE + ["--steps", "3", "--prompts-per-step", "4", "--checkpoint-every", "0"]
    outs = {}
    for np_ in (1, 2):
        out = os.path.join(tmp, f"ddp{np_}.h5")
        code, _, e = run(common + ["--out", out], np_, app, mpi)
        expect(code == 0, f"ddp np {np_}: exit {code}: {e.strip()[-300:]}")
        outs[np_] = out
    with h5py.File(outs[1], "r") as a, h5py.File(outs[2], "r") as b:
        # Bytes on the wire: one rank sends to no one; two DDP trainers each send the other half
        # the FP32 gradient in the reduce-scatter and half in the allgather, 4 n bytes a step.
        expect(not a["/ranks/bytes_sent"][:].any() and not a["/ranks/trainer_bytes_sent"][:].any(),
               f"ddp np 1: bytes sent to no one: {a['/ranks/bytes_sent'][:].tolist()}")
        n = int(b.attrs["num_parameters"])
        sent = b["/ranks/trainer_bytes_sent"][:]
        expect(np.array_equal(sent, np.full(sent.shape, 4 * n)), f"ddp np 2: trainer bytes {sent.tolist()}, not 4 x {n}")
        expect(np.array_equal(b["/ranks/trainer_bytes_recv"][:], sent), "ddp np 2: trainer bytes received != sent")
        expect(np.array_equal(a["/steps/reward"][:1], b["/steps/reward"][:1]), "ddp: step-1 rewards differ")
        la, lb = a["/steps/loss"][0], b["/steps/loss"][0]
        expect(abs(la - lb) <= 1e-6 * max(1.0, abs(la)), f"ddp: step-1 loss {la} vs {lb}")
        # Gradient norms agree to FP32 summation-order noise.
        ga, gb = a["/steps/grad_norm"][0], b["/steps/grad_norm"][0]
        expect(abs(ga - gb) <= 1e-5 * ga, f"ddp: step-1 gradient norm {ga} vs {gb}")
    _, wa = checkpoint_buffers(os.path.join(tmp, "ddp1.ckpt"))
    _, wb = checkpoint_buffers(os.path.join(tmp, "ddp2.ckpt"))
    ma = np.frombuffer(wa["0/master"], dtype=np.float32)
    mb = np.frombuffer(wb["0/master"], dtype=np.float32)
    diff = float(np.max(np.abs(ma - mb)))
    expect(diff <= 1e-5, f"ddp: final master weights differ by up to {diff} (tolerance 1e-5)")
    expect(wb["0/master"] == wb["1/master"], "ddp: the two trainers hold different master weights")


def check_overlap_changes_nothing(app, mpi, tmp):
    """Sampling ahead (with a lag while the trainers train; without one as soon as the step's
    patch is in) and sleeping waits change when the ranks work, never what they compute."""
    for np_, iterations, lag in ((2, 1, 1), (4, 2, 1), (2, 1, 0), (4, 2, 0)):
        inference, prompts = layouts(np_)
        common = BASE + ["--steps", "5", "--prompts-per-step", str(prompts), "--inference-ranks", str(inference),
                         "--async-lag", str(lag), "--num-iterations", str(iterations), "--checkpoint-every", "0"]
        what = f"overlap np {np_} lag {lag}"
        outs = {}
        for name, env in (("ahead", {}), ("lockstep", {"PULSE_GENERATE_AHEAD": "0", "PULSE_MPI_WAIT": "spin"})):
            out = os.path.join(tmp, f"overlap{np_}-{lag}-{name}.h5")
            code, _, e = run(common + ["--out", out], np_, app, mpi, env=dict(os.environ, **env))
            expect(code == 0, f"{what} {name}: exit {code}: {e.strip()[-300:]}")
            if code != 0:
                return
            outs[name] = out
        weights = [open(os.path.splitext(o)[0] + ".weights.safetensors", "rb").read() for o in outs.values()]
        expect(weights[0] == weights[1], f"{what}: final weights differ")
        _, a = checkpoint_buffers(os.path.splitext(outs["ahead"])[0] + ".ckpt")
        _, b = checkpoint_buffers(os.path.splitext(outs["lockstep"])[0] + ".ckpt")
        expect(a == b, f"{what}: checkpoint buffers differ in {[k for k in a if a[k] != b.get(k)][:5]}")
        with h5py.File(outs["ahead"], "r") as fa, h5py.File(outs["lockstep"], "r") as fb:
            for name in ("/steps/loss", "/steps/reward", "/steps/changed", "/steps/patch_bytes",
                         "/steps/rollout_version", "/ranks/weights_digest", "/steps/sparsity", "/steps/tensor_changed",
                         "/kstep/sparsity", "/steps/grad_sparsity", "/steps/adam_ratio"):
                expect(np.array_equal(fa[name][:], fb[name][:], equal_nan=True), f"{what}: {name} differs")
            for f in (fa, fb):
                cpu, wait, wait_cpu = (f[f"/ranks/{c}"][:] for c in ("cpu_s", "wait_s", "wait_cpu_s"))
                expect((cpu > 0).all() and (wait >= 0).all() and (wait_cpu >= 0).all(),
                       f"{what}: CPU columns not positive: {cpu.tolist()}")
                # One thread's CPU time within its wall time.
                expect((wait_cpu <= wait + 2e-3).all(), f"{what}: wait CPU {wait_cpu.tolist()} > wait {wait.tolist()}")


def check_init_folder(app, mpi, tmp, init_file):
    """--init takes a Hugging Face folder (2 shards + index) as it takes the file: same run, same
    final weights, bit for bit."""
    tensors, _ = safetensors_ref.read(init_file)
    names = sorted(tensors)
    folder = os.path.join(tmp, "init-folder")
    os.makedirs(folder)
    weight_map = {}
    for k, part in enumerate((names[:len(names) // 2], names[len(names) // 2:])):
        shard = f"model-0000{k + 1}-of-00002.safetensors"
        safetensors_ref.write(os.path.join(folder, shard), [(n, *tensors[n]) for n in part], {"format": "pt"})
        weight_map.update({n: shard for n in part})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(a.nbytes for _, a in tensors.values())}, "weight_map": weight_map}, f)
    with open(os.path.join(folder, "config.json"), "w") as f:
        f.write("{}")
    i = BASE.index("--init")
    common = BASE[:i] + BASE[i + 2:] + ["--steps", "2", "--prompts-per-step", "4", "--checkpoint-every", "0"]
    finals = []
    for name, init in (("file", init_file), ("folder", folder)):
        out = os.path.join(tmp, f"init-{name}.h5")
        code, _, e = run(common + ["--init", init, "--out", out], 1, app, mpi)
        expect(code == 0, f"--init {name}: exit {code}: {e.strip()[-300:]}")
        finals.append(out[:-3] + ".weights.safetensors")
    if all(os.path.exists(f) for f in finals):
        a, b = (bf16_weights(f) for f in finals)
        expect(sorted(a) == sorted(b) and all(np.array_equal(a[n][1], b[n][1]) for n in a),
               "--init folder: final weights differ from --init file's")


def check_signal(app, mpi, tmp):
    out = os.path.join(tmp, "sig.h5")
    # Checkpoints every step, so the signal can be sent once step 2 is done (the statistics file
    # reaches the disk only at flushes: every 100 rows or 10 s, and at checkpoints).
    common = BASE + ["--steps", "40", "--prompts-per-step", "4", "--checkpoint-every", "1", "--out", out]
    p = launch(common, 1, app, mpi)
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:
        try:
            with open(os.path.join(tmp, "sig.ckpt", "LATEST")) as fh:
                if int(fh.read().split()[0]) >= 2:
                    break
        except (OSError, ValueError, IndexError):
            pass
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGUSR1)
    _, err = p.communicate(timeout=120)
    expect(p.returncode == 75, f"SIGUSR1: exit {p.returncode}, expected 75: {err.strip()[-300:]}")
    code, _, e = run(common + ["--resume"], 1, app, mpi)
    expect(code == 0, f"resume after SIGUSR1: exit {code}: {e.strip()[-300:]}")
    with h5py.File(out, "r") as f:
        expect(list(f["/steps/step"][:]) == list(range(1, 41)), "resume after SIGUSR1 ends with steps 1..40")


def rank_pids(out):
    """pids of the pulse-train processes (not mpirun) whose command line names `out`."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/comm") as fh:
                comm = fh.read().strip()
            with open(f"/proc/{d}/cmdline", "rb") as fh:
                cmdline = fh.read().split(b"\0")
        except OSError:
            continue
        if comm == "pulse-train" and out.encode() in cmdline:
            pids.append(int(d))
    return pids


def catches_usr1(pid):
    """Whether the process has a handler for SIGUSR1 (bit 10 of SigCgt in /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (signal.SIGUSR1 - 1)))
    except OSError:
        pass
    return False


def age_ms(pid):
    """Milliseconds since the process started (field 22 of /proc/PID/stat, in clock ticks)."""
    with open(f"/proc/{pid}/stat") as fh:
        start_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as fh:
        uptime = float(fh.read().split()[0])
    return 1000.0 * (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


def check_early_signal(app, mpi, tmp):
    """A time-limit or preemption signal that reaches the ranks during start-up."""
    np_ = 2
    common = BASE + ["--steps", "4", "--prompts-per-step", "4", "--inference-ranks", "1", "--checkpoint-every", "0"]
    ref = os.path.join(tmp, "early-ref.h5")
    code, _, e = run(common + ["--out", ref], np_, app, mpi)
    expect(code == 0, f"early signal: reference run exit {code}: {e.strip()[-300:]}")
    out = os.path.join(tmp, "early.h5")
    p = launch(common + ["--out", out], np_, app, mpi)
    signalled = {}
    deadline = time.time() + 60
    while len(signalled) < np_ and time.time() < deadline and p.poll() is None:
        for pid in rank_pids(out):
            if pid not in signalled and catches_usr1(pid):
                try:
                    signalled[pid] = age_ms(pid)
                    os.kill(pid, signal.SIGUSR1)
                except (OSError, ValueError, IndexError):
                    pass
        time.sleep(0.002)
    _, err = p.communicate(timeout=120)
    ages = sorted(signalled.values())
    print(f"early signal: SIGUSR1 reached the ranks {[round(a) for a in ages]} ms after they started", flush=True)
    expect(len(ages) == np_, f"early signal: signalled {len(ages)} of {np_} ranks")
    # 10-40 ms on an idle machine; a loaded one can take longer to load the binary and reach
    # main. What makes the signal early is checked below: it came before step 1 (checkpoint 0).
    expect(all(a <= 1000 for a in ages), f"early signal: sent {ages} ms after start, not within 1 s")
    expect(p.returncode == 75, f"early signal: exit {p.returncode}, expected 75: {err.strip()[-300:]}")
    step, _ = checkpoint_buffers(os.path.join(tmp, "early.ckpt"))
    expect(step == 0, f"early signal: the stop wrote checkpoint {step}, expected the initial state (0)")
    code, _, e = run(common + ["--out", out, "--resume"], np_, app, mpi)
    expect(code == 0, f"early signal: resume exit {code}: {e.strip()[-300:]}")
    s_ref, b_ref = checkpoint_buffers(os.path.join(tmp, "early-ref.ckpt"))
    s_res, b_res = checkpoint_buffers(os.path.join(tmp, "early.ckpt"))
    expect(s_ref == s_res == 4, f"early signal: final checkpoints at {s_ref} and {s_res}")
    differ = sorted(k for k in b_ref.keys() | b_res.keys() if b_ref.get(k) != b_res.get(k))
    expect(not differ, f"early signal: resumed run differs from uninterrupted in {differ[:5]}")
    with h5py.File(ref, "r") as a, h5py.File(out, "r") as b:
        for name in ("step", "changed", "loss", "reward", "patch_bytes"):
            expect(np.array_equal(a[f"/steps/{name}"][:], b[f"/steps/{name}"][:]),
                   f"early signal: /steps/{name} differs after resume")
    # During an SFT warm start nothing can be checkpointed yet: exit 75, no output, no cached
    # warm start, and the message says to run again without --resume.
    folder = os.path.join(tmp, "early-sft")
    os.makedirs(folder)
    init = os.path.join(folder, "sft.safetensors")
    i = BASE.index("--init")
    args = BASE[:i] + BASE[i + 2:] + ["--steps", "4", "--prompts-per-step", "4", "--init", init, "--sft-steps", "100000",
                        "--out", os.path.join(folder, "run.h5")]
    p = launch(args, 1, app, mpi)
    time.sleep(1.0)
    os.killpg(p.pid, signal.SIGUSR1)
    out_text, err = p.communicate(timeout=120)
    expect(p.returncode == 75, f"signal during warm start: exit {p.returncode}, expected 75: {err.strip()[-300:]}")
    expect("without --resume" in out_text, f"signal during warm start: no advice in {out_text.strip()[-300:]!r}")
    expect(os.listdir(folder) == [], f"signal during warm start: files written: {os.listdir(folder)}")


def check_bad_input(app, mpi, tmp):
    bad = os.path.join(tmp, "bad")
    os.makedirs(bad)
    cfg = os.path.join(bad, "unknown.toml")
    with open(cfg, "w") as fh:
        fh.write("steps = 3\nlearning-rate-typo = 1e-3\n")
    blocker = os.path.join(bad, "a_file")
    open(blocker, "w").close()
    cases = [
        (["--config", cfg], 1, "unknown config key"),
        (["--lr", "-1"], 1, "negative lr"),
        (["--inference-ranks", "2"], 2, "more inference ranks than ranks"),
        (["--out", os.path.join(blocker, "run.h5")], 1, "unwritable output"),
    ]
    before = sorted(os.listdir(bad))
    for args, np_, what in cases:
        full = BASE + ["--steps", "2", "--prompts-per-step", "2"] + (["--out", os.path.join(bad, "x.h5")] if "--out" not in args else []) + args
        code, out, err = run(full, np_, app, mpi, timeout=120)
        lines = [l for l in err.strip().splitlines() if l.startswith("pulse-train:")]
        expect(code != 0, f"{what}: exit code 0")
        expect(len(lines) >= 1, f"{what}: no 'pulse-train:' error line in {err.strip()[-300:]!r}")
        expect(sorted(os.listdir(bad)) == before, f"{what}: files created: {sorted(os.listdir(bad))}")
    # An existing output is refused without --overwrite and stays byte-identical.
    existing = os.path.join(bad, "existing.h5")
    with open(existing, "wb") as fh:
        fh.write(b"not yours")
    code, _, err = run(BASE + ["--steps", "2", "--prompts-per-step", "2", "--out", existing], 1, app, mpi)
    expect(code != 0 and "exist" in err, f"existing output: exit {code}, {err.strip()[-200:]!r}")
    expect(open(existing, "rb").read() == b"not yours", "existing output was changed")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--app", required=True)
    parser.add_argument("--mpiexec", required=True)
    parser.add_argument("--mpi-flags", default="")
    parser.add_argument("--sft-app", required=True)
    parser.add_argument("--np", default="1,2,4")
    args = parser.parse_args()
    mpi = [args.mpiexec] + shlex.split(args.mpi_flags)
    with tempfile.TemporaryDirectory() as tmp:
        # A warm start that solves about half of the 1-digit problems, so rewards vary within
        # groups and the weights move (from random weights every reward would be 0).
        init = os.path.join(tmp, "sft")
        subprocess.run([args.sft_app, "--model", "tiny", "--digits", "1", "--steps", "100", "--eval-every", "100",
                        "--out", init], check=True, stdout=subprocess.DEVNULL)
        BASE.extend(["--init", os.path.join(init, "model.safetensors")])
        for np_ in [int(x) for x in args.np.split(",")]:
            d = os.path.join(tmp, f"np{np_}")
            os.makedirs(d)
            check_statistics_against_anchors(args.app, mpi, np_, d)
            check_kill_and_resume(args.app, mpi, np_, d)
        check_ddp_matches_single_rank(args.app, mpi, tmp)
        check_overlap_changes_nothing(args.app, mpi, tmp)
        check_init_folder(args.app, mpi, tmp, os.path.join(init, "model.safetensors"))
        check_signal(args.app, mpi, tmp)
        check_early_signal(args.app, mpi, tmp)
        check_bad_input(args.app, mpi, tmp)
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
