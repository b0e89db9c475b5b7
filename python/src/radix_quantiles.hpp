#pragma once
// numpy's default quantiles (linear interpolation between the order statistics at q * (n - 1))
// of float32 values, by a radix select instead of a sort: the values' bits, made unsigned in
// the values' order, name their order, so a count of the values per top 16 bits names the bin
// of each order statistic wanted, and a count per low 16 bits of those bins' values names its
// bits exactly. Two passes over the values, on threads; the result is the same at any count.
#include <cstddef>
#include <vector>

namespace pulse::python {

// The quantiles qs (each in [0, 1]) of the n values; NaN for each where n is 0 or a value is
// NaN (numpy's answer). Between an infinite order statistic and a finite one: the infinity
// (numpy's interpolation gives NaN there).
std::vector<double> radix_quantiles(const float* values, std::size_t n, const std::vector<double>& qs,
                                    unsigned threads);

}  // namespace pulse::python
