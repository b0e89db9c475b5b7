# ctest driver: install the current pulse build into a prefix under WORK_DIR, then configure,
# build and run tests/downstream against it, the way a user's project would.
#   cmake -DPULSE_BUILD_DIR=... -DDOWNSTREAM_SOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=...
#         -DCXX_COMPILER=... "-DRUN_PREFIX=mpiexec;-n;2;..." -P run_downstream.cmake
foreach(var PULSE_BUILD_DIR DOWNSTREAM_SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_downstream.cmake: ${var} is not set")
  endif()
endforeach()

set(prefix "${WORK_DIR}/prefix")
set(build "${WORK_DIR}/build")
file(REMOVE_RECURSE "${WORK_DIR}")

function(step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "downstream ${name} failed (${rc}):\n${out}")
  endif()
  message(STATUS "downstream ${name}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

step(install ${CMAKE_COMMAND} --install "${PULSE_BUILD_DIR}" --prefix "${prefix}")
step(configure ${CMAKE_COMMAND} -S "${DOWNSTREAM_SOURCE_DIR}" -B "${build}" -G "${GENERATOR}"
     -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_BUILD_TYPE=Release
     -DCMAKE_PREFIX_PATH=${prefix})
# The package must come from the prefix, not from the build tree or a system install.
file(STRINGS "${build}/CMakeCache.txt" pulse_dir REGEX "^pulse_DIR:")
if(NOT pulse_dir MATCHES "^pulse_DIR:PATH=${prefix}/")
  message(FATAL_ERROR "downstream found pulse elsewhere: ${pulse_dir}")
endif()
step(build ${CMAKE_COMMAND} --build "${build}")
step(run ${RUN_PREFIX} "${build}/pulse_downstream")
if(NOT step_output MATCHES "pulse_downstream: ok")
  message(FATAL_ERROR "downstream run printed no success line:\n${step_output}")
endif()
