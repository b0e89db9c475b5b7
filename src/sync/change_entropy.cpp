#include "sync/change_entropy.hpp"

#include <cmath>
#include <map>
#include <string>
#include <tuple>

#include "sync/sparse_format.hpp"

namespace pulse::sync {

namespace {

// n H(m / n) in bits.
double bernoulli_bits(double n, double m) {
  if (m <= 0 || m >= n) return 0;
  const double p = m / n;
  return -n * (p * std::log2(p) + (1 - p) * std::log2(1 - p));
}

// Sum over symbols of -count log2(count / total).
double empirical_bits(const std::map<std::int64_t, std::uint64_t>& counts) {
  double total = 0, bits = 0;
  for (const auto& [symbol, c] : counts) total += double(c);
  for (const auto& [symbol, c] : counts) bits -= double(c) * std::log2(double(c) / total);
  return bits;
}

}  // namespace

ChangeEntropy change_entropy(const std::vector<TensorRef>& base, const std::vector<TensorRef>& target,
                             const ElementContexts* contexts) {
  std::map<std::string, const TensorRef*> base_by_name;
  for (const auto& t : base) base_by_name[t.name] = &t;
  ChangeEntropy e;
  // Value contexts: dtype, exponent class, element context.
  std::map<std::tuple<std::string, unsigned, unsigned>, std::map<std::int64_t, std::uint64_t>> steps_by_class;
  std::map<std::string, std::map<std::int64_t, std::uint64_t>> steps_by_dtype;
  for (const auto& t : target) {
    const auto it = base_by_name.find(t.name);
    const auto format = sparse_format(t.dtype);
    if (it == base_by_name.end() || !format || it->second->dtype != t.dtype || it->second->shape != t.shape) continue;
    const std::uint64_t n = t.bytes / format->bytes;
    const std::uint8_t* context = nullptr;
    if (contexts) {
      const auto c = contexts->find(t.name);
      if (c != contexts->end() && c->second.size() == n) context = c->second.data();
    }
    // Position contexts of this tensor: exponent class x element context.
    const std::size_t classes = format->classes();
    std::vector<std::uint64_t> elements(256 * classes, 0), changed(256 * classes, 0);
    std::uint64_t changed_total = 0;
    for (std::uint64_t i = 0; i < n; ++i) {
      const std::uint64_t before = load_value(it->second->data, i, format->bytes);
      const std::uint64_t after = load_value(t.data, i, format->bytes);
      const unsigned c = context ? context[i] : 0;
      const unsigned k = format->exponent_class(before);
      ++elements[c * classes + k];
      if (before == after) continue;
      ++changed[c * classes + k];
      ++changed_total;
      const std::int64_t step = std::int64_t(format->key(after)) - std::int64_t(format->key(before));
      ++steps_by_class[{t.dtype, k, c}][step];
      ++steps_by_dtype[t.dtype][step];
    }
    for (std::size_t k = 0; k < elements.size(); ++k)
      if (elements[k]) e.position_bits += bernoulli_bits(double(elements[k]), double(changed[k]));
    e.position_bits_no_context += bernoulli_bits(double(n), double(changed_total));
    e.changes += changed_total;
  }
  for (const auto& [context, counts] : steps_by_class) e.value_bits += empirical_bits(counts);
  for (const auto& [dtype, counts] : steps_by_dtype) e.value_bits_no_context += empirical_bits(counts);
  return e;
}

}  // namespace pulse::sync
