# One helper registers every test (Cabana's test_harness idea):
#   pulse_add_test(NAME n SOURCES a.cpp... [MPI] [NPROCS np...] [TIER t] [LABELS l...] [ARGS a...] [TIMEOUT s])
# builds one GoogleTest executable; an MPI test runs at np 1, 2 and 4 (or NPROCS) through
# MPIEXEC_EXECUTABLE.
#   pulse_add_python_test(NAME n TIER t SCRIPT file.py [ARGS a...] [LABELS l...] [TIMEOUT s] [NEEDS module...]
#                         [PULSE_MODULE])
# runs a script with Debian's python (PULSE_PYTHON), e.g. the PyTorch oracles. Each module in NEEDS
# (torch, h5py, ...) must import: a missing one skips the test (exit 77), and fails it when the
# environment variable CI is set, so CI never passes without the listed dependencies.
# PULSE_MODULE puts the build tree's `pulse` package (build/python) and pulse_analysis on PYTHONPATH.
#
# Every test carries exactly one tier label (docs/testing.md): unit (one process, seconds), mpi
# (under mpirun), oracle (against an independent implementation: PyTorch, h5py, the reference
# decoder), e2e (built apps, scripts, installs, run whole), fuzz, slow (e2e runs of tens of
# seconds and more). A C++ test's tier is unit, or mpi with MPI, unless TIER says otherwise.
# `make test-fast` runs unit and mpi; `make test` runs them first, then every other tier. LABELS
# adds selections that are not tiers: determinism (make test-determinism), gpu (tests/gpu/check.sh),
# backend (make test-openmp: the tests whose code runs Kokkos kernels, which another Kokkos backend
# may run differently), device_paths (make test-openmp runs them again on the kernels' device code
# paths). A C++ test is a backend test when its first source sits in the test folder
# of a layer that runs Kokkos kernels (PULSE_BACKEND_TEST_FOLDERS); other tests say LABELS backend.
set(PULSE_TEST_TIERS unit mpi oracle e2e fuzz slow)
set(PULSE_BACKEND_TEST_FOLDERS kernels comm shard model loco rl train)
function(pulse_check_tier name tier)
  if(NOT tier IN_LIST PULSE_TEST_TIERS)
    message(FATAL_ERROR "test ${name}: tier '${tier}' is not one of ${PULSE_TEST_TIERS}")
  endif()
endfunction()

set(PULSE_TEST_NPROCS 1 2 4 CACHE STRING "Rank counts at which MPI tests run")

# Open MPI refuses more ranks than cores and refuses root unless told; other MPIs need neither.
set(PULSE_MPIEXEC_EXTRA_FLAGS "")
execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _pulse_mpiexec_version ERROR_QUIET)
if(_pulse_mpiexec_version MATCHES "Open MPI|OpenRTE")
  list(APPEND PULSE_MPIEXEC_EXTRA_FLAGS --oversubscribe)
  execute_process(COMMAND id -u OUTPUT_VARIABLE _pulse_uid OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_pulse_uid STREQUAL "0")
    list(APPEND PULSE_MPIEXEC_EXTRA_FLAGS --allow-run-as-root)
  endif()
endif()

# MPI tests run through cmake/mpi-test.sh, which reruns a command once only when Open MPI's
# launcher flagged a rank that had passed every test (the script says when and why).
set(PULSE_MPI_TEST_RUNNER ${CMAKE_CURRENT_LIST_DIR}/mpi-test.sh)

add_library(pulse_test_main STATIC ${CMAKE_CURRENT_LIST_DIR}/../tests/support/test_main.cpp)
target_link_libraries(pulse_test_main PUBLIC pulse GTest::gtest)
add_library(pulse_test_main_mpi STATIC ${CMAKE_CURRENT_LIST_DIR}/../tests/support/test_main_mpi.cpp)
target_link_libraries(pulse_test_main_mpi PUBLIC pulse GTest::gtest)
# Tests include their shared helpers as "support/...", from whichever folder of tests/ they sit in.
target_include_directories(pulse_test_main PUBLIC ${CMAKE_CURRENT_LIST_DIR}/../tests)
target_include_directories(pulse_test_main_mpi PUBLIC ${CMAKE_CURRENT_LIST_DIR}/../tests)

function(pulse_add_test)
  cmake_parse_arguments(T "MPI" "NAME;TIMEOUT;TIER" "SOURCES;LABELS;ARGS;NPROCS" ${ARGN})
  if(NOT T_TIER)
    if(T_MPI)
      set(T_TIER mpi)
    else()
      set(T_TIER unit)
    endif()
  endif()
  pulse_check_tier(${T_NAME} ${T_TIER})
  list(GET T_SOURCES 0 _first_source)
  string(REGEX REPLACE "/.*" "" _folder "${_first_source}")
  if(_folder IN_LIST PULSE_BACKEND_TEST_FOLDERS)
    list(APPEND T_LABELS backend)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  if(T_MPI)
    target_link_libraries(${T_NAME} PRIVATE pulse_test_main_mpi)
    if(NOT T_NPROCS)
      set(T_NPROCS ${PULSE_TEST_NPROCS})
    endif()
    foreach(np IN LISTS T_NPROCS)
      add_test(NAME ${T_NAME}_np${np}
        COMMAND sh ${PULSE_MPI_TEST_RUNNER} ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} ${PULSE_MPIEXEC_EXTRA_FLAGS}
                ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${T_NAME}> ${MPIEXEC_POSTFLAGS} ${T_ARGS})
      set_tests_properties(${T_NAME}_np${np} PROPERTIES
        PROCESSORS ${np} TIMEOUT ${T_TIMEOUT} LABELS "${T_TIER};${T_LABELS}")
    endforeach()
  else()
    target_link_libraries(${T_NAME} PRIVATE pulse_test_main)
    add_test(NAME ${T_NAME} COMMAND ${T_NAME} ${T_ARGS})
    set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_TIER};${T_LABELS}")
  endif()
endfunction()

function(pulse_add_python_test)
  cmake_parse_arguments(T "PULSE_MODULE" "NAME;SCRIPT;TIMEOUT;TIER" "ARGS;LABELS;NEEDS" ${ARGN})
  pulse_check_tier(${T_NAME} "${T_TIER}")
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  string(JOIN "," _needs ${T_NEEDS})
  add_test(NAME ${T_NAME}
    COMMAND ${PULSE_PYTHON} ${PROJECT_SOURCE_DIR}/tests/support/run_python_test.py "--needs=${_needs}" --
            ${T_SCRIPT} ${T_ARGS})
  # exit 77: a module in NEEDS is missing outside CI (in CI, with CI set, that fails instead)
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_TIER};${T_LABELS}" SKIP_RETURN_CODE 77)
  if(T_PULSE_MODULE)
    set_tests_properties(${T_NAME} PROPERTIES
      ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python:${PROJECT_SOURCE_DIR}/analysis")
  endif()
endfunction()

#   pulse_add_missing_test(NAME n WHY reason)
# stands in for a test the suite promises but could not configure (its dependency is missing):
# it fails with the reason, so `make test` never passes with fewer tests than README promises.
function(pulse_add_missing_test)
  cmake_parse_arguments(T "" "NAME;WHY" "" ${ARGN})
  add_test(NAME ${T_NAME} COMMAND sh -c "echo \"pulse: ${T_NAME} is not configured: ${T_WHY}\" >&2; exit 1")
  set_tests_properties(${T_NAME} PROPERTIES LABELS "missing")
endfunction()
