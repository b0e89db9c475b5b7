#include "train/sparsity_meter.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <Kokkos_Sort.hpp>

#include "core/error.hpp"
#include "kernels/host_copy.hpp"

namespace pulse {

SparsityMeter::SparsityMeter(const TensorTable& table, const std::vector<int>& ks)
    : ks_(ks),
      offsets_(table.offsets()),
      segments_(make_segments(table.offsets())),
      ring_(*std::max_element(ks.begin(), ks.end()), table.num_elements()) {}

void SparsityMeter::start(const Kokkos::View<const bf16_bits*>& weights) { ring_.push(DefaultExec(), weights); }

StepSparsity SparsityMeter::measure(const Kokkos::View<const bf16_bits*>& weights) {
  StepSparsity s;
  const ChangeCounts counts = count_changed(DefaultExec(), segments_, ring_.snapshot(1), weights);
  s.changed = counts.total;
  s.per_tensor = counts.per_tensor;
  s.kstep = kstep_and_push(weights, s.changed);
  return s;
}

void SparsityMeter::compact(const Kokkos::View<const bf16_bits*>& weights, sync::ChangeSet& changes,
                            TransferCounter& copies) {
  compactor_.compact(ring_.snapshot(1), weights, offsets_, copies, changes);
}

StepSparsity SparsityMeter::measure(const Kokkos::View<const bf16_bits*>& weights, const sync::ChangeSet& changes) {
  PULSE_CHECK(changes.num_tensors() + 1 == offsets_.size(), "SparsityMeter: the change set does not fit the tensor table");
  StepSparsity s;
  s.changed = index_t(changes.size());
  for (std::size_t t = 0; t < changes.num_tensors(); ++t) s.per_tensor.push_back(changes.count(t));
  s.kstep = kstep_and_push(weights, s.changed);
  return s;
}

std::vector<double> SparsityMeter::kstep_and_push(const Kokkos::View<const bf16_bits*>& weights, index_t changed) {
  const DefaultExec space;
  std::vector<int> longer;  // k > 1: k = 1 is the step's own count
  for (const int k : ks_)
    if (k != 1) longer.push_back(k);
  const std::vector<index_t> changed_longer = ring_.count_changed_k_and_push(space, weights, longer);
  const double n = double(ring_.num_elements());
  std::vector<double> kstep;
  std::size_t next = 0;
  for (const int k : ks_) {
    const index_t c = k == 1 ? changed : changed_longer[next++];
    kstep.push_back(c < 0 ? std::numeric_limits<double>::quiet_NaN() : 1.0 - c / n);
  }
  return kstep;
}

std::vector<std::vector<bf16_bits>> SparsityMeter::snapshots() const {
  std::vector<std::vector<bf16_bits>> out;
  for (int k = ring_.size(); k >= 1; --k) out.push_back(to_host(ring_.snapshot(k)));
  return out;
}

void SparsityMeter::restore(const std::vector<std::vector<bf16_bits>>& oldest_first) {
  ring_ = SnapshotRing<DefaultMem>(ring_.depth(), ring_.num_elements());
  for (const auto& snapshot : oldest_first) ring_.push(DefaultExec(), to_device(snapshot));
}

namespace {

// The value of rank `rank` (0-based) among the bit patterns [first, last): passes that count the
// patterns per digit of the 12 highest bits in which they differ keep only the digit that holds
// the rank, until a few patterns are left for nth_element or all are equal. A large bin of equal
// or clustered values (the Adam ratios of a model that does not move are all 0) would otherwise be
// a long nth_element for each rank in it. Reorders the range.
std::uint64_t select_in_bin(std::uint64_t* first, std::uint64_t* last, index_t rank) {
  constexpr int digit_bits = 12;
  constexpr std::ptrdiff_t few = 64;
  std::vector<index_t> count(std::size_t(1) << digit_bits);
  while (last - first > few) {
    const auto [low, high] = std::minmax_element(first, last);
    const std::uint64_t differ = *low ^ *high;
    if (differ == 0) return *first;
    // Every pattern in [*low, *high] shares the bits above the highest one in which they differ.
    const int shift = std::max(0, 64 - __builtin_clzll(differ) - digit_bits);
    const auto digit = [shift](const std::uint64_t bits) { return std::size_t(bits >> shift) & ((1u << digit_bits) - 1); };
    std::fill(count.begin(), count.end(), 0);
    for (const std::uint64_t* p = first; p != last; ++p) ++count[digit(*p)];
    std::size_t d = 0;
    while (rank >= count[d]) rank -= count[d++];
    last = std::partition(first, last, [&](const std::uint64_t bits) { return digit(bits) == d; });
  }
  std::nth_element(first, first + rank, last);
  return first[rank];
}

// The order statistics ranks[j] (0-based) of values[0, count), the value std::nth_element would
// place at each rank, by a radix select: a first pass finds the smallest and largest bit patterns
// (which order as the values do when no sign bit is set), a second counts the values per bin of
// the top bits between those two, a third copies out the few bins that hold a wanted rank, and
// select_in_bin finishes within such a bin. Where a value is NaN or has its sign bit set (-0
// included) the order of equal values could decide the bits returned, so it computes nothing and
// returns false.
bool select_non_negative(const double* values, index_t count, const std::vector<index_t>& ranks,
                         std::vector<double>& out) {
  constexpr int shift = 48;                                   // bins: exponent and 4 mantissa bits
  constexpr std::uint64_t first_nan = 0x7FF0000000000001ull;  // patterns from here on are NaN or negative
  const auto bits_of = [&](const index_t i) {
    std::uint64_t bits;
    std::memcpy(&bits, values + i, sizeof bits);
    return bits;
  };
  for (const index_t rank : ranks)
    PULSE_CHECK(rank >= 0 && rank < count, "order statistic " + std::to_string(rank) + " of " + std::to_string(count));
  std::uint64_t low = ~std::uint64_t(0), high = 0;
  for (index_t i = 0; i < count; ++i) {
    const std::uint64_t bits = bits_of(i);
    low = std::min(low, bits), high = std::max(high, bits);
  }
  if (high >= first_nan) return false;
  // One bit pattern throughout (all 0 while the gradients are): every order statistic is that
  // value, without the histogram and the passes over the bin.
  if (low == high) {
    out.assign(ranks.size(), values[0]);
    return true;
  }
  // Only the bins from low's to high's: the ratios span a few octaves of the 2^11 exponents.
  const std::uint64_t first_bin = low >> shift;
  const std::size_t num_bins = std::size_t((high >> shift) - first_bin) + 1;
  const auto bin_of = [first_bin](const std::uint64_t bits) { return std::size_t((bits >> shift) - first_bin); };
  std::vector<index_t> below(num_bins + 1, 0);  // counts per bin, then the values in the bins before each
  for (index_t i = 0; i < count; ++i) ++below[bin_of(bits_of(i)) + 1];
  for (std::size_t b = 1; b <= num_bins; ++b) below[b] += below[b - 1];
  // Each wanted bin gets a slot (1, 2, ...) and a stretch [starts[slot - 1], starts[slot]) of `picked`.
  std::vector<std::uint8_t> slot(num_bins, 0);
  std::vector<index_t> starts{0};
  std::vector<std::size_t> bin_of_rank;
  for (const index_t rank : ranks) {
    const std::size_t b = std::size_t(std::upper_bound(below.begin(), below.end(), rank) - below.begin()) - 1;
    if (slot[b] == 0) {
      if (starts.size() > 255) return false;  // more wanted bins than slots
      slot[b] = std::uint8_t(starts.size());
      starts.push_back(starts.back() + below[b + 1] - below[b]);
    }
    bin_of_rank.push_back(b);
  }
  // The wanted bins' values in the order they come, without a branch (a value outside them is
  // overwritten by the next one), then grouped per bin.
  std::vector<std::uint64_t> wanted(std::size_t(starts.back()) + 1);
  std::size_t num_wanted = 0;
  for (index_t i = 0; i < count; ++i) {
    const std::uint64_t bits = bits_of(i);
    wanted[num_wanted] = bits;
    num_wanted += slot[bin_of(bits)] != 0;
  }
  std::vector<std::uint64_t> picked(std::size_t(starts.back()));
  std::vector<index_t> next(starts.begin(), starts.end() - 1);
  for (std::size_t j = 0; j < num_wanted; ++j) picked[std::size_t(next[slot[bin_of(wanted[j])] - 1]++)] = wanted[j];
  out.clear();
  for (std::size_t j = 0; j < ranks.size(); ++j) {
    const std::size_t b = bin_of_rank[j];
    const std::uint64_t bits =
        select_in_bin(picked.data() + starts[slot[b] - 1], picked.data() + starts[slot[b]], ranks[j] - below[b]);
    double value;
    std::memcpy(&value, &bits, sizeof value);
    out.push_back(value);
  }
  return true;
}

}  // namespace

std::vector<double> gradient_sparsity(const Kokkos::View<const float*>& grads, const std::vector<float>& thresholds) {
  const std::vector<index_t> small = count_small(DefaultExec(), grads, thresholds);
  std::vector<double> out;
  for (const index_t c : small) out.push_back(grads.extent(0) ? double(c) / grads.extent(0) : 0.0);
  return out;
}

std::vector<double> adam_ratio_quantiles(const Kokkos::View<const float*>& m, const Kokkos::View<const float*>& v,
                                         double beta1, double beta2, double eps, std::int64_t step,
                                         const std::vector<double>& quantiles, index_t max_sample) {
  const index_t n = static_cast<index_t>(m.extent(0));
  if (n == 0) return std::vector<double>(quantiles.size(), std::numeric_limits<double>::quiet_NaN());
  const index_t stride = std::max<index_t>(1, n / max_sample);
  const index_t count = (n + stride - 1) / stride;
  const double c1 = 1.0 - std::pow(beta1, double(step)), c2 = 1.0 - std::pow(beta2, double(step));
  Kokkos::View<double*> sample(Kokkos::view_alloc(Kokkos::WithoutInitializing, "pulse::adam_ratio_sample"), count);
  Kokkos::parallel_for(
      "pulse::adam_ratio", FlatPolicy<DefaultExec>(DefaultExec(), 0, count), KOKKOS_LAMBDA(const index_t j) {
        const index_t i = j * stride;
        const double m_hat = double(m(i)) / c1, v_hat = double(v(i)) / c2;
        sample(j) = (m_hat < 0 ? -m_hat : m_hat) / (::sqrt(v_hat) + eps);  // ::sqrt: host and device
      });
  // The order statistics are picked where the sample lives: only the quantiles leave the device.
  std::vector<index_t> ranks;
  for (const double q : quantiles) ranks.push_back(std::min<index_t>(count - 1, index_t(q * double(count - 1) + 0.5)));
  std::vector<double> out;
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, DefaultMem>::accessible) {
    DefaultExec().fence();
    double* const host = sample.data();
    if (select_non_negative(host, count, ranks, out)) return out;
    index_t placed = -1;  // host[placed] is in its sorted place, smaller ones before it, larger after
    for (const index_t k : ranks) {
      // Ascending quantiles search only the part after the previous one.
      if (k >= placed && placed >= 0) std::nth_element(host + placed, host + k, host + count);
      else std::nth_element(host, host + k, host + count);
      placed = k;
      out.push_back(host[k]);
    }
  } else {
    Kokkos::sort(sample);
    for (const index_t k : ranks) {
      double value = 0;
      Kokkos::deep_copy(Kokkos::View<double, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(&value),
                        Kokkos::subview(sample, k));
      out.push_back(value);
    }
  }
  return out;
}

}  // namespace pulse
