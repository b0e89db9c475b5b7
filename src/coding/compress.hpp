#pragma once
// General-purpose compression of patch streams: zstd (level selectable), lz4, or none.
// Decompression never produces more than the size the (already validated) header declares.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/enum_names.hpp"

namespace pulse::sync {

enum class Compressor : std::uint8_t { none = 0, zstd = 1, lz4 = 2 };
inline constexpr NamedValue<Compressor> compressor_names[] = {
    {Compressor::none, "none"}, {Compressor::zstd, "zstd"}, {Compressor::lz4, "lz4"}};

inline const char* compressor_name(Compressor c) { return name_of(compressor_names, c); }
Compressor parse_compressor(const std::string& name);  // throws pulse::Error listing the names

std::vector<std::uint8_t> compress(Compressor c, int level, const std::vector<std::uint8_t>& raw);
// Decompresses exactly raw_size bytes; throws pulse::Error if the input does not decode to that.
std::vector<std::uint8_t> decompress(Compressor c, const std::uint8_t* data, std::size_t size, std::size_t raw_size);

// One whole zstd frame (a compressed file) whose declared content size is at most max_bytes,
// checked before anything is allocated. The output grows only as the frame actually decodes,
// so a small frame that lies about its size costs what it decodes to, not what it declares.
std::vector<std::uint8_t> decompress_zstd_frame(const std::uint8_t* data, std::size_t size, std::uint64_t max_bytes,
                                                const std::string& source);

// Where streamed (de)compression hands its output, piece by piece.
using ByteSink = std::function<void(const void* data, std::size_t size)>;

// One zstd frame made as its input arrives, in pieces of any size, declaring content_bytes (the
// pieces' total, checked by finish) so that readers bound it before decoding, as
// decompress_zstd_frame does. Memory: zstd's window and a piece of output, not the input.
class ZstdFrameWriter {
 public:
  ZstdFrameWriter(int level, std::uint64_t content_bytes, ByteSink out);
  ~ZstdFrameWriter();
  ZstdFrameWriter(const ZstdFrameWriter&) = delete;
  ZstdFrameWriter& operator=(const ZstdFrameWriter&) = delete;
  void write(const void* data, std::size_t size);
  void finish();

 private:
  void pump(const void* data, std::size_t size, bool end);
  struct Context;
  std::unique_ptr<Context> context_;
  std::uint64_t content_bytes_, written_ = 0;
  ByteSink out_;
};

// decompress_zstd_frame's checks (one whole frame, a declared size of at most max_bytes, decoding
// to exactly that) on a regular file read in pieces, its content handed to out in pieces: memory
// holds a piece, never the frame or its content. Returns the content's size.
std::uint64_t decompress_zstd_file(const std::string& path, std::uint64_t max_bytes, const ByteSink& out);

}  // namespace pulse::sync
