# pulse's layers, lowest first: one folder, one library target and one list of sources each.
# A layer may include its own folder and those of the layers it links, nothing else: the build
# compiles each layer with an include path that holds only its folder (as a link in the build
# tree, build/layers/<layer>/<layer> -> src/<layer>), and linking a layer adds that layer's folder.
# An include of a higher layer is then a build error ("No such file"); tests/layering checks it.
#
#   Kokkos- and MPI-free (the fuzzers and the Python module need no Kokkos runtime):
#     core        errors, files, tensor table, index_t, element comparisons, block change logs (src/core)
#     coding      varint, gap coding, range coder, compression, digests, signing (src/coding)
#     io          safetensors, model folders on disk, folder swaps (src/io)
#     sync        the PULSESync patch: format, encode, decode, apply, relay, model folders (src/sync)
#   With MPI only:
#     stats_file  the HDF5 statistics file (src/io/stats_file, rank 0 writes; MPI, HDF5)
#   With Kokkos and MPI:
#     kernels     the header-only Kokkos kernels (kernels/)
#     comm        the communicator and collectives (src/comm)
#     shard       sharded patch senders and receivers over MPI (src/shard)
#     model, loco, rl; then measure, train and cli, which are the apps' (apps/CMakeLists.txt)
# The source lists are shared with the fuzz build (tests/fuzz), which compiles them instrumented.
set(PULSE_CORE_SOURCES core/atomic_file.cpp core/block_change_log.cpp core/element_compare.cpp core/error.cpp
  core/file_read.cpp core/flush_behind.cpp core/tensor_table.cpp core/version.cpp)
set(PULSE_CODING_SOURCES coding/compress.cpp coding/digest.cpp coding/index_coding.cpp
  coding/range_coder.cpp coding/signing.cpp)
set(PULSE_IO_SOURCES io/folder_swap.cpp io/model_state.cpp io/safetensors.cpp io/swap_marker.cpp)
set(PULSE_STATS_FILE_SOURCES io/stats_columns.cpp io/stats_file.cpp)
set(PULSE_SYNC_SOURCES sync/change_entropy.cpp sync/change_history.cpp sync/change_set.cpp sync/checkpoint.cpp
  sync/codec_choice.cpp sync/compressed_checkpoint.cpp sync/exponent_class_coding.cpp
  sync/file_apply.cpp sync/model_folder.cpp sync/part_coding.cpp sync/patch.cpp sync/patch_decode.cpp
  sync/patch_encode.cpp sync/patch_parse.cpp sync/patch_summary.cpp sync/patch_table.cpp sync/relay.cpp
  sync/relay_lock_record.cpp sync/relay_names.cpp sync/relay_record.cpp sync/streamed_save.cpp
  sync/streamed_state.cpp sync/tensor_slice_spec.cpp)
set(PULSE_COMM_SOURCES comm/agree.cpp comm/communicator.cpp comm/wait.cpp)
set(PULSE_SHARD_SOURCES shard/sharded_receiver.cpp shard/sharded_sender.cpp shard/sharded_sums.cpp
  shard/sliced_apply.cpp)
set(PULSE_MODEL_SOURCES model/gpt.cpp model/gpt_decoder.cpp)
set(PULSE_LOCO_SOURCES loco/exchange.cpp loco/outer_sync.cpp loco/sparse_payload.cpp loco/trainer_sync.cpp)
set(PULSE_RL_SOURCES rl/grpo.cpp rl/rollout.cpp rl/sft_trainer.cpp rl/task.cpp rl/tokenizer.cpp)

# pulse_layer(<target> FOLDER <layer folder> [SOURCES <files relative to src>...]
#             [PUBLIC <targets>...] [PRIVATE <targets>...])
# A static library (an interface library without sources) whose include path is its folder's view.
function(pulse_layer target)
  cmake_parse_arguments(arg "" "FOLDER" "SOURCES;PUBLIC;PRIVATE" ${ARGN})
  get_filename_component(layer ${arg_FOLDER} NAME)
  set(view ${PROJECT_BINARY_DIR}/layers/${target})
  file(MAKE_DIRECTORY ${view})
  file(CREATE_LINK ${arg_FOLDER} ${view}/${layer} SYMBOLIC)
  if(arg_SOURCES)
    list(TRANSFORM arg_SOURCES PREPEND ${PROJECT_SOURCE_DIR}/src/)
    add_library(${target} STATIC ${arg_SOURCES})
    target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${view}> $<INSTALL_INTERFACE:include/pulse>)
    target_link_libraries(${target} PUBLIC pulse_options ${arg_PUBLIC} PRIVATE ${arg_PRIVATE})
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>)
    if(PULSE_PYTHON_MODULE)  # the extension module links the static libraries into a shared object
      set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
    endif()
  else()
    add_library(${target} INTERFACE)
    target_include_directories(${target} INTERFACE $<BUILD_INTERFACE:${view}> $<INSTALL_INTERFACE:include/pulse>)
    target_link_libraries(${target} INTERFACE pulse_options ${arg_PUBLIC})
  endif()
endfunction()
