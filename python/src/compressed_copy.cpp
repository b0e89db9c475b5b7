#include "compressed_copy.hpp"

#include <algorithm>
#include <cstring>

#include "coding/compress.hpp"
#include "coding/parallel.hpp"
#include "core/error.hpp"
#include "io/safetensors.hpp"

namespace pulse::python {
namespace {

constexpr int kLevel = 1;  // zstd's fastest positive level: the top plane of BF16 weights to about 0.37

// Bytes per element as planes; a dtype packed below a byte is kept as one plane of bytes.
unsigned plane_count(const std::string& dtype) {
  const std::size_t bits = io::dtype_bits(io::parse_dtype(dtype));
  return bits >= 8 && bits % 8 == 0 ? unsigned(bits / 8) : 1;
}

}  // namespace

CompressedCopy::Chunk CompressedCopy::encode_chunk(const std::byte* data, std::size_t bytes, unsigned width) {
  const std::size_t n = bytes / width;
  const auto* in = reinterpret_cast<const std::uint8_t*>(data);
  std::vector<std::uint8_t> top(n);
  for (std::size_t i = 0; i < n; ++i) top[i] = in[i * width + width - 1];
  std::vector<std::uint8_t> coded = sync::compress(sync::Compressor::zstd, kLevel, top);
  Chunk c;
  c.compressed = coded.size() < n;
  const std::vector<std::uint8_t>& kept = c.compressed ? coded : top;
  c.top = kept.size();
  c.bytes.resize(c.top + (width - 1) * n);  // exactly: the chunks are the copy
  std::memcpy(c.bytes.data(), kept.data(), c.top);
  for (unsigned p = 0; p + 1 < width; ++p) {
    std::uint8_t* plane = c.bytes.data() + c.top + p * n;
    for (std::size_t i = 0; i < n; ++i) plane[i] = in[i * width + p];
  }
  return c;
}

void CompressedCopy::decode_chunk(const Chunk& c, std::size_t bytes, unsigned width, std::byte* out) {
  const std::size_t n = bytes / width;
  auto* o = reinterpret_cast<std::uint8_t*>(out);
  std::vector<std::uint8_t> decoded;
  const std::uint8_t* top = c.bytes.data();
  if (c.compressed) {
    decoded = sync::decompress(sync::Compressor::zstd, c.bytes.data(), c.top, n);
    top = decoded.data();
  }
  for (std::size_t i = 0; i < n; ++i) o[i * width + width - 1] = top[i];
  for (unsigned p = 0; p + 1 < width; ++p) {
    const std::uint8_t* plane = c.bytes.data() + c.top + p * n;
    for (std::size_t i = 0; i < n; ++i) o[i * width + p] = plane[i];
  }
}

void CompressedCopy::assign(const std::vector<sync::TensorRef>& state, unsigned threads) {
  // Each old chunk is dropped as the new one in its place is made: the copy grows by a chunk per
  // thread at most, never by a tensor.
  tensors_.resize(state.size());
  for (std::size_t t = 0; t < state.size(); ++t) {
    const sync::TensorRef& ref = state[t];
    Tensor& kept = tensors_[t];
    kept.width = plane_count(ref.dtype);
    kept.chunks.resize((ref.bytes + kChunkBytes - 1) / kChunkBytes);
    sync::parallel_for(threads, kept.chunks.size(), [&](std::size_t c) {
      const std::size_t at = c * kChunkBytes;
      kept.chunks[c] = encode_chunk(ref.data + at, std::min(kChunkBytes, ref.bytes - at), kept.width);
    });
  }
  layout_ = state;
  for (auto& ref : layout_) ref.data = nullptr;
}

void CompressedCopy::read(std::size_t index, std::uint64_t offset, std::size_t bytes, std::byte* out) const {
  const Tensor& t = tensors_.at(index);
  const std::size_t total = layout_[index].bytes;
  PULSE_CHECK(offset <= total && bytes <= total - offset, "internal: a read past the end of a kept tensor");
  std::vector<std::byte> chunk;
  for (std::uint64_t at = offset / kChunkBytes * kChunkBytes; at < offset + bytes; at += kChunkBytes) {
    const std::size_t size = std::min<std::size_t>(kChunkBytes, total - at);
    const Chunk& c = t.chunks[at / kChunkBytes];
    if (at >= offset && at + size <= offset + bytes) {  // the whole chunk is wanted: decoded in place
      decode_chunk(c, size, t.width, out + (at - offset));
      continue;
    }
    chunk.resize(size);
    decode_chunk(c, size, t.width, chunk.data());
    const std::uint64_t from = std::max<std::uint64_t>(at, offset), to = std::min<std::uint64_t>(at + size, offset + bytes);
    std::memcpy(out + (from - offset), chunk.data() + (from - at), std::size_t(to - from));
  }
}

sync::TensorLoader CompressedCopy::loader() const {
  return [this](std::size_t index, std::uint64_t offset, std::size_t bytes, std::byte* out) {
    read(index, offset, bytes, out);
  };
}

std::size_t CompressedCopy::stored_bytes() const {
  std::size_t total = 0;
  for (const auto& t : tensors_)
    for (const auto& c : t.chunks) total += c.bytes.capacity();
  return total;
}

}  // namespace pulse::python
