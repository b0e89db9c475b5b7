# ctest driver: build fuzz targets with clang in a sub-build (tests/fuzz as its own project),
# write seed files, and fuzz each target for FUZZ_SECONDS.
#   cmake -DFUZZ_SOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=... -DCLANGXX=... [-DFUZZ_SECONDS=20]
#         [-DFUZZ_SET=safetensors|patch|relay|train] -P run_fuzz_smoke.cmake
# FUZZ_SET safetensors (default): parse_header, parse_safetensors_index and plan_folder (a model
# folder's flat form). patch: parse_patch +
# apply_patch, as the checksummed input and with the checksum rewritten over each mutated input.
# relay: HEAD and anchor records, and relay file names. train: pulse-train's config parser and its
# rank checkpoint reader (also with the checksum rewritten).
foreach(var FUZZ_SOURCE_DIR WORK_DIR GENERATOR CLANGXX)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_fuzz_smoke.cmake: ${var} is not set")
  endif()
endforeach()
if(NOT FUZZ_SECONDS)
  set(FUZZ_SECONDS 20)
endif()
if(NOT FUZZ_SET)
  set(FUZZ_SET safetensors)
endif()
if(FUZZ_SET STREQUAL "safetensors")
  set(seeder fuzz_safetensors_seeds)
  set(fuzzers fuzz_safetensors_header fuzz_safetensors_index fuzz_model_folder)
  set(dict safetensors.dict)
elseif(FUZZ_SET STREQUAL "patch")
  set(seeder fuzz_patch_seeds)
  set(fuzzers fuzz_patch_decoder fuzz_patch_decoder_rechecksummed)
  set(dict patch.dict)
elseif(FUZZ_SET STREQUAL "relay")
  set(seeder fuzz_relay_seeds)
  set(fuzzers fuzz_relay_records fuzz_relay_names)
  set(dict relay.dict)
elseif(FUZZ_SET STREQUAL "train")
  set(seeder fuzz_train_seeds)
  set(fuzzers fuzz_train_config fuzz_train_checkpoint fuzz_train_checkpoint_rechecksummed)
  set(dict train.dict)
else()
  message(FATAL_ERROR "run_fuzz_smoke.cmake: FUZZ_SET is safetensors, patch, relay or train, not '${FUZZ_SET}'")
endif()

set(build "${WORK_DIR}/build")
# The build folder is kept between runs (incremental rebuilds); the corpus starts afresh.
file(REMOVE_RECURSE "${WORK_DIR}/seeds")
file(MAKE_DIRECTORY "${WORK_DIR}/seeds")

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
step(build ${CMAKE_COMMAND} --build "${build}" --target ${seeder} ${fuzzers})
step(seeds "${build}/${seeder}" "${WORK_DIR}/seeds")
foreach(fuzzer IN LISTS fuzzers)
  set(corpus "${WORK_DIR}/corpus-${fuzzer}")
  file(REMOVE_RECURSE "${corpus}")
  file(MAKE_DIRECTORY "${corpus}")
  step(${fuzzer} "${build}/${fuzzer}" "${corpus}" "${WORK_DIR}/seeds"
       -dict=${FUZZ_SOURCE_DIR}/${dict} -max_len=4096 -max_total_time=${FUZZ_SECONDS}
       -artifact_prefix=${WORK_DIR}/${fuzzer}- -print_final_stats=1)
  string(REGEX MATCH "Done [0-9]+ runs in [0-9]+ second" done "${step_output}")
  string(REGEX MATCH "stat::new_units_added: +[0-9]+" added "${step_output}")
  message(STATUS "fuzz smoke ${fuzzer}: ${done}(s), ${added}, no crash")
endforeach()
