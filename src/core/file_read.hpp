#pragma once
// Bounded, safe reading of files that may be untrusted or misplaced (patches, keys, relay
// records, anchors, safetensors inputs): the open never blocks (O_NONBLOCK, so a FIFO cannot
// hang the reader), anything but a regular file is refused, and the size is checked against
// the caller's limit before a byte is read or allocated. Every refusal is one pulse::Error line.
#include <cstdint>
#include <string>
#include <vector>

namespace pulse {

// The whole of a regular file of at most max_bytes; `what` names it in errors ("patch", "key
// file"). A file that changes size while being read is an error, never a short result.
std::vector<std::uint8_t> read_regular_file(const std::string& path, std::uint64_t max_bytes, const std::string& what);

// The first min(prefix_bytes, file size) bytes of a regular file, and its size: for readers
// of a file's header that fetch only the byte ranges they need.
struct FilePrefix {
  std::vector<std::uint8_t> bytes;
  std::uint64_t file_size = 0;
};
FilePrefix read_regular_file_prefix(const std::string& path, std::uint64_t prefix_bytes, const std::string& what);

// The machine's physical memory: the limit for whole-file reads that have no tighter bound.
std::uint64_t physical_memory_bytes();

}  // namespace pulse
