"""cmake/test-targets.py names the targets a ctest selection runs in a build folder that is
configured but not built (make test-openmp's case: ctest's listing then has no commands), for
tests that run a target and for tests that pass one as an argument (--app PATH, --app=PATH),
with CMake's Makefiles and with Ninja (make test-openmp's generator where installed).
    python3 check_test_targets.py SOURCE_DIR CMAKE"""
import os
import subprocess
import sys
import tempfile

source, cmake = sys.argv[1], sys.argv[2]
script = os.path.join(source, "cmake", "test-targets.py")
PROJECT = """cmake_minimum_required(VERSION 3.19)  # CMP0110: any characters in a test name
project(targets_check LANGUAGES C)
enable_testing()
foreach(name runs_alone passed_as_app passed_with_equals not_tested)
  add_executable(${name} main.c)
endforeach()
add_test(NAME alone COMMAND runs_alone)
add_test(NAME [=[with space]=] COMMAND sh -c "echo $<TARGET_FILE:passed_as_app>" --app $<TARGET_FILE:passed_as_app>)
add_test(NAME equals COMMAND sh -c true --app=$<TARGET_FILE:passed_with_equals>)
set_tests_properties(alone PROPERTIES LABELS one)
"""


def targets(build, *selection):
    run = subprocess.run([sys.executable, script, build, *selection], capture_output=True, text=True)
    return run.returncode, run.stdout.split(), run.stderr.strip()


def check(generator):
    """The failures of test-targets.py on the scratch project configured with GENERATOR."""
    failures = []
    with tempfile.TemporaryDirectory() as work:
        src, build = os.path.join(work, "src"), os.path.join(work, "build")
        os.mkdir(src)
        with open(os.path.join(src, "CMakeLists.txt"), "w") as f:
            f.write(PROJECT)
        with open(os.path.join(src, "main.c"), "w") as f:
            f.write("int main(void) { return 0; }\n")
        configure = subprocess.run([cmake, "-S", src, "-B", build, "-G", generator], capture_output=True, text=True)
        if configure.returncode != 0:
            return [f"configure fails (ninja-build is a test package): {configure.stderr.strip()}"]
        expected = [
            ((), ["passed_as_app", "passed_with_equals", "runs_alone"]),
            (("-L", "one"), ["runs_alone"]),
            (("-R", "space"), ["passed_as_app"]),
            (("-E", "alone"), ["passed_as_app", "passed_with_equals"]),
        ]
        for selection, want in expected:
            code, got, err = targets(build, *selection)
            if code != 0 or got != want:
                failures.append(f"selection {list(selection)}: exit {code}, targets {got} ({err}), expected {want}")
        code, got, err = targets(build, "-R", "no_such_test")
        if code == 0 or "name no target" not in err:
            failures.append(f"an empty selection: exit {code}, {got}, {err!r}; expected a one-line error")
        if any(os.path.exists(os.path.join(build, name)) for name in ("runs_alone", "passed_as_app")):
            failures.append("the check's targets were built: it must run on a configured, unbuilt folder")
    return failures


failures = [f"{generator}: {failure}" for generator in ("Unix Makefiles", "Ninja") for failure in check(generator)]
for failure in failures:
    print("test-targets.py:", failure)
sys.exit(1 if failures else 0)
