#include "sync/change_history.hpp"

#include <cstring>

#include "core/error.hpp"
#include "sync/change_set.hpp"
#include "sync/patch.hpp"
#include "sync/sparse_format.hpp"

namespace pulse::sync {

namespace {

// The digest of a history: of its origin's state, then of the previous digest and each version's.
Digest chain(const Digest* previous, const Digest& state) {
  std::uint8_t bytes[32];
  std::size_t size = 0;
  if (previous) {
    std::memcpy(bytes, previous->data(), 16);
    size = 16;
  }
  std::memcpy(bytes + size, state.data(), 16);
  return digest_bytes(bytes, size + 16);
}

}  // namespace

ChangeHistory::ChangeHistory(const std::vector<TensorRef>& origin, const Digest& origin_state)
    : digest_(chain(nullptr, origin_state)) {
  for (const TensorRef& t : origin)
    if (const auto format = sparse_format(t.dtype)) tensors_[t.name].assign(t.bytes / format->bytes, 0);
}

ChangeHistory::ChangeHistory(const std::vector<TensorRef>& layout, const std::vector<std::uint8_t>& bytes,
                             const Digest& digest)
    : digest_(digest) {
  std::size_t at = 0;
  for (const TensorRef& t : layout)
    if (const auto format = sparse_format(t.dtype)) tensors_[t.name].assign(t.bytes / format->bytes, 0);
  for (auto& [name, h] : tensors_) {
    PULSE_CHECK(bytes.size() - at >= h.size(), "change history is shorter than its tensors need");
    if (!h.empty()) std::memcpy(h.data(), bytes.data() + at, h.size());  // an empty vector's data() may be null
    at += h.size();
  }
  PULSE_CHECK(at == bytes.size(), "change history is longer than its tensors need");
}

const std::uint8_t* ChangeHistory::of(const std::string& name) const {
  static const std::uint8_t kNone = 0;  // an empty tensor's (its vector may hold no storage)
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second.empty() ? &kNone : it->second.data();
}

std::vector<std::uint8_t> ChangeHistory::bytes() const {
  std::vector<std::uint8_t> out;
  for (const auto& [name, h] : tensors_) out.insert(out.end(), h.begin(), h.end());
  return out;
}

void ChangeHistory::age() {
  for (auto& [name, h] : tensors_)
    for (std::uint8_t& x : h) {  // branch-free, so that it vectorises
      const std::uint8_t a = x & kMaxAge;
      x = std::uint8_t((x & kLowered) | (a + (a != 0 && a != kMaxAge)));
    }
}

std::uint8_t* ChangeHistory::marks(const std::string& name) {
  const auto it = tensors_.find(name);
  PULSE_CHECK(it != tensors_.end(), "change history: no tensor '" + name + "'");
  return it->second.data();
}

void ChangeHistory::mark_differences(std::uint8_t* marks, const SparseFormat& format, const std::byte* before,
                                     const std::byte* after, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) {
    const auto old_key = format.key(load_value(before, i, format.bytes));
    const auto new_key = format.key(load_value(after, i, format.bytes));
    if (old_key != new_key) marks[i] = changed(old_key, new_key);
  }
}

void ChangeHistory::seal(const Digest& target_state) { digest_ = chain(&digest_, target_state); }

void ChangeHistory::advance(const std::vector<TensorRef>& base, const std::vector<TensorChanges>& changes,
                            const Digest& target_state) {
  std::map<std::string, const TensorRef*> base_of;
  for (const TensorRef& t : base) base_of[t.name] = &t;
  age();
  for (const TensorChanges& c : changes) {
    const auto it = base_of.find(c.name);
    PULSE_CHECK(it != base_of.end(), "change history: no base tensor '" + c.name + "'");
    const SparseFormat format = *sparse_format(it->second->dtype);
    std::uint8_t* h = marks(c.name);
    for (std::size_t k = 0; k < c.indices.size(); ++k) {
      const auto old_key = format.key(load_value(it->second->data, std::uint64_t(c.indices[k]), format.bytes));
      const auto new_key = format.key(c.new_bits[k]);
      if (old_key != new_key) h[c.indices[k]] = changed(old_key, new_key);
    }
  }
  seal(target_state);
}

void ChangeHistory::advance(const std::vector<TensorRef>& base, const ChangeSet& changes, const Digest& target_state) {
  PULSE_CHECK(changes.num_tensors() == base.size(), "change history: the change set does not fit the base");
  age();
  index_t origin = 0;
  for (std::size_t t = 0; t < base.size(); ++t) {
    const auto format = sparse_format(base[t].dtype);
    PULSE_CHECK(format.has_value(), "change history: a change set's tensor '" + base[t].name + "' is not coded sparsely");
    if (changes.count(t) > 0) {
      std::uint8_t* h = marks(base[t].name);
      for (auto j = std::size_t(changes.tensor_begin[t]); j < std::size_t(changes.tensor_begin[t + 1]); ++j) {
        const auto i = std::uint64_t(changes.indices[j] - origin);
        const auto old_key = format->key(load_value(base[t].data, i, format->bytes));
        const auto new_key = format->key(changes.new_bits[j]);
        if (old_key != new_key) h[i] = changed(old_key, new_key);
      }
    }
    origin += index_t(base[t].bytes / format->bytes);
  }
  seal(target_state);
}

void ChangeHistory::advance(const std::vector<TensorRef>& base, const std::vector<TensorRef>& target,
                            const Digest& target_state) {
  PULSE_CHECK(base.size() == target.size(), "change history: base and target differ in layout");
  age();
  for (std::size_t t = 0; t < base.size(); ++t) {
    PULSE_CHECK(base[t].name == target[t].name && base[t].dtype == target[t].dtype && base[t].bytes == target[t].bytes,
                "change history: base and target differ in layout");
    if (const auto format = sparse_format(base[t].dtype))
      mark_differences(marks(base[t].name), *format, base[t].data, target[t].data, base[t].bytes / format->bytes);
  }
  seal(target_state);
}

}  // namespace pulse::sync
