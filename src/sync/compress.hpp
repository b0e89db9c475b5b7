#pragma once
// General-purpose compression of patch streams: zstd (level selectable), lz4, or none.
// Decompression never produces more than the size the (already validated) header declares.
#include <cstdint>
#include <string>
#include <vector>

namespace pulse::sync {

enum class Compressor : std::uint8_t { none = 0, zstd = 1, lz4 = 2 };

const char* compressor_name(Compressor c);
Compressor parse_compressor(const std::string& name);  // "none", "zstd", "lz4"

std::vector<std::uint8_t> compress(Compressor c, int level, const std::vector<std::uint8_t>& raw);
// Decompresses exactly raw_size bytes; throws pulse::Error if the input does not decode to that.
std::vector<std::uint8_t> decompress(Compressor c, const std::uint8_t* data, std::size_t size, std::size_t raw_size);

// One whole zstd frame (a compressed file) whose declared content size is at most max_bytes,
// checked before anything is allocated. The output grows only as the frame actually decodes,
// so a small frame that lies about its size costs what it decodes to, not what it declares.
std::vector<std::uint8_t> decompress_zstd_frame(const std::uint8_t* data, std::size_t size, std::uint64_t max_bytes,
                                                const std::string& source);

}  // namespace pulse::sync
