#include "radix_quantiles.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "coding/parallel.hpp"
#include "core/error.hpp"

namespace pulse::python {
namespace {

constexpr std::size_t kBins = std::size_t(1) << 16;
constexpr std::size_t kKeep = 8;                   // chosen bins compared with a value at once
constexpr std::size_t kRun = 256;                  // values keyed at once in the first pass
constexpr std::size_t kTables = 4;                 // histograms the first pass counts into in turn
constexpr std::uint32_t kNoBin = 0xFFFFFFFFu;      // pads the chosen bins: no key's top 16 bits

// The bits of x as an unsigned number in the order of the values (negatives reversed below
// the positives); NaN is caught before.
std::uint32_t order_key_of_bits(std::uint32_t bits) {
  return bits ^ (std::uint32_t(std::int32_t(bits) >> 31) | 0x80000000u);  // branch-free: vectorises
}

std::uint32_t order_key(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return order_key_of_bits(bits);
}

float from_key(std::uint32_t key) {
  const std::uint32_t bits = key & 0x80000000u ? key & 0x7FFFFFFFu : ~key;
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

// The values split among tasks of at most 2^31 elements (each task's counts fit 32 bits).
std::vector<std::size_t> task_bounds(std::size_t n, unsigned threads) {
  const std::size_t limit = std::size_t(1) << 31;
  const std::size_t tasks = std::max<std::size_t>(sync::resolve_threads(threads), (n + limit - 1) / limit);
  std::vector<std::size_t> bounds(tasks + 1);
  for (std::size_t t = 0; t <= tasks; ++t) bounds[t] = std::size_t((unsigned __int128)n * t / tasks);
  return bounds;
}

}  // namespace

std::vector<double> radix_quantiles(const float* values, std::size_t n, const std::vector<double>& qs,
                                    unsigned threads) {
  for (const double q : qs) PULSE_CHECK(q >= 0 && q <= 1, "quantiles: q = " + std::to_string(q) + " is not in [0, 1]");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (n == 0) return std::vector<double>(qs.size(), nan);
  const std::vector<std::size_t> bounds = task_bounds(n, threads);
  const std::size_t tasks = bounds.size() - 1;

  // Pass 1: the values per top 16 bits of their key, and whether any is NaN. A run of values is
  // keyed at once (vectorised), then counted into kTables histograms in turn: values close in
  // magnitude share a bin, and increments of one counter would each wait for the last.
  std::vector<std::vector<std::uint32_t>> top(tasks);
  std::vector<char> any_nan(tasks, 0);
  sync::parallel_for(threads, tasks, [&](std::size_t t) {
    top[t].assign(kTables * kBins, 0);
    std::uint32_t* counts = top[t].data();
    std::uint32_t nan_seen = 0;
    std::uint16_t bins[kRun];
    for (std::size_t i = bounds[t]; i < bounds[t + 1]; i += kRun) {
      const std::size_t lanes = std::min(kRun, bounds[t + 1] - i);
      for (std::size_t l = 0; l < lanes; ++l) {
        std::uint32_t bits;
        std::memcpy(&bits, values + i + l, sizeof(bits));
        nan_seen |= std::uint32_t((bits & 0x7FFFFFFFu) > 0x7F800000u);  // NaN: all exponent bits and a mantissa bit
        bins[l] = std::uint16_t(order_key_of_bits(bits) >> 16);
      }
      std::size_t l = 0;
      for (; l + kTables <= lanes; l += kTables)
        for (std::size_t k = 0; k < kTables; ++k) ++counts[k * kBins + bins[l + k]];
      for (; l < lanes; ++l) ++counts[bins[l]];
    }
    any_nan[t] = nan_seen != 0;
  });
  if (std::count(any_nan.begin(), any_nan.end(), 1) > 0) return std::vector<double>(qs.size(), nan);
  std::vector<std::uint64_t> below(kBins + 1, 0);  // below[b]: the values in bins under b
  for (std::size_t b = 0; b < kBins; ++b) {
    std::uint64_t count = 0;
    for (std::size_t t = 0; t < tasks; ++t)
      for (std::size_t k = 0; k < kTables; ++k) count += top[t][k * kBins + b];
    below[b + 1] = below[b] + count;
  }

  // The order statistics wanted and their bins.
  std::set<std::uint64_t> ranks;
  for (const double q : qs) {
    const auto lo = std::uint64_t(q * double(n - 1));
    ranks.insert(lo);
    ranks.insert(std::min<std::uint64_t>(lo + 1, n - 1));
  }
  std::vector<std::uint8_t> slot_of_bin(kBins, 0);  // 1 + the bin's place in chosen, 0 if not chosen
  std::vector<std::size_t> chosen;                   // bins, ascending (at most 2 per quantile)
  for (const std::uint64_t r : ranks) {
    const std::size_t b = std::size_t(std::upper_bound(below.begin(), below.end(), r) - below.begin()) - 1;
    if (slot_of_bin[b] == 0) chosen.push_back(b), slot_of_bin[b] = std::uint8_t(chosen.size());
  }
  PULSE_CHECK(chosen.size() < 256, "quantiles: at most 127 quantiles at once");

  // Pass 2: the chosen bins' values per low 16 bits of their key. The chosen bins hold few of the
  // values: each run of 64 is compared with the chosen bins, kKeep at a time (vectorised), and
  // only the values that match are counted.
  std::vector<std::uint32_t> chosen_bins((chosen.size() + kKeep - 1) / kKeep * kKeep, kNoBin);
  std::copy(chosen.begin(), chosen.end(), chosen_bins.begin());
  std::vector<std::vector<std::uint32_t>> low(tasks);
  sync::parallel_for(threads, tasks, [&](std::size_t t) {
    low[t].assign(chosen.size() * kBins, 0);
    std::uint32_t* counts = low[t].data();
    const std::uint8_t* slots = slot_of_bin.data();
    for (std::size_t i = bounds[t]; i < bounds[t + 1]; i += 64) {
      const std::size_t lanes = std::min<std::size_t>(64, bounds[t + 1] - i);
      std::uint64_t hit = 0;
      for (std::size_t c = 0; c < chosen_bins.size(); c += kKeep) {
        const std::uint32_t* bins = chosen_bins.data() + c;
        for (std::size_t l = 0; l < lanes; ++l) {
          const std::uint32_t bin = order_key(values[i + l]) >> 16;
          bool any = false;
          for (std::size_t k = 0; k < kKeep; ++k) any |= bin == bins[k];
          hit |= std::uint64_t(any) << l;
        }
      }
      for (; hit != 0; hit &= hit - 1) {
        const std::uint32_t key = order_key(values[i + std::size_t(__builtin_ctzll(hit))]);
        ++counts[(slots[key >> 16] - 1) * kBins + (key & 0xFFFFu)];
      }
    }
  });
  std::map<std::uint64_t, double> value;  // rank -> order statistic
  for (std::size_t s = 0; s < chosen.size(); ++s) {
    const std::size_t b = chosen[s];
    std::uint64_t seen = below[b];
    auto r = ranks.lower_bound(below[b]);
    for (std::size_t l = 0; l < kBins && r != ranks.end() && *r < below[b + 1]; ++l) {
      for (std::size_t t = 0; t < tasks; ++t) seen += low[t][s * kBins + l];
      for (; r != ranks.end() && *r < seen; ++r) value[*r] = from_key(std::uint32_t(b << 16 | l));
    }
  }

  std::vector<double> out;
  for (const double q : qs) {
    const double pos = q * double(n - 1);
    const auto lo = std::uint64_t(pos);
    const std::uint64_t hi = std::min<std::uint64_t>(lo + 1, n - 1);
    const double a = value.at(lo), b = value.at(hi), fraction = pos - double(lo);
    if (fraction == 0 || a == b)
      out.push_back(a);
    else if (std::isinf(a) || std::isinf(b))  // the infinity, not inf - inf (NaN between -inf and inf)
      out.push_back(std::isinf(a) && std::isinf(b) ? nan : std::isinf(a) ? a : b);
    else
      out.push_back(a + (b - a) * fraction);
  }
  return out;
}

}  // namespace pulse::python
