# ctest driver: build the fuzz target with clang in a sub-build (tests/fuzz as its own
# project), write seed files, and fuzz parse_header for FUZZ_SECONDS.
#   cmake -DFUZZ_SOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=... -DCLANGXX=... [-DFUZZ_SECONDS=20]
#         -P run_fuzz_smoke.cmake
foreach(var FUZZ_SOURCE_DIR WORK_DIR GENERATOR CLANGXX)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_fuzz_smoke.cmake: ${var} is not set")
  endif()
endforeach()
if(NOT FUZZ_SECONDS)
  set(FUZZ_SECONDS 20)
endif()

set(build "${WORK_DIR}/build")
# The build folder is kept between runs (incremental rebuilds); the corpus starts afresh.
file(REMOVE_RECURSE "${WORK_DIR}/seeds" "${WORK_DIR}/corpus")
file(MAKE_DIRECTORY "${WORK_DIR}/seeds" "${WORK_DIR}/corpus")

function(step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "fuzz smoke ${name} failed (${rc}):\n${out}")
  endif()
  message(STATUS "fuzz smoke ${name}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

step(configure ${CMAKE_COMMAND} -S "${FUZZ_SOURCE_DIR}" -B "${build}" -G "${GENERATOR}"
     -DCMAKE_CXX_COMPILER=${CLANGXX})
step(build ${CMAKE_COMMAND} --build "${build}")
step(seeds "${build}/fuzz_safetensors_seeds" "${WORK_DIR}/seeds")
step(fuzz "${build}/fuzz_safetensors_header" "${WORK_DIR}/corpus" "${WORK_DIR}/seeds"
     -dict=${FUZZ_SOURCE_DIR}/safetensors.dict -max_len=4096 -max_total_time=${FUZZ_SECONDS}
     -artifact_prefix=${WORK_DIR}/ -print_final_stats=1)
string(REGEX MATCH "Done [0-9]+ runs in [0-9]+ second" done "${step_output}")
string(REGEX MATCH "stat::new_units_added: +[0-9]+" added "${step_output}")
message(STATUS "fuzz smoke: ${done}(s), ${added}, no crash")
