#include "sync/checkpoint.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>

#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "core/file_read.hpp"
#include "io/folder_swap.hpp"
#include "coding/compress.hpp"
#include "sync/compressed_checkpoint.hpp"
#include "sync/streamed_state.hpp"

namespace pulse::sync {

std::vector<TensorRef> tensor_refs(const io::SafetensorsFile& file) {
  std::vector<TensorRef> out;
  for (const auto& t : file.tensors()) out.push_back({t.name, io::dtype_name(t.dtype), t.shape, t.data, t.bytes});
  return out;
}

std::vector<MutableTensor> Checkpoint::mutables() {
  std::vector<MutableTensor> out;
  for (std::size_t i = 0; i < layout.size(); ++i)
    out.push_back({layout[i].name, layout[i].dtype, layout[i].shape, data[i].data(), data[i].size()});
  return out;
}

std::uint64_t apply_to_checkpoint(const ParsedPatch& patch, Checkpoint& checkpoint, unsigned threads) {
  auto tensors = checkpoint.mutables();
  StateChange change;
  const std::uint64_t written =
      apply_patch(patch, tensors, {}, nullptr, nullptr, checkpoint.metadata, &change, nullptr, threads);
  for (const auto& name : change.removed)
    for (std::size_t i = 0; i < checkpoint.layout.size(); ++i)
      if (checkpoint.layout[i].name == name) {
        checkpoint.layout.erase(checkpoint.layout.begin() + std::ptrdiff_t(i));
        checkpoint.data.erase(checkpoint.data.begin() + std::ptrdiff_t(i));
        break;
      }
  for (std::size_t a = 0; a < change.added.size(); ++a) {
    const TensorLayout& l = change.added[a];
    checkpoint.data.push_back(std::move(change.added_bytes[a]));
    checkpoint.layout.push_back({l.name, l.dtype, l.shape, nullptr, checkpoint.data.back().size()});
  }
  for (std::size_t i = 0; i < checkpoint.layout.size(); ++i) checkpoint.layout[i].data = checkpoint.data[i].data();
  checkpoint.metadata = std::move(change.metadata);
  return written;
}

namespace {

bool is_zstd_path(const std::string& path) { return path.size() > 4 && path.compare(path.size() - 4, 4, ".zst") == 0; }

// A zstd-compressed safetensors file, decompressed and validated in memory; neither the file
// nor what it declares may exceed max_state_bytes (when given) or the machine's memory.
Checkpoint load_compressed(const std::string& path, std::uint64_t max_state_bytes) {
  const std::uint64_t limit = max_state_bytes ? std::min(max_state_bytes, physical_memory_bytes()) : physical_memory_bytes();
  const auto coded = read_regular_file(path, limit, "compressed checkpoint");
  return decode_compressed_checkpoint(coded.data(), coded.size(), limit, path);
}

}  // namespace

OpenState open_state(const std::string& path, io::ShardBytes bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || S_ISDIR(st.st_mode)) io::recover_folder_swap(path);
  io::ModelState model = io::ModelState::open(path, {}, bytes);
  FlatFolder flat = flatten(model);  // views stay valid when both move
  return {std::move(model), std::move(flat)};
}

Checkpoint load_checkpoint(const std::string& path, std::uint64_t max_state_bytes) {
  if (is_zstd_path(path)) return load_compressed(path, max_state_bytes);
  // Each tensor read straight into its own buffer: the model once in memory, not the files too.
  const StreamedState state = StreamedState::open(path);
  Checkpoint c;
  c.metadata = state.metadata();
  c.layout = state.tensors();
  c.folder = state.folder();
  for (std::size_t i = 0; i < c.layout.size(); ++i) {
    c.data.emplace_back(c.layout[i].bytes);
    state.read_into(i, c.data.back().data());
    c.layout[i].data = c.data.back().data();
  }
  return c;
}

std::uint64_t save_checkpoint(const std::string& path, const Checkpoint& checkpoint, int zstd_level) {
  return save_checkpoint(path, checkpoint.layout, checkpoint.metadata, zstd_level);
}

