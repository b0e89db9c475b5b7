"""Options for the Slurm tests: the pulse-train binary (its build folder is the jobs' PULSE_BUILD)."""


def pytest_addoption(parser):
    parser.addoption("--app", required=True, help="pulse-train binary")
