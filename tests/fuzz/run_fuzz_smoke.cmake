# ctest driver for the fuzz smoke tests. tests/fuzz is its own project, built with clang:
#   cmake -DFUZZ_SOURCE_DIR=... -DBUILD_DIR=... -DGENERATOR=... -DCLANGXX=... -DFUZZ_SET=build -P run_fuzz_smoke.cmake
# configures and builds every fuzz target and seed writer once, in parallel (test_fuzz_build, the
# fixture the others need);
#   cmake -DFUZZ_SOURCE_DIR=... -DBUILD_DIR=... -DWORK_DIR=... [-DFUZZ_SECONDS=20]
#         -DFUZZ_SET=safetensors|patch|relay|anchor|train|apply|stats -P run_fuzz_smoke.cmake
# writes seed files with that set's writer and fuzzes each of its targets for FUZZ_SECONDS.
# FUZZ_SET safetensors: parse_header, parse_safetensors_index and plan_folder (a model
# folder's flat form). patch: parse_patch +
# apply_patch, as the checksummed input and with the checksum rewritten over each mutated input;
# and round trips (random state and change -> encode -> parse -> apply == target).
# relay: HEAD and anchor records, and relay file names. anchor: compressed relay anchors. train:
# pulse-train's config parser, its rank checkpoint reader (also with the checksum rewritten) and
# the LATEST record. apply: the streamed file-to-file apply of encoded, then damaged, patches
# and base files. stats: the statistics file as --resume reads it (files up to 4 KiB of input).
function(require)
  foreach(var ${ARGN})
    if(NOT DEFINED ${var})
      message(FATAL_ERROR "run_fuzz_smoke.cmake: ${var} is not set")
    endif()
  endforeach()
endfunction()

function(step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "fuzz smoke ${name} failed (${rc}):\n${out}")
  endif()
  message(STATUS "fuzz smoke ${name}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

require(FUZZ_SOURCE_DIR BUILD_DIR FUZZ_SET)
if(FUZZ_SET STREQUAL "build")
  # The build folder is kept between runs (incremental rebuilds).
  require(GENERATOR CLANGXX)
  cmake_host_system_information(RESULT cores QUERY NUMBER_OF_LOGICAL_CORES)
  step(configure ${CMAKE_COMMAND} -S "${FUZZ_SOURCE_DIR}" -B "${BUILD_DIR}" -G "${GENERATOR}"
       -DCMAKE_CXX_COMPILER=${CLANGXX})
  step(build ${CMAKE_COMMAND} --build "${BUILD_DIR}" --parallel ${cores})
  return()
endif()

require(WORK_DIR)
if(NOT FUZZ_SECONDS)
  set(FUZZ_SECONDS 20)
endif()
if(FUZZ_SET STREQUAL "safetensors")
  set(seeder fuzz_safetensors_seeds)
  set(fuzzers fuzz_safetensors_header fuzz_safetensors_index fuzz_model_folder fuzz_swap_marker)
  set(dict safetensors.dict)
elseif(FUZZ_SET STREQUAL "patch")
  set(seeder fuzz_patch_seeds)
  set(fuzzers fuzz_patch_decoder fuzz_patch_decoder_rechecksummed)
  list(APPEND fuzzers fuzz_patch_roundtrip)
  set(dict patch.dict)
elseif(FUZZ_SET STREQUAL "relay")
  set(seeder fuzz_relay_seeds)
  set(fuzzers fuzz_relay_records fuzz_relay_names fuzz_relay_lock)
  set(dict relay.dict)
elseif(FUZZ_SET STREQUAL "anchor")
  set(seeder fuzz_anchor_seeds)
  set(fuzzers fuzz_compressed_anchor)
  set(dict safetensors.dict)
elseif(FUZZ_SET STREQUAL "train")
  set(seeder fuzz_train_seeds)
  set(fuzzers fuzz_train_config fuzz_train_checkpoint fuzz_train_checkpoint_rechecksummed fuzz_latest_record)
  set(dict train.dict)
elseif(FUZZ_SET STREQUAL "apply")
  set(seeder fuzz_apply_seeds)
  set(fuzzers fuzz_file_apply)
  set(dict patch.dict)
elseif(FUZZ_SET STREQUAL "stats")
  set(seeder fuzz_stats_seeds)
  set(fuzzers fuzz_stats_file)
  set(dict train.dict)
else()
  message(FATAL_ERROR "run_fuzz_smoke.cmake: FUZZ_SET is build, safetensors, patch, relay, anchor, train, apply or stats, not '${FUZZ_SET}'")
endif()

set(build "${BUILD_DIR}")
# The corpus starts afresh.
file(REMOVE_RECURSE "${WORK_DIR}/seeds")
file(MAKE_DIRECTORY "${WORK_DIR}/seeds")

step(seeds "${build}/${seeder}" "${WORK_DIR}/seeds")
foreach(fuzzer IN LISTS fuzzers)
  set(corpus "${WORK_DIR}/corpus-${fuzzer}")
  file(REMOVE_RECURSE "${corpus}")
  file(MAKE_DIRECTORY "${corpus}")
  # Targets that write files (apply, stats) write them under TMPDIR: the work folder.
  set(ENV{TMPDIR} "${WORK_DIR}")
  step(${fuzzer} "${build}/${fuzzer}" "${corpus}" "${WORK_DIR}/seeds"
       -dict=${FUZZ_SOURCE_DIR}/${dict} -max_len=4096 -max_total_time=${FUZZ_SECONDS}
       -artifact_prefix=${WORK_DIR}/${fuzzer}- -print_final_stats=1)
  string(REGEX MATCH "Done [0-9]+ runs in [0-9]+ second" done "${step_output}")
  string(REGEX MATCH "stat::new_units_added: +[0-9]+" added "${step_output}")
  message(STATUS "fuzz smoke ${fuzzer}: ${done}(s), ${added}, no crash")
endforeach()
