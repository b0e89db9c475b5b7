#pragma once
// The shape of a statistics file's schema: each dataset's path, type, kind (a row per step, a
// column per rank, or an array), what its columns are, units and description; and what every
// writer does with its list alike: declare it in a file, print it as the docs' table. The lists
// are the writers': pulse-train's src/train/stats_schema.hpp, pulse-measure's
// src/measure/stats_schema.hpp.
#include <functional>
#include <string>
#include <vector>

#include "io/stats_file.hpp"

namespace pulse::io {

// per_step: (steps,) or (steps, w), rank 0's values; per_rank: (steps, ranks); array: written
// once by write_array (the path's NNNNNN is the step).
enum class StatsKind { per_step, per_rank, array };

// What the columns of a (steps, w) series are, named by a dataset attribute.
enum class StatsColumns { none, tensors, grad_thresholds, adam_quantiles, k_values, log2_bins, tensor_kinds };

struct StatsColumn {
  std::string path;
  SeriesType type;
  StatsKind kind;
  StatsColumns columns;
  std::string units;
  std::string description;
};

// The column labels of a run: tensor names in table order, and the values of the fixed columns.
struct StatsColumnValues {
  std::vector<std::string> tensor_names, kind_names;
  std::vector<double> grad_thresholds, adam_quantiles, k_values;
};

// The dataset attribute that names the columns ("tensor_names", "thresholds", ...; "" for none).
std::string columns_attribute(StatsColumns columns);

// Declares every per-step and per-rank series of the schema (collective, as StatsFile::declare),
// with its column attribute. Arrays are written later.
void declare_statistics(StatsFile& file, const std::vector<StatsColumn>& schema, const StatsColumnValues& values);

// The schema as a GitHub Markdown table, one row per dataset, with the shape of each as `shape`
// writes it.
std::string stats_schema_markdown(const std::vector<StatsColumn>& schema,
                                  const std::function<std::string(const StatsColumn&)>& shape);

}  // namespace pulse::io
