"""Prints the build targets that the tests ctest selects would run, so a second build of pulse
(make test-openmp's) compiles only what it tests. A target is named by a test when its output
file is the test's command or one of its arguments (apps passed to Python tests as --app PATH).
The commands come from the CTestTestfile.cmake files CMake writes at configure time: ctest's own
listing leaves out the command of a test whose executable is not built yet, which in a fresh
build folder is every one.
    python3 cmake/test-targets.py BUILD_DIR [ctest selection arguments...]"""
import json
import os
import re
import subprocess
import sys

# add_test(NAME "word" "word" ...) as CMake writes it; a word is "quoted" or [=[bracketed]=].
ADD_TEST = re.compile(r'^add_test\((.*)\)\s*$')
WORD = re.compile(r'"((?:[^"\\]|\\.)*)"|\[(=*)\[(.*?)\]\2\]|(\S+)')


def words(text):
    for quoted, _, bracketed, bare in WORD.findall(text):
        yield quoted or bracketed or bare


def test_commands(build):
    """{test name: its command words}, from every CTestTestfile.cmake under BUILD."""
    commands = {}
    for folder, _, files in os.walk(build):
        if "CTestTestfile.cmake" in files:
            with open(os.path.join(folder, "CTestTestfile.cmake")) as testfile:
                for line in testfile:
                    match = ADD_TEST.match(line)
                    if match:
                        name, *command = words(match.group(1))
                        commands[name] = command
    return commands


def main():
    build, selection = sys.argv[1], sys.argv[2:]
    listing = json.loads(subprocess.run(["ctest", "-N", "--show-only=json-v1", *selection], cwd=build, check=True,
                                        capture_output=True, text=True).stdout)
    help_text = subprocess.run(["cmake", "--build", build, "--target", "help"], check=True, capture_output=True,
                               text=True).stdout
    targets = {line[4:].split()[0] for line in help_text.splitlines() if line.startswith("... ")}
    commands = test_commands(build)
    named = set()
    for test in listing["tests"]:
        if test["name"] not in commands:
            sys.exit("pulse: no add_test for " + test["name"] + " in the CTestTestfile.cmake files of " + build)
        for word in commands[test["name"]]:
            for part in word.split("="):  # --app=PATH as well as --app PATH
                name = os.path.basename(part)
                if name in targets and os.path.abspath(part).startswith(os.path.abspath(build)):
                    named.add(name)
    if not named:
        sys.exit("pulse: the selected tests name no target of " + build)
    print(" ".join(sorted(named)))


if __name__ == "__main__":
    main()
