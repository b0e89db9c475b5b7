#pragma once
// A model state that owns its tensors' bytes, for the patch tests: the TensorRef view a sender
// encodes from and the MutableTensor view a receiver applies to.
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "sync/patch.hpp"

namespace pulse::test {

struct OwnedTensor {
  std::string name, dtype;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> bytes;

  sync::TensorLayout layout() const { return {name, dtype, shape}; }
};
using State = std::vector<OwnedTensor>;

inline std::vector<sync::TensorRef> refs(const State& s) {
  std::vector<sync::TensorRef> out;
  for (const auto& t : s) out.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  return out;
}

inline std::vector<sync::MutableTensor> mutables(State& s) {
  std::vector<sync::MutableTensor> out;
  for (auto& t : s) out.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  return out;
}

// Bytes per element of the dtypes the patch tests make.
inline unsigned element_width(const std::string& dtype) {
  return dtype == "F32" ? 4 : dtype == "I64" ? 8 : dtype == "F8_E4M3" ? 1 : 2;
}

// The next version: a fraction of each floating-point tensor's elements moved by a key step or
// two (integer tensors kept).
inline State changed(std::mt19937_64& rng, State s, double fraction) {
  std::bernoulli_distribution change(fraction);
  for (auto& t : s) {
    if (t.dtype == "I64") continue;
    const unsigned w = element_width(t.dtype);
    for (std::size_t i = 0; i < t.bytes.size() / w; ++i)
      if (change(rng)) t.bytes[i * w] ^= std::byte(1 + rng() % 3);
  }
  return s;
}

// What a receiver holding the whole base decodes from a patch: every entry's indices and values.
inline std::vector<std::pair<std::vector<std::uint64_t>, std::vector<std::uint8_t>>> decoded(
    const std::vector<std::uint8_t>& patch, const State& base, int threads) {
  const sync::ParsedPatch p = sync::parse_patch(patch.data(), patch.size());
  const auto base_refs = refs(base);
  sync::PatchDecoder decoder(p, base_refs, true, nullptr, threads);
  std::vector<std::pair<std::vector<std::uint64_t>, std::vector<std::uint8_t>>> out;
  for (std::size_t k = 0; k < decoder.size(); ++k) {
    sync::DecodedEntry e = decoder.next();
    out.push_back({e.indices, e.values});
  }
  decoder.finish();
  return out;
}

}  // namespace pulse::test
