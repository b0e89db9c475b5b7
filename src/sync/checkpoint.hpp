#pragma once
// Model states for pulse-sync, from and to safetensors files: read-only memory maps for
// diffing and encoding, and in-memory copies (tensor order and metadata kept) for applying.
#include <map>
#include <string>
#include <vector>

#include "io/safetensors.hpp"
#include "sync/patch.hpp"

namespace pulse::sync {

// The tensors of a mapped file as patch tensors; they live as long as the file object.
std::vector<TensorRef> tensor_refs(const io::SafetensorsFile& file);

struct Checkpoint {
  std::vector<TensorRef> layout;  // names, dtypes, shapes; data points into `data`
  std::vector<std::vector<std::byte>> data;
  std::map<std::string, std::string> metadata;

  std::vector<MutableTensor> mutables();
};

// Applies a patch to a whole checkpoint: its tensors' bytes, its layout (added and removed
// tensors, added ones at the end) and its metadata; transactional as apply_patch.
std::uint64_t apply_to_checkpoint(const ParsedPatch& patch, Checkpoint& checkpoint);

// A path ending in ".zst" holds a zstd-compressed safetensors file (relay anchors may be).
Checkpoint load_checkpoint(const std::string& path);
// Atomic: the file at path holds either its old content or all of the new one; a path ending
// in ".zst" is written zstd-compressed at zstd_level.
void save_checkpoint(const std::string& path, const Checkpoint& checkpoint, int zstd_level = 3);

}  // namespace pulse::sync
