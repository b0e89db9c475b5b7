#include "sync/model_folder.hpp"

#include <algorithm>
#include <filesystem>
#include <set>

#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "core/file_read.hpp"

namespace pulse::sync {
namespace fs = std::filesystem;

namespace {

using Metadata = std::map<std::string, std::string>;

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

[[noreturn]] void fail(const std::string& where, const std::string& problem) { throw Error(where + ": " + problem); }

// A carried file's path: relative, '/'-separated, no empty, "." or ".." component, no NUL.
bool plain_relative_path(const std::string& path) {
  if (path.empty() || path.front() == '/' || path.find('\0') != std::string::npos) return false;
  std::size_t begin = 0;
  for (;;) {
    const std::size_t end = path.find('/', begin);
    const std::string part = path.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    if (part.empty() || part == "." || part == "..") return false;
    if (end == std::string::npos) return true;
    begin = end + 1;
  }
}

// Shard metadata as one map: the pairs every shard has, under their key; the others qualified.
Metadata merge_shard_metadata(const io::ModelState& state) {
  const auto& shards = state.shards();
  Metadata common = shards.empty() ? Metadata{} : shards[0].metadata();
  for (const auto& shard : shards)
    for (auto it = common.begin(); it != common.end();) {
      const auto there = shard.metadata().find(it->first);
      it = there == shard.metadata().end() || there->second != it->second ? common.erase(it) : std::next(it);
    }
  Metadata out = common;
  for (const auto& shard : shards) {
    const std::string file = fs::path(shard.path()).filename().string();
    for (const auto& [key, value] : shard.metadata()) {
      if (starts_with(key, kShardMetadataPrefix))
        fail(shard.path(), "__metadata__ key \"" + key + "\" uses the prefix " + kShardMetadataPrefix +
                               " that pulse-sync reserves for per-shard metadata");
      if (!common.count(key)) out[kShardMetadataPrefix + file + "/" + key] = value;
    }
  }
  return out;
}

}  // namespace

bool is_file_tensor(const std::string& name) { return starts_with(name, kFileTensorPrefix); }

bool carries_files(const std::vector<TensorRef>& tensors) {
  return std::any_of(tensors.begin(), tensors.end(), [](const TensorRef& t) { return is_file_tensor(t.name); });
}

FlatFolder flatten(const io::ModelState& state) {
  FlatFolder out;
  for (const auto& shard : state.shards())
    for (const auto& t : shard.tensors()) {
      if (state.is_folder() && (is_file_tensor(t.name) || starts_with(t.name, kShardMetadataPrefix)))
        fail(shard.path(), "tensor \"" + t.name + "\" uses a name prefix pulse-sync reserves for a folder's files (" +
                               kFileTensorPrefix + ") or metadata (" + kShardMetadataPrefix + ")");
      out.tensors.push_back({t.name, io::dtype_name(t.dtype), t.shape, t.data, t.bytes});
    }
  if (!state.is_folder()) {
    out.metadata = state.shards().front().metadata();
    return out;
  }
  std::vector<std::string> top_level;
  for (const auto& f : state.other_files()) top_level.push_back(f.name);
  if (io::choose_index(top_level, state.path()).empty() && state.shards().size() == 1) {
    const std::string file = fs::path(state.shards()[0].path()).filename().string();
    if (file != "model.safetensors")
      fail(state.shards()[0].path(), "a model folder's single unindexed file must be model.safetensors for pulse-sync "
                                     "(its name would not travel); rename it, or pass the file itself");
  }
  out.metadata = merge_shard_metadata(state);
  for (const auto& f : state.other_files()) {
    const std::string path = (fs::path(state.path()) / f.name).string();
    const auto bytes = read_regular_file(path, physical_memory_bytes(), "model folder file");
    out.file_bytes.emplace_back(reinterpret_cast<const std::byte*>(bytes.data()),
                                reinterpret_cast<const std::byte*>(bytes.data()) + bytes.size());
    const auto& b = out.file_bytes.back();
    out.tensors.push_back({kFileTensorPrefix + f.name, "U8", {std::int64_t(b.size())}, b.data(), b.size()});
  }
  return out;
}

FolderPlan plan_folder(const std::vector<TensorRef>& tensors, const Metadata& metadata, const std::string& source) {
  FolderPlan plan;
  std::vector<std::size_t> real;
  std::set<std::string> file_names;
  std::vector<std::string> top_level;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorRef& t = tensors[i];
    if (starts_with(t.name, kShardMetadataPrefix))
      fail(source, "tensor \"" + t.name + "\" uses the reserved prefix " + kShardMetadataPrefix);
    if (!is_file_tensor(t.name)) {
      real.push_back(i);
      continue;
    }
    const std::string rel = t.name.substr(std::string(kFileTensorPrefix).size());
    if (!plain_relative_path(rel)) fail(source, "carried file \"" + rel + "\" is not a plain relative path");
    if (t.dtype != "U8" || t.shape.size() != 1 || std::uint64_t(t.shape[0]) != t.bytes)
      fail(source, "carried file \"" + rel + "\" is not a 1-D U8 tensor of its bytes");
    if (rel.find('/') == std::string::npos) {
      if (ends_with(rel, ".safetensors"))
        fail(source, "carried file \"" + rel + "\" would be read back as a shard (.safetensors at the top level)");
      top_level.push_back(rel);
    }
    file_names.insert(rel);
    plan.files.emplace_back(rel, i);
  }
  for (const std::string& rel : file_names)
    for (std::size_t slash = rel.find('/'); slash != std::string::npos; slash = rel.find('/', slash + 1))
      if (file_names.count(rel.substr(0, slash)))
        fail(source, "carried file \"" + rel.substr(0, slash) + "\" is also the folder of \"" + rel + "\"");

