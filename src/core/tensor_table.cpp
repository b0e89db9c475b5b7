#include "core/tensor_table.hpp"

#include "core/error.hpp"

namespace pulse {

const TensorInfo& TensorTable::add(const std::string& name, const std::vector<index_t>& shape,
                                   bool weight_decay) {
  PULSE_CHECK(!name.empty(), "tensor name is empty");
  for (const auto& t : tensors_) PULSE_CHECK(t.name != name, "duplicate tensor name '" + name + "'");
  index_t numel = 1;
  for (index_t d : shape) {
    PULSE_CHECK(d >= 0, "tensor '" + name + "' has a negative dimension " + std::to_string(d));
    numel *= d;
  }
  tensors_.push_back({name, shape, num_elements_, numel, weight_decay});
  num_elements_ += numel;
  return tensors_.back();
}

int TensorTable::index_of(const std::string& name) const {
  for (int i = 0; i < size(); ++i)
    if (tensors_[i].name == name) return i;
  throw_error(__FILE__, __LINE__, "no tensor named '" + name + "'");
}

std::vector<index_t> TensorTable::offsets() const {
  std::vector<index_t> out;
  out.reserve(tensors_.size() + 1);
  for (const auto& t : tensors_) out.push_back(t.offset);
  out.push_back(num_elements_);
  return out;
}

std::vector<std::uint8_t> TensorTable::weight_decay_mask() const {
  std::vector<std::uint8_t> out;
  for (const auto& t : tensors_) out.push_back(t.weight_decay ? 1 : 0);
  return out;
}

}  // namespace pulse
