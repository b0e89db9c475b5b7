# Thin front for CMake. The two commands a new user needs: `make run` and `make test`.
BUILD ?= build
CMAKE_FLAGS ?=
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# Debian's python carries the apt python3-* packages; a pyenv python3 first on PATH does not.
PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || echo python3)

.PHONY: deps deps-run build build-run run test test-fast test-determinism test-openmp bench clean

# Debian packages (cmake/debian-deps.sh): what `make run` needs, and what the tests add.
deps-run:
	@cmake/debian-deps.sh run

deps:
	@cmake/debian-deps.sh test

# `make run` builds only pulse-train, without the tests and benchmarks (and their packages);
# `make test` turns them back on in the same build folder.
build-run: deps-run
	cmake -S . -B $(BUILD) -DPULSE_PYTHON=$(PYTHON) -DPULSE_ENABLE_TESTS=OFF -DPULSE_ENABLE_BENCHMARKS=OFF $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS) --target pulse-train

build: deps
	cmake -S . -B $(BUILD) -DPULSE_PYTHON=$(PYTHON) -DPULSE_ENABLE_TESTS=ON -DPULSE_ENABLE_BENCHMARKS=ON $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

# mpirun needs --allow-run-as-root as root; --oversubscribe lets 2 ranks share fewer cores.
MPIRUN ?= mpirun --oversubscribe $(if $(filter 0,$(shell id -u)),--allow-run-as-root,)

# default.toml starts from an SFT warm start that pulse-train makes on first use and caches in
# runs/sft-tiny-d2-800 (delete it to make it again). The same run again in pure BF16 (weights and
# Adam state in BF16, no FP32 master): the paper's regime, reported beside the default.
run: build-run
	mkdir -p runs
	$(MPIRUN) -n 2 $(BUILD)/apps/pulse-train --config jobs/configs/default.toml --out runs/default.h5 --overwrite
	$(MPIRUN) -n 2 $(BUILD)/apps/pulse-train --config jobs/configs/default.toml --precision bf16 --out runs/default-bf16.h5 --overwrite
	cd analysis && $(PYTHON) -m pulse_analysis report ../runs/default.h5 ../runs/default-bf16.h5 -o ../runs/default

# Every test once: the fast lane's tiers (unit, mpi) first, so a broken build or kernel fails in
# minutes, then the other tiers (oracle, e2e, fuzz, slow; cmake/PulseTestHarness.cmake).
FAST_TIERS = '^(unit|mpi)$$'
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L $(FAST_TIERS)
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE $(FAST_TIERS)

# The fast lane alone: the unit and MPI tiers.
test-fast: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L $(FAST_TIERS)

# The determinism tests again under every OpenBLAS kernel set the CPU runs (AVX2, and AVX-512
# where present) at 1 and 2 BLAS threads (cmake/determinism-check.sh).
test-determinism: build
	cmake/determinism-check.sh $(BUILD)

# The same tests against a threaded Kokkos (OpenMP) built from ../shared/vendor (CI has it; skipped
# without it), then again with the kernels' device code paths forced on the host backends
# (PULSE_FORCE_DEVICE_PATHS=1), and kernel_digest identical for Serial, OpenMP at 1, 2 and 4
# threads, on both code paths (cmake/openmp-check.sh).
test-openmp: build
	PULSE_PYTHON=$(PYTHON) cmake/openmp-check.sh $(BUILD) $(BUILD)-omp

# PULSE_BENCH_BIG=llama-7b make bench (or qwen2-1.5b) adds the big-folder benchmark against the
# prime-rl-format peer (apps/bench/big_folder_bench.py); off by default and in CI (disk, time).
bench: build
	$(PYTHON) apps/bench/run_benchmarks.py --build $(BUILD) --out runs/bench

clean:
	rm -rf $(BUILD)
