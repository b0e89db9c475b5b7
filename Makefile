# Thin front for CMake. The two commands a new user needs: `make run` and `make test`.
BUILD ?= build
CMAKE_FLAGS ?=
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# Debian's python carries the apt python3-* packages; a pyenv python3 first on PATH does not.
PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || echo python3)

.PHONY: deps build run test bench clean

deps:
	@cmake/debian-deps.sh

build: deps
	cmake -S . -B $(BUILD) -DPULSE_PYTHON=$(PYTHON) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

run: build
	$(BUILD)/apps/pulse-absorb --out runs/default
	cd analysis && $(PYTHON) -m pulse_analysis absorb ../runs/default/absorption.json -o ../runs/default

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

bench: build
	$(PYTHON) apps/bench/run_benchmarks.py --build $(BUILD) --out runs/bench

clean:
	rm -rf $(BUILD)
