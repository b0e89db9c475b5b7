// libFuzzer entry: the input is a safetensors file holding a model folder in flat form (a relay
// anchor, or the state a patch leads to): tensors, the folder's files as "__file__/<path>" U8
// tensors (the index among them) and "__shard__/<file>/<key>" metadata. plan_folder must accept
// it or throw pulse::Error; a crash, a sanitizer report or any other exception escaping is a bug.
// An accepted plan writes only inside the folder: plain relative file paths, shard files that
// are plain .safetensors names, every real tensor in exactly one shard.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "io/safetensors.hpp"
#include "sync/model_folder.hpp"

namespace {

bool plain_relative(const std::string& path) {
  if (path.empty() || path[0] == '/') return false;
  std::size_t begin = 0;
  for (;;) {
    const std::size_t end = path.find('/', begin);
    const std::string part = path.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    if (part.empty() || part == "." || part == "..") return false;
    if (end == std::string::npos) return true;
    begin = end + 1;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pulse;
  try {
    const auto* bytes = reinterpret_cast<const std::byte*>(data);
    const io::ParsedHeader header = io::parse_header(bytes, size, {}, "fuzz");
    std::vector<sync::TensorRef> tensors;
    for (const auto& t : header.tensors)
      tensors.push_back({t.name, io::dtype_name(t.dtype), t.shape, bytes + header.data_offset + t.begin, t.end - t.begin});
    const sync::FolderPlan plan = sync::plan_folder(tensors, header.metadata, "fuzz");
    std::multiset<std::size_t> placed;
    for (const auto& shard : plan.shards) {
      if (shard.file.find('/') != std::string::npos || shard.file.size() <= 12 ||
          shard.file.compare(shard.file.size() - 12, 12, ".safetensors") != 0)
        __builtin_trap();
      placed.insert(shard.tensors.begin(), shard.tensors.end());
    }
    for (const auto& [rel, i] : plan.files)
      if (!plain_relative(rel) || !sync::is_file_tensor(tensors[i].name)) __builtin_trap();
    for (std::size_t i = 0; i < tensors.size(); ++i)
      if (placed.count(i) != (sync::is_file_tensor(tensors[i].name) ? 0u : 1u)) __builtin_trap();
  } catch (const Error&) {
  }
  return 0;
}
