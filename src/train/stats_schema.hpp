#pragma once
// The datasets of a pulse-train statistics file, declared once: pulse-train declares them from
// this list (new run and resume alike), pulse.torch's recorder reads it through the Python module,
// `pulse-train --print-schema` prints it as the README's table, and every file carries it in its
// "datasets" attribute (units and description per dataset) for readers such as pulse_analysis.
#include <cstdint>
#include <string>
#include <vector>

#include "io/stats_columns.hpp"
#include "io/stats_file.hpp"

namespace pulse {

// The types of a schema (io/stats_columns.hpp), by their names here.
using io::StatsColumn;
using io::StatsColumns;
using io::StatsColumnValues;
using io::StatsKind;
using io::columns_attribute;
using io::declare_statistics;
using io::stats_schema_markdown;

// Every dataset of the file, in declaration order.
const std::vector<StatsColumn>& train_stats_schema();
// The entry of `path`; throws pulse::Error for a path the schema lacks.
const StatsColumn& stats_column(const std::string& path);

// The shape as the README writes it: "(steps,)", "(steps, tensors)", "(steps, 4)", "(steps, ranks)".
std::string stats_shape(const StatsColumn& column);

// pulse-train's fixed columns (train_config.hpp's lists) with these tensor names.
StatsColumnValues train_column_values(std::vector<std::string> tensor_names);

// Declares every per-step and per-rank series of the schema (collective, as StatsFile::declare),
// with its column attribute. Arrays are written later, by write_stats_array.
void declare_train_statistics(io::StatsFile& file, const StatsColumnValues& values);

// Writes array `schema_path` (an /absorption/step_NNNNNN/... entry) at step t with the schema's
// units and description.
void write_stats_array(io::StatsFile& file, const std::string& schema_path, long long step,
                       const std::vector<std::int64_t>& data);
// `schema_path` with step_NNNNNN replaced by step t (zero-padded to six digits).
std::string stats_array_path(const std::string& schema_path, long long step);

// The README's dataset table (GitHub Markdown), one row per dataset.
std::string stats_schema_markdown();

}  // namespace pulse
