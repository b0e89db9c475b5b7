"""The peak resident set of one command, measured honestly: Linux starts a forked child's
maximum RSS (wait4's ru_maxrss) at its parent's, so a command forked straight from a large
Python process (a test that just generated a model) would report the parent's size. The command
is therefore forked from a fresh interpreter (about 10 MB), which reports the child's
ru_maxrss: an upper bound on the command's own peak by at most that much."""
import json
import os
import subprocess
import sys
import tempfile

_WRAPPER = r"""
import json, os, resource, sys
cmd, address_space, report = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
pid = os.fork()
if pid == 0:
    if address_space > 0:
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    try:
        os.execvp(cmd[0], cmd)
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
with open(report, "w") as f:
    json.dump({"rc": os.waitstatus_to_exitcode(status), "maxrss_kib": usage.ru_maxrss,
               "cpu_s": usage.ru_utime + usage.ru_stime}, f)
"""


def run(cmd, address_space=None):
    """(returncode, stdout, stderr, peak resident bytes, cpu seconds) of cmd (a list); with
    address_space, under that RLIMIT_AS (`ulimit -v`)."""
    with tempfile.TemporaryDirectory() as d:
        report = os.path.join(d, "report.json")
        r = subprocess.run([sys.executable, "-c", _WRAPPER, json.dumps([*map(str, cmd)]), str(address_space or 0), report],
                           capture_output=True, text=True)
        with open(report) as f:
            got = json.load(f)
    return got["rc"], r.stdout, r.stderr, got["maxrss_kib"] * 1024, got["cpu_s"]
