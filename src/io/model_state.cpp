#include "io/model_state.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.hpp"
#include "core/file_read.hpp"

namespace pulse::io {
namespace fs = std::filesystem;

namespace {

constexpr const char* kIndexSuffix = ".safetensors.index.json";
constexpr const char* kIndexName = "model.safetensors.index.json";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

[[noreturn]] void fail(const std::string& where, const std::string& problem) {
  throw Error(where + ": " + problem);
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Folder entries: the .safetensors files and the index candidates at the top level, and every
// other file (recursively). A file may be a symbolic link (the Hugging Face cache links each one
// into ../blobs): it is read through and named by the link. A link to a folder is refused, not
// followed, so the walk never leaves the folder or loops; so is anything but a file or a folder
// (a FIFO would block its reader). A folder without a .safetensors file at its top level is not
// walked further (`--init /tmp` fails at once): only its top-level files are listed, for messages.
struct FolderListing {
  std::vector<std::string> safetensors;  // file names
  std::vector<std::string> indexes;      // file names
  std::vector<OtherFile> files;          // every regular file but the .safetensors ones
};

FolderListing list_folder(const fs::path& folder) {
  FolderListing out;
  std::error_code ec;
  bool is_model = false;
  for (auto it = fs::directory_iterator(folder, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::error_code kind;
    is_model = is_model || (ends_with(it->path().filename().string(), ".safetensors") && it->is_regular_file(kind));
  }
  if (ec) fail(folder.string(), "cannot list the folder: " + ec.message());
  for (auto it = fs::recursive_directory_iterator(folder, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    // The name in the folder, by the path walked (fs::relative would resolve the links).
    const std::string rel = it->path().lexically_relative(folder).generic_string();
    std::error_code kind;
    const bool link = it->is_symlink(kind), directory = it->is_directory(kind), regular = it->is_regular_file(kind);
    if (!is_model) {
      it.disable_recursion_pending();
      if (!regular) continue;
    } else if (link && directory) {
      fail(it->path().string(), "is a symbolic link to a folder; pulse does not follow those out of the model folder "
                                "(copy the folder in)");
    } else if (directory) {
      continue;
    } else if (!regular) {
      read_regular_file_prefix(it->path().string(), 0, "model folder file");  // throws: names what it is
      fail(it->path().string(), "is not a regular file");
    }
    const bool top = it.depth() == 0;
    if (top && ends_with(rel, ".safetensors")) {
      out.safetensors.push_back(rel);
      continue;
    }
    if (top && ends_with(rel, kIndexSuffix)) out.indexes.push_back(rel);
    out.files.push_back({rel, std::uint64_t(it->file_size())});
  }
  if (ec) fail(folder.string(), "cannot list the folder: " + ec.message());
  std::sort(out.safetensors.begin(), out.safetensors.end());
  std::sort(out.indexes.begin(), out.indexes.end());
  std::sort(out.files.begin(), out.files.end(), [](const OtherFile& a, const OtherFile& b) { return a.name < b.name; });
  return out;
}

constexpr std::uintmax_t kMaxIndexBytes = 100 << 20;  // as SafetensorsLimits' header limit

SafetensorsIndex read_index(const fs::path& path) {
  const auto bytes = read_regular_file(path.string(), kMaxIndexBytes, "safetensors index");
  return parse_safetensors_index(std::string(bytes.begin(), bytes.end()), path.string());
}

}  // namespace

SafetensorsIndex parse_safetensors_index(const std::string& text, const std::string& source) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) fail(source, "index is not valid JSON");
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    fail(source, "index has no \"weight_map\" object (tensor name -> shard file)");
  SafetensorsIndex index;
  for (const auto& [tensor, shard] : j["weight_map"].items()) {
    if (!shard.is_string()) fail(source, "weight_map entry \"" + tensor + "\" is not a file name");
    const std::string file = shard.get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file.find('\\') != std::string::npos || file == "." ||
        file == "..")
      fail(source, "weight_map entry \"" + tensor + "\" names \"" + file + "\", not a file of the folder");
    index.weight_map[tensor] = file;
  }
  if (j.contains("metadata") && j["metadata"].is_object())
    for (const auto& [key, value] : j["metadata"].items())
      index.metadata[key] = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return index;
}

std::string choose_index(const std::vector<std::string>& top_level_names, const std::string& where) {
  std::vector<std::string> indexes;
  for (const std::string& name : top_level_names)
    if (name.find('/') == std::string::npos && ends_with(name, kIndexSuffix)) indexes.push_back(name);
  if (std::count(indexes.begin(), indexes.end(), kIndexName)) return kIndexName;
  if (indexes.size() == 1) return indexes[0];
  if (indexes.size() > 1)
    fail(where, "holds " + std::to_string(indexes.size()) + " *" + kIndexSuffix +
                    " files and no model.safetensors.index.json to choose");
  return "";
}

std::string describe_non_safetensors(const std::string& path) {
  const std::string name = lower(fs::path(path).filename().string());
  if (ends_with(name, ".index.json")) return "a safetensors index, not a checkpoint (pass the folder that holds it)";
  const FilePrefix prefix = read_regular_file_prefix(path, 9, "checkpoint");  // never blocks: a FIFO is refused
  unsigned char head[9] = {};
  std::copy(prefix.bytes.begin(), prefix.bytes.end(), head);
  const std::size_t got = prefix.bytes.size();
  const std::uint64_t size = prefix.file_size;
  // A safetensors file: 8-byte little-endian header length that fits, then the JSON's '{'.
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t(head[i]) << (8 * i);
  if (got == 9 && n <= size - 8 && head[8] == '{') return "";
  if (got >= 4 && std::memcmp(head, "PK\x03\x04", 4) == 0)
    return "a zip archive (torch.save's format: a PyTorch .bin/.pt checkpoint), not safetensors";
  if (got >= 2 && head[0] == 0x80 && head[1] >= 2 && head[1] <= 5)
    return "a Python pickle (a PyTorch .bin/.pt checkpoint), not safetensors";
  for (const char* ext : {".bin", ".pt", ".pth", ".ckpt", ".pkl"})
    if (ends_with(name, ext)) return "a PyTorch checkpoint (" + std::string(ext) + "), not safetensors";
  if (got >= 1 && (head[0] == '{' || head[0] == '[')) return "a JSON file, not a safetensors checkpoint";
  return "";
}

const StateTensor* ModelState::find(const std::string& name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const StateTensor& t, const std::string& n) { return t.view.name < n; });
  return it != tensors_.end() && it->view.name == name ? &*it : nullptr;
}

