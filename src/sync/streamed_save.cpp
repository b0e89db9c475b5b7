#include "sync/streamed_save.hpp"

#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "io/folder_swap.hpp"
#include "io/safetensors.hpp"
#include "coding/compress.hpp"
#include "sync/model_folder.hpp"
#include "sync/streamed_state.hpp"

namespace fs = std::filesystem;

namespace pulse::sync {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::vector<io::TensorToWrite> to_write(const std::vector<TensorRef>& tensors, const std::vector<std::size_t>& order) {
  std::vector<io::TensorToWrite> out;
  for (std::size_t i : order) {
    const TensorRef& t = tensors[i];
    out.push_back({t.name, io::parse_dtype(t.dtype), t.shape, nullptr, t.bytes});
  }
  return out;
}

std::vector<std::size_t> all_of(std::size_t n) {
  std::vector<std::size_t> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = i;
  return out;
}

}  // namespace

std::uint64_t write_streamed_checkpoint(const std::string& path, const std::vector<TensorRef>& tensors,
                                        const Metadata& metadata, const TensorLoader& loader, int zstd_level,
                                        const std::function<void(const Digest&)>& check) {
  const std::string prefix = io::safetensors_prefix(path, to_write(tensors, all_of(tensors.size())), metadata);
  std::uint64_t total = prefix.size();
  for (const auto& t : tensors) total += t.bytes;
  AtomicFile file(path);
  const auto to_file = [&](const void* data, std::size_t size) { file.write(data, size); };
  std::optional<ZstdFrameWriter> zstd;
  if (ends_with(path, ".zst")) zstd.emplace(zstd_level, total, to_file);
  const auto write = [&](const void* data, std::size_t size) { zstd ? zstd->write(data, size) : file.write(data, size); };
  write(prefix.data(), prefix.size());
  std::vector<Digest> digests;
  ByteBuffer buffer;
  for (std::size_t i = 0; i < tensors.size(); ++i)
    digests.push_back(for_each_piece(tensors, loader, i, buffer, write));
  if (zstd) zstd->finish();
  check(state_digest(tensors, digests, metadata));
  file.commit();
  return total;
}

bool save_streamed_state(const std::string& path, const StreamedState& state, const Digest* expected,
                         ReplaceFolder replace) {
  const auto check = [&](const Digest& written) {
    PULSE_CHECK(!expected || written == *expected, path + ": the state read is not the one expected (its digest is " +
                                                       to_hex(written) + ", not " + to_hex(*expected) + "); not written");
  };
  std::error_code ec;
  const bool exists = fs::exists(path, ec);
  const auto& source = state.tensors();
  const bool folder = exists ? fs::is_directory(path, ec)
                             : !ends_with(path, ".safetensors") &&
                                   (state.folder() || carries_files(source) || (!path.empty() && path.back() == '/'));
  const TensorLoader loader = state.loader();
  if (!folder) {
    for (const auto& t : source)
      PULSE_CHECK(!is_file_tensor(t.name), path + ": the state is a model folder (it carries " + t.name.substr(9) +
                                               "); write it to a folder, not a file");
    write_streamed_checkpoint(path, source, state.metadata(), loader, 3, check);
    return false;
  }
  // The folder's files (config, tokenizer, index) in memory, as planning reads the index.
  std::vector<TensorRef> tensors = source;
  std::vector<std::vector<std::byte>> file_bytes;
  file_bytes.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i)
    if (is_file_tensor(tensors[i].name) && !tensors[i].data && tensors[i].bytes) {
      file_bytes.emplace_back(tensors[i].bytes);
      state.read_into(i, file_bytes.back().data());
      tensors[i].data = file_bytes.back().data();
    }
  const FolderPlan plan = plan_folder(tensors, state.metadata(), path);
  if (exists) {
    std::set<std::string> written;
    for (const auto& s : plan.shards) written.insert(s.file);
    for (const auto& f : plan.files) written.insert(f.first);
    check_replaceable_folder(path, written, replace);
  }
  io::replace_folder(path, [&](const std::string& folder_path) {
    std::map<std::string, Digest> digest_of;  // by name: of the bytes written
    ByteBuffer buffer;
    for (const ShardPlan& shard : plan.shards) {
      const std::string file_path = (fs::path(folder_path) / shard.file).string();
      const std::string prefix = io::safetensors_prefix(file_path, to_write(tensors, shard.tensors), shard.metadata);
      AtomicFile file(file_path);
      file.write(prefix.data(), prefix.size());
      for (std::size_t i : shard.tensors)
        digest_of[tensors[i].name] = for_each_piece(tensors, loader, i, buffer, [&](const std::byte* data, std::size_t n) {
          file.write(data, n);
        });
      file.commit();
    }
    for (const auto& [rel, i] : plan.files) {
      const fs::path file_path = fs::path(folder_path) / rel;
      fs::create_directories(file_path.parent_path());
      write_file_atomically(file_path.string(), tensors[i].data, tensors[i].bytes);
      digest_of[tensors[i].name] = tensor_digest(tensors[i]);
    }
    // Read back: the headers (names, dtypes, shapes, metadata) as a reader sees them, with the
    // digests of the bytes written.
    const StreamedState back = StreamedState::open(folder_path);
    std::vector<Digest> digests;
    for (const auto& t : back.tensors()) {
      const auto it = digest_of.find(t.name);
      PULSE_CHECK(it != digest_of.end(), path + ": the folder written reads back with a tensor '" + t.name +
                                             "' that was not written (not written)");
      digests.push_back(it->second);
    }
    PULSE_CHECK(back.tensors().size() == digest_of.size(),
                path + ": the folder written does not read back as the state (not written)");
    check(state_digest(back.tensors(), digests, back.metadata()));
  });
  return true;
}

}  // namespace pulse::sync
