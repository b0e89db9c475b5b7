# Runs dead_trainer at np 2 with rank 1 dying (HOW = exit | kill); passes when mpiexec ends
# the job by itself, well within the limit, with a non-zero status.
execute_process(COMMAND ${RUN_PREFIX} ${DRIVER} ${HOW}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
if(rc MATCHES "timeout")
  message(FATAL_ERROR "dead trainer (${HOW}): the surviving trainer hung: ${rc}")
endif()
if(rc EQUAL 0 OR rc EQUAL 3)
  message(FATAL_ERROR "dead trainer (${HOW}): the job ended with status ${rc}, the failure went unnoticed\n${out}\n${err}")
endif()
message(STATUS "dead trainer (${HOW}): job ended with status ${rc}")