ModelState ModelState::open(const std::string& path, const SafetensorsLimits& limits, ShardBytes bytes) {
  ModelState state;
  state.path_ = path;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status)) fail(path, "no such file or folder");

  std::vector<std::string> shard_paths;
  SafetensorsIndex index;
  std::string index_path;
  if (fs::is_directory(status)) {
    state.is_folder_ = true;
    const FolderListing listing = list_folder(path);
    state.other_files_ = listing.files;
    const std::string index_name = choose_index(listing.indexes, path);
    if (!index_name.empty()) {
      index_path = (fs::path(path) / index_name).string();
      index = read_index(index_path);
      std::set<std::string> named;
      for (const auto& [tensor, shard] : index.weight_map) named.insert(shard);
      for (const std::string& shard : named)
        if (!std::binary_search(listing.safetensors.begin(), listing.safetensors.end(), shard))
          fail((fs::path(path) / shard).string(), "named in " + index_name + " but missing");
      for (const std::string& file : listing.safetensors)
        if (!named.count(file))
          fail((fs::path(path) / file).string(),
               "not named in " + index_name +
                   (file == "model.safetensors" ? " (the folder holds both sharded files and a single model.safetensors)"
                                                : " (a stale shard of another sharding?)"));
      shard_paths.assign(named.begin(), named.end());
    } else if (listing.safetensors.size() == 1) {
      shard_paths = listing.safetensors;
    } else if (listing.safetensors.empty()) {
      for (const OtherFile& f : listing.files) {
        const std::string what = describe_non_safetensors((fs::path(path) / f.name).string());
        if (!what.empty() && what.find("PyTorch") != std::string::npos)
          fail(path, "holds no .safetensors file, only " + f.name + " (" + what + ")");
      }
      fail(path, "holds no .safetensors file");
    } else {
      fail(path, "holds " + std::to_string(listing.safetensors.size()) +
                     " .safetensors files but no model.safetensors.index.json saying which tensors they hold");
    }
    for (std::string& s : shard_paths) s = (fs::path(path) / s).string();
  } else {
    const std::string what = describe_non_safetensors(path);
    if (!what.empty()) fail(path, "is " + what);
    shard_paths = {path};
  }

  for (const std::string& shard_path : shard_paths)
    state.shards_.push_back(bytes == ShardBytes::whole ? SafetensorsFile::open(shard_path, limits)
                                                       : SafetensorsFile::open_header(shard_path, limits));

  std::map<std::string, std::size_t> owner;  // tensor -> shard
  for (std::size_t s = 0; s < state.shards_.size(); ++s)
    for (const TensorView& t : state.shards_[s].tensors()) {
      const auto [it, fresh] = owner.emplace(t.name, s);
      if (!fresh)
        fail(state.shards_[s].path(), "tensor \"" + t.name + "\" is also in " + state.shards_[it->second].path());
    }
  for (std::size_t s = 0; s < state.shards_.size(); ++s) {
    const SafetensorsFile& file = state.shards_[s];
    const std::string file_name = fs::path(file.path()).filename().string();
    for (const TensorView& t : file.tensors()) {
      if (!index_path.empty()) {
        const auto named = index.weight_map.find(t.name);
        if (named == index.weight_map.end())
          fail(file.path(), "holds tensor \"" + t.name + "\" that " + index_path + " does not name");
        if (named->second != file_name)
          fail(file.path(), "holds tensor \"" + t.name + "\" that " + index_path + " maps to " + named->second);
      }
      state.tensors_.push_back({t, s, t.file_offset});
    }
  }
  for (const auto& [tensor, shard] : index.weight_map)
    if (!owner.count(tensor))
      fail((fs::path(path) / shard).string(), "lacks tensor \"" + tensor + "\" that " + index_path + " maps to it");
  state.index_metadata_ = index.metadata;
  std::sort(state.tensors_.begin(), state.tensors_.end(),
            [](const StateTensor& a, const StateTensor& b) { return a.view.name < b.view.name; });
  return state;
}

}  // namespace pulse::io
