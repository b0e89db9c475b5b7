"""cmake --install puts `pulse` where the configured Python finds it: the module's install script
runs into a fresh prefix, and a Python with only that site-packages folder on its path imports
pulse and round-trips a patch.
Run: test_install.py --cmake cmake --script build/python/cmake_install.cmake --site lib/python3.X/dist-packages"""
import argparse
import os
import subprocess
import sys
import tempfile

CHECK = """
import numpy as np, pulse
a = {"w": np.arange(1000, dtype=np.float32)}
b = {"w": a["w"].copy()}
b["w"][::10] += 1
pulse.apply(a, pulse.encode(a, b, base_version=0, target_version=1))
assert (a["w"] == b["w"]).all() and pulse.__file__.startswith(PREFIX), pulse.__file__
print("installed pulse works:", pulse.__file__)
"""


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cmake", required=True)
    p.add_argument("--script", required=True)
    p.add_argument("--site", required=True, help="PULSE_PYTHON_INSTALL_DIR, relative to the prefix")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as prefix:
        subprocess.run([args.cmake, f"-DCMAKE_INSTALL_PREFIX={prefix}", "-P", args.script], check=True,
                       capture_output=True)
        env = dict(os.environ, PYTHONPATH=os.path.join(prefix, args.site))
        subprocess.run([sys.executable, "-c", f"PREFIX = {prefix!r}\n" + CHECK], check=True, env=env, cwd=prefix)


if __name__ == "__main__":
    main()
