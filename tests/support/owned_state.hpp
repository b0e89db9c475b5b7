#pragma once
// A model state that owns its tensors' bytes, for the patch tests: the TensorRef view a sender
// encodes from and the MutableTensor view a receiver applies to.
#include <cstddef>
#include <cstdint>
#include <string>
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

}  // namespace pulse::test
