#include "sync/checkpoint.hpp"

#include <cstring>

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

Checkpoint load_checkpoint(const std::string& path) {
  const auto file = io::SafetensorsFile::open(path);
  Checkpoint c;
  c.metadata = file.metadata();
  c.layout = tensor_refs(file);
  for (const auto& t : c.layout) c.data.emplace_back(t.data, t.data + t.bytes);
  for (std::size_t i = 0; i < c.layout.size(); ++i) c.layout[i].data = c.data[i].data();  // the map closes
  return c;
}

void save_checkpoint(const std::string& path, const Checkpoint& checkpoint) {
  std::vector<io::TensorToWrite> tensors;
  for (std::size_t i = 0; i < checkpoint.layout.size(); ++i) {
    const TensorRef& t = checkpoint.layout[i];
    tensors.push_back({t.name, io::parse_dtype(t.dtype), t.shape, checkpoint.data[i].data(), checkpoint.data[i].size()});
  }
  io::write_safetensors(path, tensors, checkpoint.metadata);
}

}  // namespace pulse::sync
