#pragma once
// A zstd-compressed safetensors file (a relay anchor, anchor-<v>.safetensors.zst) decoded in
// memory: exactly one zstd frame whose declared content size is at most max_bytes, checked
// before anything is allocated, holding a valid safetensors file. Throws pulse::Error naming
// source for anything else.
#include <cstddef>
#include <cstdint>
#include <string>

#include "sync/checkpoint.hpp"

namespace pulse::sync {

Checkpoint decode_compressed_checkpoint(const std::uint8_t* data, std::size_t size, std::uint64_t max_bytes,
                                        const std::string& source);

}  // namespace pulse::sync
