#pragma once
// A model state: one .safetensors file, or a Hugging Face model folder, either sharded
// (model-0000k-of-0000n.safetensors named by model.safetensors.index.json's "weight_map") or
// holding a single .safetensors file. Tensors are matched by name across shards and viewed
// zero-copy through the read-only maps of src/io/safetensors; the folder's other files
// (config.json, tokenizer files, the index itself, ...) are listed with their sizes.
//
// Opening validates the whole layout first and throws pulse::Error with one line naming the file
// and the problem: a missing path, an index or a PyTorch pickle passed as a checkpoint, a shard
// the index names but the folder lacks, a tensor in two shards, a tensor in a shard but not in
// the index or the other way round, a folder with both sharded and single files.
// The index's "metadata" (e.g. total_size) is kept but not enforced: writers disagree on it.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/safetensors.hpp"

namespace pulse::io {

struct StateTensor {
  TensorView view;
  std::size_t shard;         // index into ModelState::shards()
  std::uint64_t file_offset;  // of the tensor's first byte in its shard file, for readers that pread()
};

struct OtherFile {
  std::string name;  // relative to the folder, '/'-separated
  std::uint64_t bytes;
};

// What ModelState::open reads of each shard: everything, or the headers only (tensors' data
// pointers null; readers such as pulse-measure pread() the ranges they need).
enum class ShardBytes { whole, header_only };

class ModelState {
 public:
  static ModelState open(const std::string& path, const SafetensorsLimits& limits = {},
                         ShardBytes bytes = ShardBytes::whole);

  const std::string& path() const { return path_; }
  bool is_folder() const { return is_folder_; }
  // The safetensors files, by file name; each keeps its own __metadata__ (shards()[i].metadata()).
  const std::vector<SafetensorsFile>& shards() const { return shards_; }
  const std::vector<StateTensor>& tensors() const { return tensors_; }  // sorted by name
  const StateTensor* find(const std::string& name) const;               // nullptr when absent
  // Folder files that are not shards, sorted by name (the index included); empty for a file.
  const std::vector<OtherFile>& other_files() const { return other_files_; }
  // The index's "metadata" object, values as JSON text (e.g. total_size -> "12345").
  const std::map<std::string, std::string>& index_metadata() const { return index_metadata_; }

 private:
  std::string path_;
  bool is_folder_ = false;
  std::vector<SafetensorsFile> shards_;
  std::vector<StateTensor> tensors_;
  std::vector<OtherFile> other_files_;
  std::map<std::string, std::string> index_metadata_;
};

// model.safetensors.index.json: "weight_map" (tensor name -> shard file name, a plain file name
// in the folder) and the optional "metadata" object (values as JSON text). Throws pulse::Error
// with one line naming source for anything else.
struct SafetensorsIndex {
  std::map<std::string, std::string> weight_map;
  std::map<std::string, std::string> metadata;
};
SafetensorsIndex parse_safetensors_index(const std::string& text, const std::string& source);

// The index among a folder's top-level file names: model.safetensors.index.json when present,
// else the only *.safetensors.index.json, else "" (no index). Throws pulse::Error naming `where`
// when several are present and none is model.safetensors.index.json.
std::string choose_index(const std::vector<std::string>& top_level_names, const std::string& where);

// What a file that is not safetensors is, from its name and first bytes ("a PyTorch pickle
// checkpoint", "a safetensors index", ...), or "" when it may be safetensors. For messages.
std::string describe_non_safetensors(const std::string& path);

}  // namespace pulse::io
