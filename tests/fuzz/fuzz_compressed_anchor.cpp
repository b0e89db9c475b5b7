// libFuzzer entry: the input is a compressed relay anchor (anchor-<v>.safetensors.zst: one zstd
// frame holding a safetensors file). decode_compressed_checkpoint must accept it or throw
// pulse::Error, never allocate more than the limit the frame is checked against (ASan's
// -rss_limit_mb and -malloc_limit_mb catch that), and an accepted anchor's tensors must be whole.
#include <cstddef>
#include <cstdint>

#include "core/error.hpp"
#include "sync/compressed_checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  constexpr std::uint64_t limit = 16 << 20;  // what a record's state_bytes would allow
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
  return 0;
}
