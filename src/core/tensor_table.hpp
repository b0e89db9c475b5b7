#pragma once
// The tensor table: name, shape and flat offset of every parameter tensor. It is the single
// source of truth for safetensors names, patch entries and per-tensor statistics.
#include <cstdint>
#include <string>
#include <vector>

#include "core/index.hpp"

namespace pulse {

struct TensorInfo {
  std::string name;            // Hugging Face style, e.g. "blocks.0.attn.qkv.weight"
  std::vector<index_t> shape;  // row-major
  index_t offset = 0;          // first element in the flat buffer
  index_t numel = 0;
  bool weight_decay = true;    // AdamW decays this tensor (off for norms and biases)
};

class TensorTable {
 public:
  // Appends a tensor after the last one; names must be unique and dimensions non-negative.
  const TensorInfo& add(const std::string& name, const std::vector<index_t>& shape,
                        bool weight_decay = true);

  int size() const { return static_cast<int>(tensors_.size()); }
  index_t num_elements() const { return num_elements_; }
  const TensorInfo& operator[](int i) const { return tensors_.at(i); }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // Position of the named tensor; throws pulse::Error when absent.
  int index_of(const std::string& name) const;
  // size() + 1 offsets, the last one being num_elements().
  std::vector<index_t> offsets() const;
  // 1 where the tensor is decayed, 0 where not, in table order.
  std::vector<std::uint8_t> weight_decay_mask() const;

 private:
  std::vector<TensorInfo> tensors_;
  index_t num_elements_ = 0;
};

}  // namespace pulse
