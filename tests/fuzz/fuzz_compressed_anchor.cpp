// libFuzzer entry: the input is a compressed relay anchor (anchor-<v>.safetensors.zst: one zstd
// frame holding a safetensors file). decode_compressed_checkpoint must accept it or throw
// pulse::Error, never allocate more than the limit the frame is checked against (ASan's
// -rss_limit_mb and -malloc_limit_mb catch that), and an accepted anchor's tensors must be whole.
// The same bytes as a file go through decompress_zstd_file (pulse-sync pull's reader, in
// pieces): it accepts or throws pulse::Error, never yields more than the limit or than the frame
// declares, and what both readers accept they decode to the same bytes.
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "coding/compress.hpp"
#include "sync/compressed_checkpoint.hpp"

namespace {

// One scratch file for the whole run, rewritten per input.
const std::string& scratch_file() {
  static const std::string path = [] {
    char name[] = "/tmp/fuzz_compressed_anchor.XXXXXX";
    const int fd = ::mkstemp(name);
    if (fd < 0) std::abort();
    ::close(fd);
    return std::string(name);
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  constexpr std::uint64_t limit = 16 << 20;  // what a record's state_bytes would allow
  std::optional<std::vector<std::uint8_t>> whole;
  try {
    whole = pulse::sync::decompress_zstd_frame(data, size, limit, "fuzz");
  } catch (const pulse::Error&) {
  }
  try {
    const pulse::sync::Checkpoint c = pulse::sync::decode_compressed_checkpoint(data, size, limit, "fuzz");
    std::uint64_t total = 0;
    if (c.layout.size() != c.data.size()) __builtin_trap();
    for (std::size_t i = 0; i < c.layout.size(); ++i) {
      if (c.layout[i].bytes != c.data[i].size() || c.layout[i].data != c.data[i].data()) __builtin_trap();
      total += c.data[i].size();
    }
    if (total > limit) __builtin_trap();
  } catch (const pulse::Error&) {
  }
  const std::string& path = scratch_file();
  const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC);
  if (fd < 0 || (size && ::write(fd, data, size) != static_cast<ssize_t>(size))) std::abort();
  ::close(fd);
  std::vector<std::uint8_t> pieces;
  try {
    const std::uint64_t n = pulse::sync::decompress_zstd_file(path, limit, [&](const void* p, std::size_t k) {
      if (pieces.size() + k > limit) __builtin_trap();
      const auto* bytes = static_cast<const std::uint8_t*>(p);
      pieces.insert(pieces.end(), bytes, bytes + k);
    });
    if (n != pieces.size()) __builtin_trap();
    if (whole && *whole != pieces) __builtin_trap();
  } catch (const pulse::Error&) {
  }
  return 0;
}
