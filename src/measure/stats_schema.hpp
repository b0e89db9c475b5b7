#pragma once
// The datasets of a pulse-measure statistics file, declared once (as pulse-train's are:
// src/train/stats_schema.hpp; both in io/stats_columns.hpp's terms): pulse-measure declares them
// from this list, and `pulse-measure --print-schema` prints it as docs/pulse-measure.md's table,
// which a test holds equal. A subset of pulse-train's paths with the same meanings, plus what
// only checkpoints give (/steps/steps_apart, /kinds, the reading ranks' /ranks columns).
#include <string>
#include <vector>

#include "io/stats_columns.hpp"

namespace pulse::measure {

// Every dataset, in declaration order.
const std::vector<io::StatsColumn>& measure_stats_schema();

// The shape as the docs write it: "(steps,)", "(steps, tensors)", "(steps, k values)", ...
std::string measure_stats_shape(const io::StatsColumn& column);

// docs/pulse-measure.md's dataset table (GitHub Markdown), one row per dataset.
std::string measure_schema_markdown();

}  // namespace pulse::measure
