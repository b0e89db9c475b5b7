#pragma once
// The points every pulse-train run measures at, apart from its settings so that the statistics
// schema (stats_schema, which the Kokkos-free Python module links) needs no trainer modes.
#include <vector>

namespace pulse {

// k-step distances, gradient thresholds and Adam-ratio quantiles.
inline const std::vector<int> kstep_values = {1, 2, 4, 8, 16, 32};
inline const std::vector<float> grad_thresholds = {0.0f, 1e-10f, 1e-8f, 1e-6f};
inline const std::vector<double> adam_quantiles = {0.5, 0.9, 0.99, 0.999};

}  // namespace pulse
