"""pulse's FP32 -> BF16 cast against PyTorch's .to(torch.bfloat16) on 16M random bit patterns
plus every special class (zeros, subnormals, rounding ties, the overflow boundary, infinities,
NaNs with payloads).

PyTorch has two CPU paths: its scalar/default kernels (c10::BFloat16 round_to_nearest_even)
map every NaN to 0x7FC0, its AVX2/AVX512 vector kernels to 0xFFFF. pulse follows c10 (the
canonical NaN, also what `torch.tensor(float('nan'), dtype=torch.bfloat16)` holds). So:
  - with ATEN_CPU_CAPABILITY=default every bit pattern must match, NaNs included;
  - with the machine's vector kernels every non-NaN must match and NaNs must stay NaN.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

TORCH_CAST = """
import sys, numpy as np, torch
x = torch.from_numpy(np.fromfile(sys.argv[1], dtype=np.float32))
x.to(torch.bfloat16).view(torch.int16).numpy().tofile(sys.argv[2])
print(next(l.split(":")[1].strip() for l in torch.__config__.show().splitlines() if "CPU capability" in l))
"""


def inputs(rng):
    random_bits = rng.integers(0, 2**32, size=1 << 24, dtype=np.uint64).astype(np.uint32)
    special = []
    for sign in (0, 0x80000000):
        for high in (0x0000, 0x0001, 0x007F, 0x0080, 0x3F80, 0x3F81, 0x7F7F, 0x7F80, 0x7FC0, 0x7FFF):
            for low in (0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF):
                special.append(sign | (high << 16) | low)
    return np.concatenate([np.array(special, dtype=np.uint32), random_bits])


def torch_cast(python, path, out, capability):
    env = dict(os.environ)
    if capability:
        env["ATEN_CPU_CAPABILITY"] = capability
    used = subprocess.run([python, "-c", TORCH_CAST, path, out], env=env, check=True,
                          capture_output=True, text=True).stdout.strip()
    return np.fromfile(out, dtype=np.uint16), used


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--driver", required=True)
    args = parser.parse_args()
    x = inputs(np.random.default_rng(7))
    is_nan = np.isnan(x.view(np.float32))
    failures = []
    with tempfile.TemporaryDirectory() as d:
        src, ours_path, theirs_path = (os.path.join(d, f) for f in ("x.f32", "ours.u16", "theirs.u16"))
        x.tofile(src)
        subprocess.run([args.driver, src, ours_path], check=True)
        ours = np.fromfile(ours_path, dtype=np.uint16)
        for capability in ("default", None):
            theirs, used = torch_cast(sys.executable, src, theirs_path, capability)
            if capability == "default":
                bad = np.flatnonzero(ours != theirs)
            else:
                bad = np.flatnonzero((ours != theirs) & ~is_nan)
                theirs_nan = ((theirs & 0x7F80) == 0x7F80) & ((theirs & 0x7F) != 0)
                bad = np.union1d(bad, np.flatnonzero(is_nan & ~theirs_nan))
            print(f"PyTorch kernels '{used}': {x.size} values, {bad.size} differ "
                  f"(NaN: PyTorch {sorted(set(hex(v) for v in theirs[is_nan]))}, pulse {sorted(set(hex(v) for v in ours[is_nan]))})")
            for i in bad[:5]:
                failures.append(f"{used}: 0x{x[i]:08x} -> pulse 0x{ours[i]:04x}, PyTorch 0x{theirs[i]:04x}")
    if not np.all(ours[is_nan] == 0x7FC0):
        failures.append("a NaN did not become 0x7FC0")
    for f in failures:
        print("FAIL", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
