#pragma once
// A Hugging Face model folder as one flat model state (tensors + metadata), the form patches,
// digests and relay anchors use (src/sync/FORMAT.md, "Model folders"):
//  - every tensor of every shard under its own name (matched by name; the sharding is not part
//    of the tensors);
//  - every other file of the folder (config.json, tokenizer files, the index, ...) as a U8 tensor
//    of its bytes named "__file__/<path relative to the folder>";
//  - the shards' __metadata__: pairs every shard has in common under their own key, the rest as
//    "__shard__/<shard file>/<key>".
// Writing a flat state as a folder lays the tensors out as the carried index's weight_map says
// (model.safetensors when the state carries no index), and checks everything first: carried
// file names are plain relative paths, the index names exactly the state's tensors, shard keys
// name shards of the index. Names under both prefixes are reserved: a shard may not use them.
#include <map>
#include <string>
#include <vector>

#include "io/model_state.hpp"
#include "coding/digest.hpp"  // TensorRef; no Kokkos, so the fuzz target builds without it

namespace pulse::sync {

inline constexpr const char* kFileTensorPrefix = "__file__/";
inline constexpr const char* kShardMetadataPrefix = "__shard__/";

bool is_file_tensor(const std::string& name);
// True when the state carries folder files (it is a model folder in flat form).
bool carries_files(const std::vector<TensorRef>& tensors);

// The flat form of an opened model folder (or file). tensors point into `state`'s shards and
// into `file_bytes`, which the caller keeps as long as it uses them. Throws pulse::Error (one
// line naming the file) for a reserved name in a shard, an unreadable file, or a folder whose
// single unindexed file is not model.safetensors (the name would not travel).
struct FlatFolder {
  std::vector<TensorRef> tensors;  // shards' tensors in file order, then the files by name
  std::map<std::string, std::string> metadata;
  std::vector<std::vector<std::byte>> file_bytes;
};
FlatFolder flatten(const io::ModelState& state);

// Where each tensor of a flat state goes when written as a folder.
struct ShardPlan {
  std::string file;                 // e.g. "model-00001-of-00002.safetensors"
  std::vector<std::size_t> tensors;  // indices into the flat state, in its order
  std::map<std::string, std::string> metadata;  // the shard's __metadata__
};
struct FolderPlan {
  std::vector<ShardPlan> shards;
  std::vector<std::pair<std::string, std::size_t>> files;  // relative path, index of its tensor
};
// Throws pulse::Error with one line (naming `source`) when the state cannot be a folder.
FolderPlan plan_folder(const std::vector<TensorRef>& tensors, const std::map<std::string, std::string>& metadata,
                       const std::string& source);

// Writes the planned folder's files into `folder` (an existing, empty folder).
void write_planned_folder(const std::string& folder, const FolderPlan& plan, const std::vector<TensorRef>& tensors);

}  // namespace pulse::sync
