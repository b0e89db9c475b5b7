"""Prints the build targets that the tests ctest selects would run, so a second build of pulse
(make test-openmp's) compiles only what it tests. A target is named by a test when its output
file is the test's command or one of its arguments (apps passed to Python tests as --app PATH).
The commands come from the CTestTestfile.cmake files CMake writes at configure time: ctest's own
listing leaves out the command of a test whose executable is not built yet, which in a fresh
build folder is every one. The targets and their output files come from CMake's file API (the
codemodel, which any generator writes; the folder is configured once more to write it if absent).
    python3 cmake/test-targets.py BUILD_DIR [ctest selection arguments...]"""
import glob
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


def target_outputs(build):
    """{absolute path of an output file: its target's name}, from the file API's codemodel."""
    api = os.path.join(build, ".cmake", "api", "v1")
    if not glob.glob(os.path.join(api, "reply", "index-*.json")):
        os.makedirs(os.path.join(api, "query"), exist_ok=True)
        open(os.path.join(api, "query", "codemodel-v2"), "a").close()
        subprocess.run(["cmake", build], check=True, capture_output=True)
    reply = os.path.join(api, "reply")

    def read(name):
        with open(os.path.join(reply, name)) as f:
            return json.load(f)

    index = read(os.path.basename(max(glob.glob(os.path.join(reply, "index-*.json")))))
    outputs = {}
    for configuration in read(index["reply"]["codemodel-v2"]["jsonFile"])["configurations"]:
        for entry in configuration["targets"]:
            target = read(entry["jsonFile"])
            for artifact in target.get("artifacts", []):
                outputs[os.path.normpath(os.path.join(os.path.abspath(build), artifact["path"]))] = target["name"]
    return outputs


def main():
    build, selection = sys.argv[1], sys.argv[2:]
    listing = json.loads(subprocess.run(["ctest", "-N", "--show-only=json-v1", *selection], cwd=build, check=True,
                                        capture_output=True, text=True).stdout)
    outputs = target_outputs(build)
    commands = test_commands(build)
    named = set()
    for test in listing["tests"]:
        if test["name"] not in commands:
            sys.exit("pulse: no add_test for " + test["name"] + " in the CTestTestfile.cmake files of " + build)
        for word in commands[test["name"]]:
            for part in word.split("="):  # --app=PATH as well as --app PATH
                target = outputs.get(os.path.normpath(os.path.abspath(part)))
                if target:
                    named.add(target)
    if not named:
        sys.exit("pulse: the selected tests name no target of " + build)
    print(" ".join(sorted(named)))


if __name__ == "__main__":
    main()
