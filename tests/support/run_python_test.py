"""Runs a Python test script after checking that the modules it needs import.

A missing module skips the test (exit 77, ctest's SKIP_RETURN_CODE) on a developer's machine and
fails it in CI (environment variable CI set), so CI never passes without the dependencies
cmake/debian-deps.sh lists. Usage: run_python_test.py --needs=torch,h5py -- script.py [args...]
"""
import importlib
import os
import runpy
import sys

DEBIAN_PACKAGE = {"torch": "python3-torch", "numpy": "python3-numpy", "h5py": "python3-h5py",
                  "matplotlib": "python3-matplotlib", "pytest": "python3-pytest", "zstandard": "python3-zstandard"}


def main():
    sep = sys.argv.index("--")
    needs = [m for arg in sys.argv[1:sep] if arg.startswith("--needs=") for m in arg[8:].split(",") if m]
    missing = []
    for module in needs:
        try:
            importlib.import_module(module)
        except ImportError as e:
            missing.append(f"{module} ({e}; Debian: {DEBIAN_PACKAGE.get(module, 'python3-' + module)})")
    if missing:
        in_ci = bool(os.environ.get("CI"))
        print(f"{'FAIL' if in_ci else 'SKIP'}: {sys.executable} cannot import " + ", ".join(missing), file=sys.stderr)
        sys.exit(1 if in_ci else 77)
    script = sys.argv[sep + 1]
    sys.argv = sys.argv[sep + 1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
