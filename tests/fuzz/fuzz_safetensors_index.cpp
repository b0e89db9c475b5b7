// libFuzzer entry: the input is a model.safetensors.index.json. parse_safetensors_index must
// accept it or throw pulse::Error; a crash, a sanitizer report or any other exception escaping is
// a bug. Accepted shard names must be plain file names of the folder.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "io/model_state.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto index = pulse::io::parse_safetensors_index(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
    for (const auto& [tensor, shard] : index.weight_map)
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "..") __builtin_trap();
  } catch (const pulse::Error&) {
  }
  return 0;
}
