#pragma once
// Applying a patch from one .safetensors file to another without loading the model: the base
// is copied into the output's temporary file (copy_file_range, so the bytes stay in the kernel
// and a filesystem with reflinks may share them), that copy is mapped and patched in place by
// apply_patch, and the file is renamed over the output once the target digest verifies. Memory
// holds the patch and its decoded changes, not the model; the output keeps the base's header
// bytes (tensor order, padding) exactly.
#include <cstdint>
#include <string>
#include <vector>

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
// its old content or stays absent. The header is validated from the copy itself, and apply_patch
// checks the copy's digest, so a base changed while being copied is refused, never applied to.
// out may be base (in place). Returns the elements written; apply_seconds gets apply_patch's time.
std::uint64_t apply_file(const std::string& base, const ParsedPatch& patch, const std::string& out,
                         double* apply_seconds = nullptr);

}  // namespace pulse::sync
