#include "io/stats_columns.hpp"

#include "core/error.hpp"

namespace pulse::io {

std::string columns_attribute(StatsColumns columns) {
  switch (columns) {
    case StatsColumns::none: return "";
    case StatsColumns::tensors: return "tensor_names";
    case StatsColumns::grad_thresholds: return "thresholds";
    case StatsColumns::adam_quantiles: return "quantiles";
    case StatsColumns::k_values: return "k_values";
    case StatsColumns::log2_bins: return "k_range";
    case StatsColumns::tensor_kinds: return "kind_names";
  }
  return "";
}

void declare_statistics(StatsFile& file, const std::vector<StatsColumn>& schema, const StatsColumnValues& values) {
  for (const StatsColumn& c : schema) {
    if (c.kind == StatsKind::per_rank) file.declare_per_rank(c.path, c.type, c.units, c.description);
    if (c.kind != StatsKind::per_step) continue;
    const std::vector<double>* labels = nullptr;
    const std::vector<std::string>* names = nullptr;
    switch (c.columns) {
      case StatsColumns::none: break;
      case StatsColumns::tensors: names = &values.tensor_names; break;
      case StatsColumns::tensor_kinds: names = &values.kind_names; break;
      case StatsColumns::grad_thresholds: labels = &values.grad_thresholds; break;
      case StatsColumns::adam_quantiles: labels = &values.adam_quantiles; break;
      case StatsColumns::k_values: labels = &values.k_values; break;
      case StatsColumns::log2_bins: throw Error("statistics schema: " + c.path + " is a series with log2 bins");
    }
    if (names) {
      file.declare(c.path, c.type, int(names->size()), c.units, c.description);
      file.set_dataset_attribute(c.path, columns_attribute(c.columns), *names);
      continue;
    }
    file.declare(c.path, c.type, labels ? int(labels->size()) : 0, c.units, c.description);
    if (labels) file.set_dataset_attribute(c.path, columns_attribute(c.columns), *labels);
  }
}

std::string stats_schema_markdown(const std::vector<StatsColumn>& schema,
                                  const std::function<std::string(const StatsColumn&)>& shape) {
  std::string out = "| dataset | shape | type | units | what |\n|---|---|---|---|---|\n";
  auto escape = [](const std::string& s) {
    std::string e;
    for (const char ch : s) e += ch == '|' ? std::string("\\|") : std::string(1, ch);
    return e;
  };
  for (const StatsColumn& c : schema) {
    const std::string attribute = columns_attribute(c.columns);
    out += "| `" + c.path + "` | " + shape(c) + " | " + (c.type == SeriesType::int64 ? "int64" : "float64") +
           " | " + c.units + " | " + escape(c.description) +
           (attribute.empty() ? "" : " (attribute `" + attribute + "`)") + " |\n";
  }
  return out;
}

}  // namespace pulse::io
