# docs/statistics.md must hold exactly the table `pulse-train --print-schema` prints, so the
# documented datasets are the ones the writer declares (src/train/stats_schema.cpp); and
# docs/pulse-measure.md pulse-measure's (src/measure/stats_schema.cpp).
#   cmake -DAPP=pulse-train -DDOC=docs/statistics.md -P schema_table.cmake
execute_process(COMMAND ${APP} --print-schema OUTPUT_VARIABLE table RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${APP} --print-schema exited ${rc}")
endif()
file(READ ${DOC} doc)
string(FIND "${doc}" "${table}" at)
if(at EQUAL -1)
  get_filename_component(name ${APP} NAME)
  message(FATAL_ERROR "${DOC} does not hold the table of `${name} --print-schema`: paste its output there")
endif()
