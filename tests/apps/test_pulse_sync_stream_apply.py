"""pulse-sync apply from a .safetensors file to a .safetensors file, streamed (the base copied
into the output tensor by tensor and patched there, sync/file_apply.hpp): the output is
byte-identical to the load-whole path's (--no-stream) for keydiff and expclass patches, on one
thread or several (--threads), in place too; it keeps the base's header bytes; and a corrupt
patch, a wrong base, a truncated base, a failing write or --threads -1 leave no output, an
existing output untouched and no temporary file (tests/sync/test_stream_apply.cpp: mid-stream).
    test_pulse_sync_stream_apply.py --app build/apps/pulse-sync
"""
import argparse
import os
import resource
import signal
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_ref  # noqa: E402

from expect import expect, failures  # noqa: E402


def run(app, *args, file_size=None):
    def limits():
        if file_size is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
    return subprocess.run([app, *map(str, args)], capture_output=True, text=True, timeout=120, preexec_fn=limits)


def bf16_bits(x):
    return torch.from_numpy(np.asarray(x, dtype=np.float32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def header_bytes(data):
    n = int.from_bytes(data[:8], "little")
    return data[:8 + n]


def one_line_error(r):
    return r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--app", required=True)
    app = ap.parse_args().app
    rng = np.random.default_rng(16)
    with tempfile.TemporaryDirectory() as d:
        def p(name):
            return os.path.join(d, name)

        base = [("blocks.0.qkv.weight", "BF16", bf16_bits(rng.standard_normal((700, 100)) * 0.02)),
                ("blocks.0.ln.bias", "BF16", bf16_bits(rng.standard_normal(37) * 0.02)),
                ("empty", "BF16", np.zeros((0,), np.uint16)),
                ("scale", "F32", np.array([1.0, 2.0], np.float32)),
                ("step", "I64", np.array(7, np.int64))]
        target = []
        for name, dtype, a in base:
            a = a.copy()
            if dtype == "BF16":
                flat = a.reshape(-1)
                hit = rng.random(flat.size) < 0.01  # 99% sparsity
                flat[hit] = bf16_bits(rng.standard_normal(int(hit.sum())) * 0.02)
            elif dtype == "F32":
                a[1] = 3.0  # carried whole
            target.append((name, dtype, a))
        meta = {"format": "pt"}
        safetensors_ref.write(p("ref_base.safetensors"), base, meta)  # json.dumps' spacing, not pulse's
        safetensors_ref.write(p("target.safetensors"), target, meta)
        # The same base as pulse's writer lays it out: through an identity patch, loaded whole.
        r = run(app, "encode", "--base", p("ref_base.safetensors"), "--target", p("ref_base.safetensors"), "-o", p("id.pulse"))
        expect(r.returncode == 0, f"identity encode: {r.stderr}")
        r = run(app, "apply", "--no-stream", "--base", p("ref_base.safetensors"), "--patch", p("id.pulse"), "-o", p("base.safetensors"))
        expect(r.returncode == 0, f"identity apply: {r.stderr}")
        expect(header_bytes(read_bytes(p("base.safetensors"))) != header_bytes(read_bytes(p("ref_base.safetensors"))),
               "pulse's writer and the reference writer lay headers out alike: the header check below proves nothing")

        for values in ("keydiff", "expclass"):
            patch = p(f"{values}.pulse")
            r = run(app, "encode", "--base", p("base.safetensors"), "--target", p("target.safetensors"), "-o", patch, "--values", values)
            expect(r.returncode == 0, f"encode {values}: {r.stderr}")
            r = run(app, "apply", "--no-stream", "--base", p("base.safetensors"), "--patch", patch, "-o", p(f"old-{values}.safetensors"))
            expect(r.returncode == 0, f"apply --no-stream {values}: {r.stderr}")
            r = run(app, "apply", "--base", p("base.safetensors"), "--patch", patch, "-o", p(f"new-{values}.safetensors"))
            expect(r.returncode == 0, f"streamed apply {values}: {r.stderr}")
            old, new = read_bytes(p(f"old-{values}.safetensors")), read_bytes(p(f"new-{values}.safetensors"))
            expect(old == new, f"{values}: the streamed output differs from the load-whole output")
            for threads in (1, 3):  # all on one thread; and copy, decode and write on their own
                r = run(app, "apply", "--threads", threads, "--base", p("base.safetensors"), "--patch", patch,
                        "-o", p(f"t{threads}-{values}.safetensors"))
                expect(r.returncode == 0 and read_bytes(p(f"t{threads}-{values}.safetensors")) == old,
                       f"{values}: streamed apply --threads {threads}: {r.stderr}")
            got, got_meta = safetensors_ref.read(p(f"new-{values}.safetensors"))
            expect(got_meta == meta and all(np.array_equal(got[n][1], a) for n, _, a in target),
                   f"{values}: the streamed output is not the target (independent reader)")
            expect(os.stat(p(f"new-{values}.safetensors")).st_mode & 0o777 == 0o644, f"{values}: output mode")
            # In place: the same bytes, atomically.
            with open(p("inplace.safetensors"), "wb") as f:
                f.write(read_bytes(p("base.safetensors")))
            r = run(app, "apply", "--in-place", p("inplace.safetensors"), "--patch", patch)
            expect(r.returncode == 0 and read_bytes(p("inplace.safetensors")) == old, f"{values}: in-place apply: {r.stderr}")

        # A base from another writer: the streamed output keeps its header bytes (it is a copy
        # patched in place) and its tensors are the target's.
        r = run(app, "encode", "--base", p("ref_base.safetensors"), "--target", p("target.safetensors"), "-o", p("ref.pulse"))
        r = run(app, "apply", "--base", p("ref_base.safetensors"), "--patch", p("ref.pulse"), "-o", p("ref_out.safetensors"))
        out = read_bytes(p("ref_out.safetensors"))
        expect(r.returncode == 0 and header_bytes(out) == header_bytes(read_bytes(p("ref_base.safetensors"))),
               f"streamed output must keep the base's header: {r.stderr}")
        expect(out[len(header_bytes(out)):] == read_bytes(p("target.safetensors"))[len(header_bytes(out)):],
               "streamed output's data section must be the target's")
        # Any output name where a file is written streams (a state from a file goes to a file).
        r = run(app, "apply", "--base", p("ref_base.safetensors"), "--patch", p("ref.pulse"), "-o", p("ref_out.bin"))
        expect(r.returncode == 0 and read_bytes(p("ref_out.bin")) == out, f"-o ref_out.bin must stream too: {r.stderr}")

        # Failures: no output, an existing output untouched, no temporary file left.
        patch = read_bytes(p("keydiff.pulse"))
        corrupt = bytearray(patch)
        corrupt[len(corrupt) // 2] ^= 0x40
        with open(p("corrupt.pulse"), "wb") as f:
            f.write(bytes(corrupt))
        with open(p("short_base.safetensors"), "wb") as f:
            f.write(read_bytes(p("base.safetensors"))[:-10])
        cases = [("corrupt patch", ["--base", p("base.safetensors"), "--patch", p("corrupt.pulse")], None),
                 ("wrong base", ["--base", p("target.safetensors"), "--patch", p("keydiff.pulse")], None),
                 ("truncated base", ["--base", p("short_base.safetensors"), "--patch", p("keydiff.pulse")], None),
                 ("write fails midway", ["--base", p("base.safetensors"), "--patch", p("keydiff.pulse")], 4096)]
        for what, args, file_size in cases:
            r = run(app, "apply", *args, "-o", p("absent.safetensors"), file_size=file_size)
            expect(one_line_error(r) and not os.path.exists(p("absent.safetensors")),
                   f"{what}: must fail with one line and write nothing: rc={r.returncode} {r.stderr}")
            with open(p("existing.safetensors"), "wb") as f:
                f.write(b"the old output")
            r = run(app, "apply", *args, "-o", p("existing.safetensors"), file_size=file_size)
            expect(one_line_error(r) and read_bytes(p("existing.safetensors")) == b"the old output",
                   f"{what}: an existing output must stay as it was: rc={r.returncode} {r.stderr}")
            if what == "wrong base":
                expect("not the patch's base" in r.stderr, f"wrong base: the error must say so: {r.stderr}")
            leftovers = [f for f in os.listdir(d) if ".tmp." in f]
            expect(not leftovers, f"{what}: temporary files left: {leftovers}")

        r = run(app, "apply", "--threads", -1, "--base", p("base.safetensors"), "--patch", p("keydiff.pulse"), "-o", p("absent.safetensors"))
        expect(one_line_error(r) and not os.path.exists(p("absent.safetensors")), f"--threads -1 must be refused: {r.stderr}")
        # --threads 0: the cores, the same output as one thread.
        r = run(app, "apply", "--threads", 0, "--base", p("base.safetensors"), "--patch", p("keydiff.pulse"), "-o", p("t0.safetensors"))
        expect(r.returncode == 0 and read_bytes(p("t0.safetensors")) == read_bytes(p("t1-keydiff.safetensors")),
               f"--threads 0 (the cores): {r.stderr}")

        # Patches that change the layout or the metadata take the load-whole path and still apply.
        grown = target + [("added", "F32", np.array([5.0], np.float32))]
        safetensors_ref.write(p("grown.safetensors"), grown, {"format": "pt", "step": "2"})
        r = run(app, "encode", "--base", p("base.safetensors"), "--target", p("grown.safetensors"), "-o", p("grown.pulse"))
        r = run(app, "apply", "--base", p("base.safetensors"), "--patch", p("grown.pulse"), "-o", p("grown_out.safetensors"))
        got, got_meta = safetensors_ref.read(p("grown_out.safetensors"))
        expect(r.returncode == 0 and got_meta == {"format": "pt", "step": "2"} and
               all(np.array_equal(got[n][1], a) for n, _, a in grown), f"layout-changing patch: {r.stderr}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
