#pragma once
// The version a Sender sent, kept compressed (pulse.Sender(copy="compressed")), so that the
// trainer's state and the Sender's copy of it take less than twice the model. Each tensor is kept
// in chunks of kChunkBytes; a chunk is split into byte planes (byte k of every element,
// little-endian): the top plane, which holds the sign and the high exponent bits (few distinct
// values in trained weights), is zstd-compressed and the others (mantissa bits, near random) are
// kept as they are. LLM-like BF16 weights take about 0.68 of their bytes. encode_patch reads the
// copy back piece by piece through loader().
#include <cstddef>
#include <cstdint>
#include <vector>

#include "sync/patch.hpp"

namespace pulse::python {

class CompressedCopy {
 public:
  static constexpr std::size_t kChunkBytes = std::size_t(1) << 20;  // divides encode's pieces and segments

  // Replaces the copy with these tensors' bytes (chunks compressed on `threads` threads, 0: the
  // cores), chunk by chunk. The copy is not usable if this throws.
  void assign(const std::vector<sync::TensorRef>& state, unsigned threads);
  // The copy's tensors, not in memory (data null): encode_patch reads them with loader().
  const std::vector<sync::TensorRef>& layout() const { return layout_; }
  sync::TensorLoader loader() const;
  // The bytes the copy holds.
  std::size_t stored_bytes() const;

 private:
  struct Chunk {
    std::vector<std::uint8_t> bytes;  // the top plane (compressed or not), then the other planes
    std::size_t top = 0;              // the top plane's bytes
    bool compressed = false;
  };
  struct Tensor {
    unsigned width = 1;  // bytes per element: the planes
    std::vector<Chunk> chunks;
  };
  static Chunk encode_chunk(const std::byte* data, std::size_t bytes, unsigned width);
  static void decode_chunk(const Chunk& chunk, std::size_t bytes, unsigned width, std::byte* out);
  void read(std::size_t index, std::uint64_t offset, std::size_t bytes, std::byte* out) const;

  std::vector<sync::TensorRef> layout_;
  std::vector<Tensor> tensors_;
};

}  // namespace pulse::python
