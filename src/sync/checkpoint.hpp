#pragma once
// Model states for pulse-sync, from and to safetensors files and Hugging Face model folders
// (in their flat form, sync/model_folder.hpp): read-only views for diffing and encoding, and
// in-memory copies (tensor order and metadata kept) for applying.
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "io/model_state.hpp"
#include "io/safetensors.hpp"
#include "sync/model_folder.hpp"
#include "sync/patch.hpp"

namespace pulse::sync {

// The tensors of a mapped file as patch tensors; they live as long as the file object.
std::vector<TensorRef> tensor_refs(const io::SafetensorsFile& file);

// A model state opened read-only: a .safetensors file, or a model folder in flat form.
struct OpenState {
  io::ModelState model;
  FlatFolder flat;  // tensors (views into model and flat.file_bytes) and metadata
  bool folder() const { return model.is_folder(); }
};
// Puts back a folder left missing by an interrupted two-rename swap first (io/folder_swap.hpp).
// With header_only the shard tensors' data are null (sync/streamed_state.hpp reads them).
OpenState open_state(const std::string& path, io::ShardBytes bytes = io::ShardBytes::whole);

struct Checkpoint {
  std::vector<TensorRef> layout;  // names, dtypes, shapes; data points into `data`
  std::vector<std::vector<std::byte>> data;
  std::map<std::string, std::string> metadata;
  bool folder = false;  // read from a model folder

  std::vector<MutableTensor> mutables();
};

// Applies a patch to a whole checkpoint: its tensors' bytes, its layout (added and removed
// tensors, added ones at the end) and its metadata; transactional as apply_patch, on `threads`
// threads (0: the cores).
std::uint64_t apply_to_checkpoint(const ParsedPatch& patch, Checkpoint& checkpoint, unsigned threads = 0);

// A .safetensors file or a model folder; a path ending in ".zst" holds a zstd-compressed
// safetensors file (relay anchors may be). Each tensor is read into its own buffer: memory
// holds the model once. max_state_bytes bounds what a compressed file may decode to, checked
// against its declared size before anything is allocated (a relay anchor's signed record names
// it); 0: physical memory.
Checkpoint load_checkpoint(const std::string& path, std::uint64_t max_state_bytes = 0);
// Atomic: the file at path holds either its old content or all of the new one; a path ending
// in ".zst" is written zstd-compressed at zstd_level.
// Returns the bytes of the safetensors form (before compression).
std::uint64_t save_checkpoint(const std::string& path, const Checkpoint& checkpoint, int zstd_level = 3);
// The same for a state held elsewhere (tensors' data where the caller keeps them).
std::uint64_t save_checkpoint(const std::string& path, const std::vector<TensorRef>& state, const Metadata& metadata,
                              int zstd_level = 3);

// Writes a state where pulse-sync's users name it: a model folder when path is an existing
// folder, or does not exist, does not end in ".safetensors" and the state is a folder (read
// from one, or carrying files; a path ending in '/' too); a .safetensors file otherwise (a state
// carrying files is refused there). A folder is written whole next to the old
// one, read back and checked against the state's digest, then swapped into place
// (io/folder_swap.hpp): on any failure the old folder stays exactly as it was. An existing
// folder is replaced only when it is empty or holds a model, and (unless `replace` says
// otherwise) only when replacing it deletes no file the new state does not write again: a
// folder holding other files (a relay, a config the state lacks, someone's home) is refused.
// Returns true for a folder.
enum class ReplaceFolder {
  if_nothing_lost,  // the default
  own_base,         // path is the state's own base (apply --in-place, pull --have DIR -o DIR)
  any_model,        // the user said so (--replace)
};
bool save_state(const std::string& path, const Checkpoint& checkpoint,
                ReplaceFolder replace = ReplaceFolder::if_nothing_lost);
// The same for a state held elsewhere, without a copy: from_folder as Checkpoint::folder. The
// folder written is read back in pieces, so memory holds the state once.
bool save_state(const std::string& path, const std::vector<TensorRef>& state, const Metadata& metadata,
                bool from_folder, ReplaceFolder replace = ReplaceFolder::if_nothing_lost);

// Throws pulse::Error (one line) unless the existing folder at path may be replaced by a folder
// holding the files `written` (paths relative to it): it is empty or holds a model, and with
// ReplaceFolder::if_nothing_lost every file in it but its shards and index is one of `written`.
// The rule of save_state and apply_folder.
void check_replaceable_folder(const std::string& path, const std::set<std::string>& written, ReplaceFolder replace);

}  // namespace pulse::sync
