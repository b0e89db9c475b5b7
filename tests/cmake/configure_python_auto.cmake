# make run configures before pybind11 is installed, make test after: with PULSE_ENABLE_PYTHON=AUTO
# the second configure of the same build folder must turn the Python module on, and while
# pybind11 is missing the suite must still list the module's tests, as failures naming the cause.
# Runs two configures of a scratch build folder (pybind11 hidden with
# CMAKE_DISABLE_FIND_PACKAGE_pybind11 in the first).
#   cmake -DSOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=... -DPYTHON=... -P configure_python_auto.cmake
file(REMOVE_RECURSE ${WORK_DIR})
function(configure extra expect_module)
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR} -G ${GENERATOR}
                          -DPULSE_PYTHON=${PYTHON} -DPULSE_ENABLE_TESTS=ON -DPULSE_ENABLE_BENCHMARKS=OFF ${extra}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "configure (${extra}) failed: ${err}")
  endif()
  if(NOT out MATCHES "Python module ${expect_module} \\(PULSE_ENABLE_PYTHON=AUTO\\)")
    message(FATAL_ERROR "configure (${extra}): expected the Python module ${expect_module}; output:\n${out}")
  endif()
endfunction()

configure("-DCMAKE_DISABLE_FIND_PACKAGE_pybind11=ON" OFF)
execute_process(COMMAND ${CMAKE_CTEST_COMMAND} -R "^test_pulse_module$" --output-on-failure
                WORKING_DIRECTORY ${WORK_DIR} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT "${out}${err}" MATCHES "test_pulse_module is not configured: the Python module is not built: pybind11 was not found")
  message(FATAL_ERROR "without pybind11, test_pulse_module must fail naming pybind11; ctest said (${rc}):\n${out}${err}")
endif()
configure("-DCMAKE_DISABLE_FIND_PACKAGE_pybind11=OFF" ON)
file(REMOVE_RECURSE ${WORK_DIR})
message(STATUS "the Python module is decided at every configure; missing, its tests fail with the cause")
