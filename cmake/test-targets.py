"""Prints the build targets that the tests ctest selects would run, so a second build of pulse
(make test-openmp's) compiles only what it tests. A target is named by a test when its output
file is the test's command or one of its arguments (apps passed to Python tests as --app PATH).
    python3 cmake/test-targets.py BUILD_DIR [ctest selection arguments...]"""
import json
import os
import subprocess
import sys

build, selection = sys.argv[1], sys.argv[2:]
listing = json.loads(subprocess.run(["ctest", "-N", "--show-only=json-v1", *selection], cwd=build, check=True,
                                    capture_output=True, text=True).stdout)
help_text = subprocess.run(["cmake", "--build", build, "--target", "help"], check=True, capture_output=True,
                           text=True).stdout
targets = {line[4:].split()[0] for line in help_text.splitlines() if line.startswith("... ")}
named = set()
for test in listing["tests"]:
    for word in test.get("command", []):
        for part in word.split("="):  # --app=PATH as well as --app PATH
            name = os.path.basename(part)
            if name in targets and os.path.abspath(part).startswith(os.path.abspath(build)):
                named.add(name)
if not named:
    sys.exit("pulse: the selected tests name no target of " + build)
print(" ".join(sorted(named)))
