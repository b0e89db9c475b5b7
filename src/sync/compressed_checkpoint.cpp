#include "sync/compressed_checkpoint.hpp"

#include "coding/compress.hpp"

namespace pulse::sync {

Checkpoint decode_compressed_checkpoint(const std::uint8_t* data, std::size_t size, std::uint64_t max_bytes,
                                        const std::string& source) {
  const auto raw = decompress_zstd_frame(data, size, max_bytes, source);
  const auto* bytes = reinterpret_cast<const std::byte*>(raw.data());
  const io::ParsedHeader header = io::parse_header(bytes, raw.size(), {}, source);
  Checkpoint c;
  c.metadata = header.metadata;
  for (const auto& t : header.tensors) {
    const std::byte* tensor = bytes + header.data_offset + t.begin;
    c.data.emplace_back(tensor, tensor + (t.end - t.begin));
    c.layout.push_back({t.name, io::dtype_name(t.dtype), t.shape, nullptr, t.end - t.begin});
  }
  for (std::size_t i = 0; i < c.layout.size(); ++i) c.layout[i].data = c.data[i].data();
  return c;
}

}  // namespace pulse::sync
