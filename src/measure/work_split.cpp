#include "measure/work_split.hpp"

#include <algorithm>

namespace pulse::measure {

std::vector<Unit> make_units(const std::vector<MeasuredTensor>& tensors, std::uint64_t unit_bytes) {
  std::vector<Unit> units(1);
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const std::uint64_t esz = tensors[t].element_bytes;
    const std::int64_t max_elements = std::max<std::int64_t>(1, std::int64_t(unit_bytes / esz));
    for (std::int64_t b = 0; b < tensors[t].numel; b += max_elements) {
      const std::int64_t e = std::min(tensors[t].numel, b + max_elements);
      const std::uint64_t bytes = std::uint64_t(e - b) * esz;
      if (!units.back().pieces.empty() && units.back().bytes + bytes > unit_bytes) units.emplace_back();
      units.back().pieces.push_back({t, b, e});
      units.back().bytes += bytes;
    }
  }
  if (units.back().pieces.empty()) units.pop_back();
  return units;
}

std::pair<std::size_t, std::size_t> units_of_rank(const std::vector<Unit>& units, int rank, int nranks) {
  std::uint64_t total = 0;
  for (const Unit& u : units) total += u.bytes;
  // A unit belongs to the rank whose byte slice holds its middle byte.
  std::size_t first = units.size(), last = 0;
  std::uint64_t start = 0;
  for (std::size_t i = 0; i < units.size(); ++i) {
    const long double middle = (long double)start + (long double)units[i].bytes / 2;
    const int owner = std::min(nranks - 1, int(middle * nranks / (long double)std::max<std::uint64_t>(total, 1)));
    if (owner == rank) {
      first = std::min(first, i);
      last = i + 1;
    }
    start += units[i].bytes;
  }
  return first < last ? std::make_pair(first, last) : std::make_pair(std::size_t(0), std::size_t(0));
}

}  // namespace pulse::measure
