# A doc must hold exactly the table an app prints, so the documented rows are the ones the code
# declares: docs/statistics.md the datasets of `pulse-train --print-schema` (src/train/stats_schema.cpp),
# docs/pulse-measure.md those of `pulse-measure --print-schema` (src/measure/stats_schema.cpp),
# docs/pulse-train.md the settings of `pulse-train --print-options` (src/train/train_config.cpp).
#   cmake -DAPP=pulse-train -DFLAG=--print-schema -DDOC=docs/statistics.md -P schema_table.cmake
execute_process(COMMAND ${APP} ${FLAG} OUTPUT_VARIABLE table RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${APP} ${FLAG} exited ${rc}")
endif()
file(READ ${DOC} doc)
string(FIND "${doc}" "${table}" at)
if(at EQUAL -1)
  get_filename_component(name ${APP} NAME)
  message(FATAL_ERROR "${DOC} does not hold the table of `${name} ${FLAG}`: paste its output there")
endif()
