#include "train/sparsity_meter.hpp"

#include <algorithm>
#include <cfloat>
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

StepSparsity SparsityMeter::measure(const Kokkos::View<const bf16_bits*>& weights, sync::ChangeSet& changes,
                                    TransferCounter& copies) {
  compactor_.compact(ring_.snapshot(1), weights, offsets_, copies, changes);
  return measure(weights, changes);
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
// place at each rank, by a radix select: one pass counts the values per bin of the top bits of
// their bit patterns (which order as the values do when no sign bit is set), a second copies out
// the few bins that hold a wanted rank, and select_in_bin finishes within such a bin. Where a
// value is NaN or has its sign bit set (-0 included) the order of equal values could decide the
// bits returned, so it computes nothing and returns false.
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
  // One bit pattern throughout (all 0 while the gradients are): every order statistic is that
  // value, without the histogram and the passes over the bin. A spread sample leaves at i = 1.
  const std::uint64_t first_bits = bits_of(0);
  index_t same = 1;
  while (same < count && bits_of(same) == first_bits) ++same;
  if (same == count && first_bits < first_nan) {
    out.assign(ranks.size(), values[0]);
    return true;
  }
  const std::size_t num_bins = std::size_t(first_nan >> shift) + 1;
  std::vector<index_t> below(num_bins + 1, 0);  // counts per bin, then the values in the bins before each
  for (index_t i = 0; i < count; ++i) {
    const std::uint64_t bits = bits_of(i);
    if (bits >= first_nan) return false;
    ++below[(bits >> shift) + 1];
  }
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
  std::vector<std::uint64_t> picked(std::size_t(starts.back()));
  std::vector<index_t> next(starts.begin(), starts.end() - 1);
  for (index_t i = 0; i < count; ++i) {
    const std::uint64_t bits = bits_of(i);
    if (const int s = slot[bits >> shift]) picked[std::size_t(next[s - 1]++)] = bits;
  }
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

// The Adam ratio of one sampled element, in the double operations that define the statistic.
KOKKOS_INLINE_FUNCTION double adam_ratio(const float m, const float v, const double c1, const double c2,
                                         const double eps) {
  const double m_hat = double(m) / c1, v_hat = double(v) / c2;
  return (m_hat < 0 ? -m_hat : m_hat) / (::sqrt(v_hat) + eps);  // ::sqrt: host and device
}

// The order statistics ranks[j] of the strided sample's ratios (adam_ratio of m[j * stride],
// v[j * stride], j < count) with few of them computed in double. The ratios in float first (a
// fraction of the double divisions' cost) are counted per bin of their top bits (5 mantissa bits)
// to find each rank's bin; the ratios in that bin, widened by a margin, are computed in double
// and selected among. A float ratio lies within kRelative * r + kAbsolute of the double one r (six
// float roundings of 2^-24 each; the absolute part covers subnormal intermediates over eps >=
// kMinEps), so each value returned is checked to lie above every ratio whose float fell below the
// widened bin and below every one whose float fell above it: then it is the order statistic.
// Returns false (nothing decided) where a check fails, a value is 0 (+0 and -0 would tie), a
// float ratio is not finite, all are equal, or the constants leave the float range.
bool select_from_float_ratios(const float* m, const float* v, index_t stride, index_t count, double c1, double c2,
                              double eps, const std::vector<index_t>& ranks, std::vector<double>& out) {
  constexpr double kRelative = 1.0 / 65536, kAbsolute = 1e-30, kMinEps = 1e-12;
  constexpr int kBinShift = 18;                          // bins: exponent and 5 mantissa bits
  constexpr std::uint32_t kInfinity = 0x7F800000u;       // patterns from here on: not finite or negative
  constexpr std::size_t kBins = kInfinity >> kBinShift;  // the finite non-negative floats' bins
  const float c1f = float(c1), c2f = float(c2), epsf = float(eps);
  if (!(c1f >= FLT_MIN && c1f <= FLT_MAX && c2f >= FLT_MIN && c2f <= FLT_MAX && eps >= kMinEps && epsf <= FLT_MAX))
    return false;
  // Kept between calls: fresh buffers of these sizes would be new pages, a fault each, every step.
  thread_local std::vector<float> ratios;
  thread_local std::vector<index_t> below;  // counts per bin, then the ratios in the bins before each
  ratios.resize(std::size_t(count));
  float* const approx = ratios.data();  // a local pointer: the loop vectorises
  std::uint32_t m_bits = 0;             // the sampled m's bit patterns ORed: 0 where every one is +0
  for (index_t j = 0; j < count; ++j) {
    const float mj = m[j * stride];
    std::uint32_t b;
    std::memcpy(&b, &mj, sizeof b);
    m_bits |= b;
    approx[j] = std::fabs(mj) / c1f / (std::sqrt(v[j * stride] / c2f) + epsf);
  }
  const auto bits = [approx](const index_t j) {
    std::uint32_t b;
    std::memcpy(&b, approx + j, sizeof b);
    return b;
  };
  // One value throughout: the histogram would count it in one chain of increments. Every m +0
  // and every float ratio +0 (as while the gradients are 0): every double ratio is +0 (0 over a
  // positive or infinite denominator; a NaN one would have made the float ratio NaN). Otherwise
  // the double selection's own check of one value settles it.
  std::uint32_t differ = 0;
  for (index_t j = 1; j < count; ++j) differ |= bits(j) ^ bits(0);
  if (differ == 0 && bits(0) == 0 && m_bits == 0) {
    out.assign(ranks.size(), 0.0);
    return true;
  }
  if (differ == 0) return false;
  // Four histograms, element j in row j % 4: neighbours often share a bin, and one histogram
  // would make each increment wait for the previous one.
  constexpr index_t kRows = 4;
  constexpr std::size_t kSlots = std::size_t(1) << (31 - kBinShift);  // a row: every sign-less pattern's bin
  thread_local std::vector<std::uint32_t> rows;
  rows.assign(kRows * kSlots, 0);
  std::uint32_t* const row = rows.data();
  std::uint32_t outside = 0;  // patterns of non-finite or negative ratios
  index_t j = 0;
  for (; j + kRows <= count; j += kRows)
    for (index_t r = 0; r < kRows; ++r) {
      const std::uint32_t b = bits(j + r);
      outside |= b & 0x80000000u;
      ++row[r * kSlots + ((b & 0x7FFFFFFFu) >> kBinShift)];
    }
  for (; j < count; ++j) {
    const std::uint32_t b = bits(j);
    outside |= b & 0x80000000u;
    ++row[(b & 0x7FFFFFFFu) >> kBinShift];
  }
  below.assign(kBins + 1, 0);
  for (std::size_t b = 0; b < kBins; ++b)
    below[b + 1] = below[b] + row[b] + row[kSlots + b] + row[2 * kSlots + b] + row[3 * kSlots + b];
  // Bins from kBins on hold the infinite and NaN patterns.
  if (outside != 0 || below[kBins] != count) return false;
  const auto edge = [](std::size_t bin) {  // the smallest float of the bin
    const std::uint32_t b = std::uint32_t(bin) << kBinShift;
    float x;
    std::memcpy(&x, &b, sizeof x);
    return x;
  };
  // Each rank's bin and its neighbours; the sample positions of every ratio in one of them.
  std::vector<std::size_t> bin_of_rank;
  std::vector<std::uint8_t> wanted(kBins, 0);
  for (const index_t rank : ranks) {
    const std::size_t bin = std::size_t(std::upper_bound(below.begin(), below.end(), rank) - below.begin()) - 1;
    if (bin == 0 || bin + 1 >= kBins) return false;  // 0 and the smallest ratios, or the largest: checks would fail
    bin_of_rank.push_back(bin);
    wanted[bin - 1] = wanted[bin] = wanted[bin + 1] = 1;
  }
  thread_local std::vector<index_t> near_storage;
  near_storage.resize(std::size_t(count));
  index_t* const near = near_storage.data();
  index_t num_near = 0;
  for (index_t j = 0; j < count; ++j) {
    near[num_near] = j;
    num_near += wanted[bits(j) >> kBinShift];
  }
  std::vector<double> exact;
  out.clear();
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const std::size_t bin = bin_of_rank[r];
    // The bin widened by a margin far above the float ratios' error, within its neighbours: the
    // order statistic's float lies in the bin, its double value within that error of it.
    const float low = float(double(edge(bin)) * (1 - 8 * kRelative) - 4 * kAbsolute);
    const float high = float(double(edge(bin + 1)) * (1 + 8 * kRelative) + 4 * kAbsolute);
    if (!(low >= edge(bin - 1) && high < edge(bin + 2))) return false;
    index_t before = below[bin - 1];  // ratios whose float is below `low`
    exact.clear();
    for (index_t c = 0; c < num_near; ++c) {
      const index_t j = near[c];
      const float x = approx[j];
      if (x < low) before += x >= edge(bin - 1);
      else if (x <= high) exact.push_back(adam_ratio(m[j * stride], v[j * stride], c1, c2, eps));
    }
    const index_t k = ranks[r] - before;
    if (k < 0 || k >= index_t(exact.size())) return false;
    std::nth_element(exact.begin(), exact.begin() + k, exact.end());
    const double value = exact[std::size_t(k)];
    // Every ratio whose float is below `low` is below the first bound, every one above `high` at
    // least the second.
    if (!(value > 0 && value >= (double(low) + kAbsolute) * (1 + 2 * kRelative) &&
          value <= (double(high) - kAbsolute) * (1 - 2 * kRelative)))
      return false;
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
  std::vector<index_t> ranks;
  for (const double q : quantiles) ranks.push_back(std::min<index_t>(count - 1, index_t(q * double(count - 1) + 0.5)));
  std::vector<double> out;
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, DefaultMem>::accessible) {
    DefaultExec().fence();
    if (select_from_float_ratios(m.data(), v.data(), stride, count, c1, c2, eps, ranks, out)) return out;
  }
  Kokkos::View<double*> sample(Kokkos::view_alloc(Kokkos::WithoutInitializing, "pulse::adam_ratio_sample"), count);
  Kokkos::parallel_for(
      "pulse::adam_ratio", FlatPolicy<DefaultExec>(DefaultExec(), 0, count),
      KOKKOS_LAMBDA(const index_t j) { sample(j) = adam_ratio(m(j * stride), v(j * stride), c1, c2, eps); });
  // The order statistics are picked where the sample lives: only the quantiles leave the device.
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