std::uint64_t save_checkpoint(const std::string& path, const std::vector<TensorRef>& state, const Metadata& metadata,
                              int zstd_level) {
  std::vector<io::TensorToWrite> tensors;
  for (const TensorRef& t : state) tensors.push_back({t.name, io::parse_dtype(t.dtype), t.shape, t.data, t.bytes});
  if (!is_zstd_path(path)) {
    io::write_safetensors(path, tensors, metadata);
    return std::filesystem::file_size(path);
  }
  // Through a plain file next to it: the safetensors writer is the one place that lays out files.
  const std::string plain = path.substr(0, path.size() - 4) + ".uncompressed";
  io::write_safetensors(plain, tensors, metadata);
  const auto raw = read_regular_file(plain, physical_memory_bytes(), "checkpoint");
  std::remove(plain.c_str());
  const auto coded = compress(Compressor::zstd, zstd_level, raw);
  write_file_atomically(path, coded.data(), coded.size());
  return raw.size();
}

namespace fs = std::filesystem;

// An existing folder is replaced only when it is empty or opens as a model state, and (unless
// it is the state's own base, or the user said so) when every file in it but its shards and
// index (the layout, which a re-sharded state replaces) is one the new folder writes.
void check_replaceable_folder(const std::string& path, const std::set<std::string>& written, ReplaceFolder replace) {
  std::error_code ec;
  if (fs::is_empty(path, ec) && !ec) return;
  std::optional<io::ModelState> old;
  try {
    old.emplace(io::ModelState::open(path, {}, io::ShardBytes::header_only));
  } catch (const Error& e) {
    throw Error(path + ": refusing to replace a folder that does not hold a model (" + e.what() + ")");
  }
  if (replace != ReplaceFolder::if_nothing_lost) return;
  std::string lost;
  for (const auto& f : old->other_files()) {
    const bool index = f.name.find('/') == std::string::npos && f.name.size() > 23 &&
                       f.name.compare(f.name.size() - 23, 23, ".safetensors.index.json") == 0;
    if (!index && !written.count(f.name)) lost += (lost.empty() ? "" : ", ") + f.name;
  }
  PULSE_CHECK(lost.empty(), path + ": refusing to replace this folder: " + lost +
                                " would be deleted, not being part of the new state (write elsewhere, or pass --replace)");
}

bool save_state(const std::string& path, const Checkpoint& checkpoint, ReplaceFolder replace) {
  return save_state(path, checkpoint.layout, checkpoint.metadata, checkpoint.folder, replace);
}

bool save_state(const std::string& path, const std::vector<TensorRef>& state, const Metadata& metadata,
                bool from_folder, ReplaceFolder replace) {
  std::error_code ec;
  const bool exists = fs::exists(path, ec);
  const bool named_as_file = path.size() > 12 && path.compare(path.size() - 12, 12, ".safetensors") == 0;
  const bool folder = exists ? fs::is_directory(path, ec)
                             : !named_as_file && (from_folder || carries_files(state) ||
                                                  (!path.empty() && path.back() == '/'));
  if (!folder) {
    for (const auto& t : state)
      PULSE_CHECK(!is_file_tensor(t.name), path + ": the state is a model folder (it carries " + t.name.substr(9) +
                                               "); write it to a folder, not a file");
    save_checkpoint(path, state, metadata);
    return false;
  }
  const FolderPlan plan = plan_folder(state, metadata, path);
  if (exists) {
    std::set<std::string> written;
    for (const auto& s : plan.shards) written.insert(s.file);
    for (const auto& f : plan.files) written.insert(f.first);
    check_replaceable_folder(path, written, replace);
  }
  const Digest expected = state_digest(state, metadata);
  io::replace_folder(path, [&](const std::string& folder_path) {
    write_planned_folder(folder_path, plan, state);
    // Read back in pieces (the state is in memory already; its copy on disk need not be).
    const StreamedState back = StreamedState::open(folder_path);
    std::vector<Digest> digests;
    for (std::size_t i = 0; i < back.tensors().size(); ++i) digests.push_back(back.digest(i));
    PULSE_CHECK(state_digest(back.tensors(), digests, back.metadata()) == expected,
                path + ": the folder written does not read back as the state (not written)");
  });
  return true;
}

}  // namespace pulse::sync
