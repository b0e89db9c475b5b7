#pragma once
// Applying a patch from one .safetensors file to another without loading the model, tensor by
// tensor in a pipeline on `threads` threads: the patch's parts are decoded each on a thread; a
// changed tensor's segments are read from the base one at a time into a buffer (pread),
// decoded against it, patched there and hashed and written out in pieces while in cache, each
// 4 MiB started on its way to disk at once (the bytes pass once through memory); an unchanged
// tensor is copied into the output's temporary file in the kernel (copy_file_range) and hashed
// from the copy (a changed tensor with a segment over 64 MiB, from an older or another
// encoder, is copied too, decoded against the copy, mapped read-only, and written over it); a
// thread flushes the finished parts behind the writers (core/flush_behind.hpp), so the disk
// works while later parts are decoded; the file is renamed over the output once the target
// digest verifies (one verify: the base's bytes are hashed only where a tensor is unchanged, or
// read again after a failure to tell a wrong base from a corrupt patch). Memory holds the
// patch, the decoded changes of the tensors in flight (those of at most 2 x threads parts) and
// a segment buffer per thread, not the model; the output keeps the base's header bytes (tensor
// order, padding) exactly. A model folder's shards go through the same pipeline at once
// (apply_folder, below). The output's bytes do not depend on the thread count.
#include <cstdint>
#include <string>
#include <vector>

#include "coding/parallel.hpp"
#include "sync/checkpoint.hpp"
#include "sync/patch.hpp"

namespace pulse::sync {

// True when apply_file can take the apply: base a regular file that is not zstd-compressed,
// out a path where save_state would write a plain file (not an existing folder, no trailing '/',
// not ".zst"), base_layout (from the base's header) carrying no folder files, and a patch that
// changes neither the layout nor the metadata. Otherwise the caller loads the base whole.
bool file_apply_fits(const std::string& base, const std::string& out, const std::vector<TensorRef>& base_layout,
                     const ParsedPatch& patch);

// Applies patch to the file base, writing out atomically: on any failure (a corrupt patch, a
// base that is not the patch's base, an I/O error) the temporary file is removed and out keeps
// its old content or stays absent. The header is validated from its copy in the output and
// every digest is computed from the bytes written, so a base changed while being read is
// refused, never applied to. out may be base (in place). threads >= 1 (1: everything
// on the calling thread; more: threads - 1 workers, and the flush-behind thread, which only
// waits for the disk).
// Returns the elements written; apply_seconds gets the time before the final fsync.
std::uint64_t apply_file(const std::string& base, const ParsedPatch& patch, const std::string& out,
                         unsigned threads = resolve_threads(0), double* apply_seconds = nullptr);

// A model folder's apply, the same pipeline over its shards at once (each shard copied into
// the new folder's shard of the same name and patched there; the index, config and tokenizer
// files, in memory since the folder was opened, written from the patched state), into a new
// folder swapped in whole once every digest verifies (io/folder_swap.hpp; out may be the base
// itself, for --in-place: then a shard the patch leaves as it is is hard-linked, not copied). Memory holds the patch, the decoded changes in flight, the folder's
// other files and a chunk per thread, not the shards. It fits (folder_apply_fits) when base
// (opened with io::ShardBytes::header_only) is a folder, out is where save_state would write a
// folder, and the patch changes neither the layout, the metadata nor the index.
bool folder_apply_fits(const OpenState& base, const std::string& out, const ParsedPatch& patch);
// An existing out is replaced under save_state's rule (check_replaceable_folder, with replace).
std::uint64_t apply_folder(const OpenState& base, const ParsedPatch& patch, const std::string& out,
                           ReplaceFolder replace, unsigned threads = resolve_threads(0),
                           double* apply_seconds = nullptr);

}  // namespace pulse::sync
