#include "train/stats_schema.hpp"

#include <cstdio>

#include "core/error.hpp"
#include "train/measured_points.hpp"

namespace pulse {

namespace {

using io::SeriesType;
constexpr auto f64 = SeriesType::float64;
constexpr auto i64 = SeriesType::int64;
constexpr auto step = StatsKind::per_step;
constexpr auto rank = StatsKind::per_rank;
constexpr auto array = StatsKind::array;
constexpr auto one = StatsColumns::none;

std::vector<StatsColumn> make_schema() {
  return {
      // per-step scalars, float64
      {"/steps/time_s", f64, step, one, "s", "wall time since the run (or the resumed run) started"},
      {"/steps/lr", f64, step, one, "1", "AdamW learning rate of the step"},
      {"/steps/loss", f64, step, one, "1", "GRPO (DAPO token-level) loss, mean over completion tokens"},
      {"/steps/reward", f64, step, one, "1", "mean reward of the rollouts the step trained on"},
      {"/steps/sparsity", f64, step, one, "1", "fraction of BF16 weights whose bits did not change in this step"},
      {"/steps/grad_norm", f64, step, one, "1", "global gradient norm before clipping"},
      {"/steps/clip_fraction", f64, step, one, "1", "fraction of completion tokens whose ratio was clipped"},
      {"/steps/mean_ratio", f64, step, one, "1", "mean importance ratio pi/pi_old over completion tokens"},
      {"/steps/encode_s", f64, step, one, "s", "patch encode time on trainer 0"},
      {"/steps/apply_s", f64, step, one, "s",
       "patch apply time with the check of the target digest, slowest inference rank"},
      {"/steps/step_s", f64, step, one, "s", "wall time of the step"},
      {"/steps/measure_s", f64, step, one, "s",
       "sparsity, gradient and Adam statistics time on trainer 0 (once the step's patch is sent, while the inference "
       "ranks apply it)"},
      {"/steps/sync_s", f64, step, one, "s",
       "PULSESync time on trainer 0 outside collective calls (the step's change set, encode, its own copy's update; "
       "the patch's send and the waits for the other ranks are in /ranks/wait_s)"},
      {"/steps/write_s", f64, step, one, "s",
       "time the previous step's statistics append took once every rank was there (gather to rank 0, flush when "
       "due; on rank 0, which holds the file)"},
      {"/steps/eval_pass1", f64, step, one, "1", "greedy pass@1 on held-out problems (NaN when not evaluated)"},
      {"/steps/gate_density", f64, step, one, "1",
       "diloco/pulseloco outer steps: fraction of entries trainer 0 sent (NaN on inner steps)"},
      {"/steps/outer_s", f64, step, one, "s", "diloco/pulseloco: outer step time on trainer 0 (NaN on inner steps)"},
      // per-step scalars, int64
      {"/steps/step", i64, step, one, "1", "optimizer step (1-based); row i holds step i + 1"},
      {"/steps/tokens", i64, step, one, "tokens", "completion tokens trained on in the step"},
      {"/steps/changed", i64, step, one, "elements", "BF16 weights whose bits changed in this step"},
      {"/steps/patch_bytes", i64, step, one, "bytes", "coded PULSESync patch sent to the inference ranks"},
      {"/steps/patch_raw_bytes", i64, step, one, "bytes", "the patch's index and value streams before compression"},
      {"/steps/dense_bytes", i64, step, one, "bytes", "the BF16 weights sent densely"},
      {"/steps/policy_version", i64, step, one, "1", "weights version after the step"},
      {"/steps/rollout_version", i64, step, one, "1", "weights version that generated the rollouts of the step"},
      {"/steps/outer_step", i64, step, one, "1",
       "1 when the trainers synchronised (every step for ddp, every H for diloco/pulseloco)"},
      {"/steps/d2h_bytes", i64, step, one, "bytes",
       "device-to-host bytes trainer 0 copied in the step (what a device build moves, also counted on host builds)"},
      {"/steps/h2d_bytes", i64, step, one, "bytes",
       "host-to-device bytes trainer 0 copied in the step, its rollout batch included (counted as d2h_bytes)"},
      // per-step rows of several columns
      {"/steps/tensor_changed", i64, step, StatsColumns::tensors, "elements",
       "BF16 weights whose bits changed, per tensor (columns in tensor_names order)"},
      {"/steps/grad_sparsity", f64, step, StatsColumns::grad_thresholds, "1",
       "fraction of gradient entries with |g| <= threshold (columns: thresholds)"},
      {"/steps/adam_ratio", f64, step, StatsColumns::adam_quantiles, "1",
       "quantiles of |m_hat|/(sqrt(v_hat)+eps) after the step (columns: quantiles)"},
      {"/kstep/sparsity", f64, step, StatsColumns::k_values, "1",
       "fraction of BF16 weights equal to the version k steps back (NaN before step k)"},
      // per rank
      {"/ranks/bytes_sent", i64, rank, one, "bytes", "bytes this rank sent to other ranks in the step"},
      {"/ranks/bytes_recv", i64, rank, one, "bytes", "bytes this rank received from other ranks in the step"},
      {"/ranks/patch_bytes_recv", i64, rank, one, "bytes", "PULSESync patch bytes received in the step"},
      {"/ranks/trainer_bytes_sent", i64, rank, one, "bytes",
       "trainer-to-trainer bytes (gradients or pseudo-gradients) this rank sent to the other trainers in the step"},
      {"/ranks/trainer_bytes_recv", i64, rank, one, "bytes",
       "trainer-to-trainer bytes (gradients or pseudo-gradients) this rank received from the other trainers in the step"},
      {"/ranks/comm_s", f64, rank, one, "s", "seconds in MPI collectives in the step"},
      {"/ranks/compute_s", f64, rank, one, "s", "seconds outside MPI collectives in the step"},
      {"/ranks/cpu_s", f64, rank, one, "s", "CPU seconds of the rank's process in the step, all its threads"},
      {"/ranks/wait_s", f64, rank, one, "s",
       "seconds in pulse's collective calls in the step, waiting for the other ranks included"},
      {"/ranks/wait_cpu_s", f64, rank, one, "s",
       "CPU seconds the rank spent in those calls: near wait_s when MPI spins, near 0 when the wait sleeps"},
      {"/ranks/weights_digest", i64, rank, one, "1",
       "first 8 bytes of the xxh3-128 state digest of the BF16 weights the rank holds after the step "
       "(trainer 0 and inference ranks; 0 on the other trainers, which hash nothing)"},
      {"/ranks/version", i64, rank, one, "1", "weights version the rank holds after the step"},
      // arrays of an absorption step
      {"/absorption/step_NNNNNN/ratio_counts", i64, array, StatsColumns::log2_bins, "elements",
       "histogram of |u|/half_ulp(bf16(w)) in bins [2^k, 2^(k+1)) for k in [k_min, k_max), then "
       "zero, below, above, non-finite"},
      {"/absorption/step_NNNNNN/weight_counts", i64, array, StatsColumns::log2_bins, "elements",
       "histogram of |w| in bins [2^k, 2^(k+1)) for k in [k_min, k_max), then zero, below, above, non-finite"},
      {"/absorption/step_NNNNNN/absorbed", i64, array, one, "elements",
       "updates smaller than half a BF16 ulp of their weight (absorbed by the rounding)"},
  };
}

const char* const step_placeholder = "step_NNNNNN";

}  // namespace

const std::vector<StatsColumn>& train_stats_schema() {
  static const std::vector<StatsColumn> schema = make_schema();
  return schema;
}

const StatsColumn& stats_column(const std::string& path) {
  for (const StatsColumn& c : train_stats_schema())
    if (c.path == path) return c;
  throw Error("statistics schema: no dataset " + path);
}

std::string stats_shape(const StatsColumn& column) {
  if (column.kind == StatsKind::per_rank) return "(steps, ranks)";
  if (column.kind == StatsKind::array) return column.columns == StatsColumns::log2_bins ? "(bins+4,)" : "(1,)";
  switch (column.columns) {
    case StatsColumns::none: return "(steps,)";
    case StatsColumns::tensors: return "(steps, tensors)";
    case StatsColumns::grad_thresholds: return "(steps, " + std::to_string(grad_thresholds.size()) + ")";
    case StatsColumns::adam_quantiles: return "(steps, " + std::to_string(adam_quantiles.size()) + ")";
    case StatsColumns::k_values: return "(steps, " + std::to_string(kstep_values.size()) + ")";
    case StatsColumns::tensor_kinds: return "(steps, kinds)";
    case StatsColumns::log2_bins: break;
  }
  return "(steps, bins)";
}

StatsColumnValues train_column_values(std::vector<std::string> tensor_names) {
  StatsColumnValues v;
  v.tensor_names = std::move(tensor_names);
  v.grad_thresholds.assign(grad_thresholds.begin(), grad_thresholds.end());
  v.adam_quantiles = adam_quantiles;
  v.k_values.assign(kstep_values.begin(), kstep_values.end());
  return v;
}

void declare_train_statistics(io::StatsFile& file, const StatsColumnValues& values) {
  declare_statistics(file, train_stats_schema(), values);
}

std::string stats_array_path(const std::string& schema_path, long long step) {
  const auto at = schema_path.find(step_placeholder);
  PULSE_CHECK(at != std::string::npos, "statistics schema: " + schema_path + " is not a per-step array");
  char name[32];
  std::snprintf(name, sizeof(name), "step_%06lld", step);
  return schema_path.substr(0, at) + name + schema_path.substr(at + std::string(step_placeholder).size());
}

void write_stats_array(io::StatsFile& file, const std::string& schema_path, long long step,
                       const std::vector<std::int64_t>& data) {
  const StatsColumn& c = stats_column(schema_path);
  PULSE_CHECK(c.kind == StatsKind::array && c.type == io::SeriesType::int64,
              "statistics schema: " + schema_path + " is not an int64 array");
  file.write_array(stats_array_path(schema_path, step), data, {std::int64_t(data.size())}, c.units, c.description);
}

std::string stats_schema_markdown() { return stats_schema_markdown(train_stats_schema(), stats_shape); }

}  // namespace pulse
