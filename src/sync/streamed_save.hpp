#pragma once
// Writing a model state that is read one tensor at a time (tensors whose data is null come from
// a TensorLoader, as sync/streamed_state.hpp gives them): relay anchors on publish, and the
// state pull writes when it applies no patch. Each tensor is read once, hashed as it is read and
// written; the output appears (atomically, under save_state's rules) only once the digest of
// what was written is checked. Memory: one tensor and zstd's window, not the model.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sync/checkpoint.hpp"
#include "sync/patch.hpp"

namespace pulse::sync {

class StreamedState;

// Writes the state as one .safetensors file at path (the flat form: a folder's files as U8
// tensors), zstd-compressed at zstd_level as one frame that declares its size when path ends in
// ".zst". check(state digest of the bytes written) runs before the file appears; it throws to
// keep it from appearing. Returns the bytes of the safetensors form (before compression).
std::uint64_t write_streamed_checkpoint(const std::string& path, const std::vector<TensorRef>& tensors,
                                        const Metadata& metadata, const TensorLoader& loader, int zstd_level,
                                        const std::function<void(const Digest&)>& check);

// save_state for a streamed state: a file or a folder, chosen and replaced by save_state's rules
// (state.folder() as from_folder). With expected, nothing appears unless the state digest of the
// bytes written is *expected. A folder is checked by its headers read back (names, dtypes,
// shapes, metadata) and the digests of the bytes written. Returns true for a folder.
bool save_streamed_state(const std::string& path, const StreamedState& state, const Digest* expected,
                         ReplaceFolder replace = ReplaceFolder::if_nothing_lost);

}  // namespace pulse::sync
