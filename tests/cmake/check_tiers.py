"""Every registered test carries exactly one tier label (cmake/PulseTestHarness.cmake, docs/testing.md),
so `make test`'s two passes (the unit and mpi tiers, then the rest) run each test exactly once.
    python3 check_tiers.py BUILD_DIR CTEST"""
import json
import subprocess
import sys

TIERS = {"unit", "mpi", "oracle", "e2e", "fuzz", "slow"}

build, ctest = sys.argv[1], sys.argv[2]
listing = json.loads(subprocess.run([ctest, "-N", "--show-only=json-v1"], cwd=build, check=True,
                                    capture_output=True, text=True).stdout)
bad = []
for test in listing["tests"]:
    labels = next((p["value"] for p in test.get("properties", []) if p["name"] == "LABELS"), [])
    tiers = [label for label in labels if label in TIERS]
    if len(tiers) != 1 and "missing" not in labels:
        bad.append(f"{test['name']}: tiers {tiers or 'none'}")
if len(listing["tests"]) < 50:
    bad.append(f"only {len(listing['tests'])} tests listed")
if bad:
    print("pulse: tests without exactly one tier label:\n  " + "\n  ".join(bad), file=sys.stderr)
    sys.exit(1)
print(f"{len(listing['tests'])} tests, each with one tier")
