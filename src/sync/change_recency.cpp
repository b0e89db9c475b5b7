#include "sync/change_recency.hpp"

#include "sync/sparse_format.hpp"

namespace pulse::sync {

ChangeRecency::ChangeRecency(const std::vector<TensorRef>& state) {
  for (const TensorRef& t : state)
    if (const auto format = sparse_format(t.dtype)) tensors_[t.name].assign(t.bytes / format->bytes, kNever);
}

const std::vector<std::uint8_t>* ChangeRecency::of(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

void ChangeRecency::age() {
  for (auto& [name, r] : tensors_)
    for (std::uint8_t& x : r) x += x != kNever;
}

}  // namespace pulse::sync
