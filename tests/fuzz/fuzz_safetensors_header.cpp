// libFuzzer entry: the input is a whole safetensors file. parse_header must accept it or throw
// pulse::Error; a crash, a sanitizer report or any other exception escaping is a bug. Accepted
// headers must also satisfy the format's invariant: the tensors tile the data section.
#include <cstddef>
#include <cstdint>

#include "core/error.hpp"
#include "io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  pulse::io::SafetensorsLimits limits;
  limits.max_tensors = 256;  // small limits reach the limit checks with small inputs
  limits.max_rank = 4;
  try {
    const auto header = pulse::io::parse_header(reinterpret_cast<const std::byte*>(data), size, limits);
    std::size_t covered = 0;
    for (const auto& t : header.tensors) {
      if (t.begin != covered || t.end < t.begin) __builtin_trap();
      covered = t.end;
    }
    if (header.data_offset + covered != size) __builtin_trap();
  } catch (const pulse::Error&) {
  }
  return 0;
}
