"""Options for the report tests: the pulse-train binary and how to launch it under MPI."""
import os
import shlex


def pytest_addoption(parser):
    parser.addoption("--app", help="pulse-train binary (test_report.py)")
    parser.addoption("--sft", help="pulse-sft binary, the warm start of the runs (test_report.py)")
    parser.addoption("--mpiexec", default="mpirun", help="MPI launcher")
    parser.addoption("--mpiexec-flags", default=None,
                     help="extra launcher flags (space- or ;-separated; default: --oversubscribe, "
                          "and --allow-run-as-root when root)")


def launcher(config, np):
    flags = config.getoption("--mpiexec-flags")
    if flags is None:
        flags = ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    else:
        flags = shlex.split(flags.replace(";", " "))
    return [config.getoption("--mpiexec"), "-n", str(np)] + flags
