"""What every pulse app's command line does alike: --version prints the app and pulse's version,
a mistyped subcommand or option is named with the closest valid one in one line (exit 2), and
--help shows each option's default.
    test_cli_conventions.py --pulse-version 0.1.0 --app pulse-sync=build/apps/pulse-sync ...
"""
import argparse
import re
import subprocess
import sys

from expect import expect, failures  # noqa: E402


def run(app, *args):
    return subprocess.run([app, *map(str, args)], capture_output=True, text=True, timeout=60)


# Per app: a mistyped option (typed, meant) with what precedes it on the command line, and an
# option whose default --help must show ("--name", default as printed).
TYPOS = {
    "pulse-sync": (["encode"], "--bsae", "--base"),
    "pulse-train": ([], "--stpes", "--steps"),
    "pulse-sft": ([], "--stpes", "--steps"),
    "pulse-absorb": ([], "--precison", "--precision"),
    "pulse-measure": (["-o", "x.h5"], "--max-kk", "--max-k"),
}
DEFAULTS = {
    "pulse-sync": (["encode", "--help"], "--level", "3"),
    "pulse-train": (["--help"], "--model", "tiny"),
    "pulse-sft": (["--help"], "--model", "tiny"),
    "pulse-absorb": (["--help"], "--precision", "mixed"),
    "pulse-measure": (["--help"], "--max-k", "32"),
}


# Per app: a 64-bit unsigned option (what precedes it, the option, the least value it takes).
# CLI11 alone wraps -1 to 2^64-1 and saturates 2^64 and beyond.
UNSIGNED = {
    "pulse-sync": (["publish"], "--anchor-every", 1),
    "pulse-train": ([], "--seed", 0),
    "pulse-sft": ([], "--seed", 0),
    "pulse-absorb": ([], "--seed", 0),
}


def one_line_error(r):
    return r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def check_app(name, app, pulse_version):
    r = run(app, "--version")
    expect(r.returncode == 0 and re.fullmatch(rf"{name} {re.escape(pulse_version)} \(git [^)]+\)\n", r.stdout),
           f"{name} --version: '{r.stdout}' {r.stderr}")

    before, typed, meant = TYPOS[name]
    r = run(app, *before, typed, "1")
    expect(one_line_error(r) and f"{typed}: unknown option; did you mean {meant}?" in r.stderr,
           f"{name} {typed}: {r.returncode} '{r.stderr}'")
    r = run(app, *before, "--zzzzzzzz")
    expect(one_line_error(r) and "--zzzzzzzz: unknown option" in r.stderr and "did you mean" not in r.stderr,
           f"{name}: nothing close to --zzzzzzzz must be suggested: '{r.stderr}'")

    if name in UNSIGNED:
        before, option, least = UNSIGNED[name]
        for value in ("-1", str(2**64), str(2**64 + 1), "1e3", str(least - 1) if least else ""):
            if not value:
                continue
            r = run(app, *before, option, value)
            expect(one_line_error(r) and f"'{value}' is not an integer from {least} to 2^64-1" in r.stderr,
                   f"{name} {option} {value}: {r.returncode} '{r.stderr.strip()}'")

    args, option, default = DEFAULTS[name]
    r = run(app, *args)
    lines = [line for line in r.stdout.splitlines() if re.match(rf"\s+{option}\b", line)]
    expect(r.returncode == 0 and lines and re.search(rf"={re.escape(default)}(\s|$)", lines[0]),
           f"{name} {' '.join(args)} must show {option}'s default {default}: {lines}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pulse-version", required=True)
    parser.add_argument("--app", action="append", required=True, help="NAME=PATH")
    args = parser.parse_args()
    apps = dict(a.split("=", 1) for a in args.app)
    expect(set(apps) == set(TYPOS), f"every app is tested: {sorted(apps)}")
    for name, app in apps.items():
        check_app(name, app, args.pulse_version)

    sync = apps["pulse-sync"]
    for typed, meant in (("encod", "encode"), ("verfiy", "verify"), ("inspcet", "inspect")):
        r = run(sync, typed, "--base", "x")
        expect(one_line_error(r) and f"unknown subcommand '{typed}'; did you mean '{meant}'?" in r.stderr,
               f"pulse-sync {typed}: {r.returncode} '{r.stderr}'")
    r = run(sync, "zzzzzz")
    expect(one_line_error(r) and "unknown subcommand 'zzzzzz'" in r.stderr and "did you mean" not in r.stderr,
           f"pulse-sync zzzzzz: '{r.stderr}'")
    r = run(sync, "publish", "--help")  # publish's own --version (of the checkpoint) is kept
    expect(r.returncode == 0 and re.search(r"--version UINT", r.stdout), f"publish --version: {r.stdout}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
