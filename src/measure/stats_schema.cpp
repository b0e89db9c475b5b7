#include "measure/stats_schema.hpp"

namespace pulse::measure {

namespace {

using io::SeriesType;
using io::StatsColumn;
using io::StatsColumns;
using io::StatsKind;
constexpr auto f64 = SeriesType::float64;
constexpr auto i64 = SeriesType::int64;
constexpr auto step = StatsKind::per_step;
constexpr auto rank = StatsKind::per_rank;
constexpr auto one = StatsColumns::none;

std::vector<StatsColumn> make_schema() {
  return {
      {"/steps/step", i64, step, one, "1", "step of the checkpoint the row measures"},
      {"/steps/steps_apart", i64, step, one, "steps", "steps between this checkpoint and the previous one"},
      {"/steps/changed", i64, step, one, "elements",
       "BF16/F16/F32 weights whose bits (as compared: root attribute compared_as) changed since the previous "
       "checkpoint"},
      {"/steps/sparsity", f64, step, one, "1",
       "fraction of BF16/F16/F32 weights whose bits did not change since the previous checkpoint"},
      {"/steps/tensor_changed", i64, step, StatsColumns::tensors, "elements",
       "weights whose bits changed, per tensor (columns in tensor_names order)"},
      {"/steps/patch_bytes", i64, step, one, "bytes",
       "PULSESync patch from the previous checkpoint: sum of one patch per unit (root attribute unit_bytes)"},
      {"/steps/dense_bytes", i64, step, one, "bytes", "the measured tensors' bytes (as compared) sent densely"},
      {"/steps/bits_per_changed", f64, step, one, "bits", "8 patch_bytes / changed (NaN if none changed)"},
      {"/steps/encode_s", f64, step, one, "s",
       "time to size the patches (index and value streams coded and compressed), summed over a rank's threads, "
       "slowest rank"},
      {"/steps/measure_s", f64, step, one, "s",
       "time to read and measure the checkpoint (an equal share of its batch's: checkpoints are measured in batches), "
       "slowest rank"},
      {"/kstep/sparsity", f64, step, StatsColumns::k_values, "1",
       "fraction of weights equal to the checkpoint k steps back (NaN when no checkpoint has that step)"},
      {"/kinds/changed", i64, step, StatsColumns::tensor_kinds, "elements",
       "changed weights per tensor kind (columns: kind_names)"},
      {"/kinds/sparsity", f64, step, StatsColumns::tensor_kinds, "1",
       "sparsity per tensor kind, NaN for a kind without tensors (columns: kind_names)"},
      {"/ranks/read_bytes", i64, rank, one, "bytes", "checkpoint bytes this rank read for the row"},
      {"/ranks/measure_s", f64, rank, one, "s", "seconds this rank spent on the row (an equal share of its batch's)"},
      {"/ranks/cpu_s", f64, rank, one, "s",
       "CPU seconds (user + system) this rank spent on the row (an equal share of its batch's)"},
      {"/ranks/max_rss_bytes", i64, rank, one, "bytes", "peak resident memory of the rank so far"},
  };
}

}  // namespace

const std::vector<StatsColumn>& measure_stats_schema() {
  static const std::vector<StatsColumn> schema = make_schema();
  return schema;
}

std::string measure_stats_shape(const io::StatsColumn& column) {
  if (column.kind == io::StatsKind::per_rank) return "(steps, ranks)";
  switch (column.columns) {
    case io::StatsColumns::tensors: return "(steps, tensors)";
    case io::StatsColumns::tensor_kinds: return "(steps, kinds)";
    case io::StatsColumns::k_values: return "(steps, k values)";  // k = 1, 2, 4, ... up to --max-k
    default: return "(steps,)";
  }
}

std::string measure_schema_markdown() { return io::stats_schema_markdown(measure_stats_schema(), measure_stats_shape); }

}  // namespace pulse::measure
