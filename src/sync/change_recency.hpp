#pragma once
// How many versions ago each element of a state last changed, per tensor of a sparse-coded
// dtype: a context a receiver that followed every patch could know (pulse-bench-sync --trace
// measures what it tells about the next change, change_entropy.hpp). An element that changed in
// the latest patch has recency 1, one that changed in the patch before 2, ...; 255 stands for
// 255 or more versions and for never (every element starts there). Integer-only.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "sync/digest.hpp"

namespace pulse::sync {

class ChangeRecency {
 public:
  static constexpr std::uint8_t kNever = 255;
  // Recency buckets: 1, 2, 3-4, 5-8, 9-16, 17 or more (or never).
  static constexpr unsigned kBuckets = 6;
  static unsigned bucket(std::uint8_t recency) {
    return recency <= 2 ? (recency == 0 ? 0 : recency - 1) : recency <= 4 ? 2 : recency <= 8 ? 3 : recency <= 16 ? 4 : 5;
  }

  // Every tensor of `state` with a sparse-coded dtype, each element never changed.
  explicit ChangeRecency(const std::vector<TensorRef>& state);

  // The tensor's recencies (one per element), or nullptr when it is not tracked.
  const std::vector<std::uint8_t>* of(const std::string& name) const;
  // One version on: every element ages by one (saturating at kNever)...
  void age();
  // ...then the elements the version changed become 1 (indices below the tensor's size).
  template <class Index>
  void mark_changed(const std::string& name, const Index* indices, std::size_t count) {
    const auto it = tensors_.find(name);
    PULSE_CHECK(it != tensors_.end(), "change recency: no tensor '" + name + "'");
    for (std::size_t k = 0; k < count; ++k) it->second.at(std::size_t(indices[k])) = 1;
  }

 private:
  std::map<std::string, std::vector<std::uint8_t>> tensors_;
};

}  // namespace pulse::sync