  const std::string index_name = io::choose_index(top_level, source);
  if (index_name.empty()) {
    plan.shards.push_back({"model.safetensors", real, {}});
  } else {
    const TensorRef& index = tensors[std::find_if(plan.files.begin(), plan.files.end(), [&](const auto& f) {
                                       return f.first == index_name;
                                     })->second];
    const std::string text(reinterpret_cast<const char*>(index.data), index.bytes);
    const io::SafetensorsIndex parsed = io::parse_safetensors_index(text, source + ": carried " + index_name);
    std::map<std::string, std::size_t> shard_of_file;
    for (const auto& [tensor, file] : parsed.weight_map) {
      if (!ends_with(file, ".safetensors"))
        fail(source, index_name + " maps \"" + tensor + "\" to \"" + file + "\", not a .safetensors file");
      if (file_names.count(file)) fail(source, index_name + " names \"" + file + "\", which is also a carried file");
      if (shard_of_file.emplace(file, plan.shards.size()).second) plan.shards.push_back({file, {}, {}});
    }
    std::set<std::string> real_names;
    for (std::size_t i : real) {
      real_names.insert(tensors[i].name);
      const auto named = parsed.weight_map.find(tensors[i].name);
      if (named == parsed.weight_map.end())
        fail(source, "tensor \"" + tensors[i].name + "\" is not in the weight_map of " + index_name);
      plan.shards[shard_of_file.at(named->second)].tensors.push_back(i);
    }
    for (const auto& [tensor, file] : parsed.weight_map)
      if (!real_names.count(tensor))
        fail(source, index_name + " maps \"" + tensor + "\" to " + file + " but the state has no such tensor");
  }

  std::map<std::string, ShardPlan*> by_file;
  for (auto& s : plan.shards) by_file[s.file] = &s;
  Metadata common;
  std::map<std::string, std::map<std::string, std::string>> own;  // key -> shard file -> value
  for (const auto& [key, value] : metadata) {
    if (!starts_with(key, kShardMetadataPrefix)) {
      common[key] = value;
      continue;
    }
    const std::string rest = key.substr(std::string(kShardMetadataPrefix).size());
    const std::size_t slash = rest.find('/');
    const std::string file = rest.substr(0, slash);
    if (slash == std::string::npos || !by_file.count(file))
      fail(source, "metadata key \"" + key + "\" names no shard of the state");
    own[rest.substr(slash + 1)][file] = value;
  }
  PULSE_CHECK(common.empty() || !plan.shards.empty(), source + ": the state has metadata but no shard to hold it");
  for (const auto& [key, values] : own) {
    if (common.count(key)) fail(source, "metadata key \"" + key + "\" is both common and per shard");
    const std::string& first = values.begin()->second;
    const bool everywhere = values.size() == plan.shards.size() &&
                            std::all_of(values.begin(), values.end(), [&first](const auto& v) { return v.second == first; });
    if (everywhere)
      fail(source, "metadata key \"" + key + "\" has one value in every shard, so it is not per shard");
    for (const auto& [file, value] : values) by_file[file]->metadata[key] = value;
  }
  for (auto& s : plan.shards) s.metadata.insert(common.begin(), common.end());
  return plan;
}

void write_planned_folder(const std::string& folder, const FolderPlan& plan, const std::vector<TensorRef>& tensors) {
  for (const ShardPlan& shard : plan.shards) {
    std::vector<io::TensorToWrite> out;
    for (std::size_t i : shard.tensors) {
      const TensorRef& t = tensors[i];
      out.push_back({t.name, io::parse_dtype(t.dtype), t.shape, t.data, t.bytes});
    }
    io::write_safetensors((fs::path(folder) / shard.file).string(), out, shard.metadata);
  }
  for (const auto& [rel, i] : plan.files) {
    const fs::path path = fs::path(folder) / rel;
    fs::create_directories(path.parent_path());
    write_file_atomically(path.string(), tensors[i].data, tensors[i].bytes);
  }
}

}  // namespace pulse::sync
