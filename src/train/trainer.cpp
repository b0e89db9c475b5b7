#include "train/trainer.hpp"

#include <algorithm>
#include <string>

#include "comm/collectives.hpp"
#include "kernels/host_copy.hpp"

namespace pulse {

namespace {

loco::OuterHyper outer_hyper(const TrainConfig& c) {
  loco::OuterHyper h;
  h.lr = c.outer_lr, h.momentum = c.outer_momentum;
  return h;
}

}  // namespace

Trainer::Trainer(const TrainConfig& c, const Communicator& trainers, const GPTConfig& config,
                 const TensorTable& table, int rows, int seq_len, const std::vector<float>& initial,
                 const RankCheckpoint* resumed)
    : c_(c), trainers_(trainers), rows_(rows) {
  model_ = std::make_unique<GPT>(config, rows, seq_len);
  // Score at the temperature the rollouts were drawn at (greedy rollouts record temperature 1).
  if (c_.temperature > 0) model_->set_temperature(static_cast<float>(c_.temperature));
  params_ = std::make_unique<ParameterStore>(table, c_.precision, initial, trainers_.rank() == 0);
  if (c_.trainer_sync != loco::TrainerSync::ddp) {
    // Resumed: the outer state restarts from the checkpoint's global weights (its buffers follow in load()).
    Kokkos::View<const float*> theta = params_->master();
    if (resumed) theta = to_device(resumed->get<float>("outer.theta_global", table.num_elements()));
    outer_ = std::make_unique<loco::OuterSync>(c_.trainer_sync, trainers_, theta, outer_hyper(c_), c_.sparse_exchange,
                                               c_.dense_threshold);
  }
  if (resumed) load(*resumed);
}

TrainStepResult Trainer::step(std::int64_t t, bool keep_master_before, TransferCounter& copies) {
  TrainStepResult r;
  const int num_trainers = trainers_.size();
  const bool first = trainers_.rank() == 0;
  const std::vector<float> adv = group_advantages(batch_.rewards, c_.group_size, GrpoHyper{}.advantage_eps);
  std::int64_t local_tokens = 0;
  for (const auto m : batch_.completion_mask) local_tokens += m;
  Kokkos::Timer timer;
  const bool ddp = c_.trainer_sync == loco::TrainerSync::ddp;
  r.tokens = allreduce_value(trainers_, local_tokens, ReduceOp::sum);
  double reward_sum = 0;
  for (const float x : batch_.rewards) reward_sum += x;
  r.reward = allreduce_value(trainers_, reward_sum, ReduceOp::sum) / (double(rows_) * num_trainers);
  r.comm_s += timer.seconds();
  GrpoHyper hyper;
  hyper.clip_low = c_.clip_low, hyper.clip_high = c_.clip_high;
  model_->set_weights(params_->weights());
  model_->zero_grad();
  // DDP: the loss is the mean over every trainer's tokens, so the summed gradients are its
  // gradient. DiLoCo/PULSELoCo: each trainer optimises its own batch's mean.
  const double normaliser = double(std::max<std::int64_t>(ddp ? r.tokens : local_tokens, 1));
  r.grpo = grpo_backward(*model_, batch_, adv, hyper, normaliser);
  copies.uploaded(batch_.tokens.size() * sizeof(int) * 2 + batch_.completion_mask.size() +
                  (batch_.old_logprobs.size() + adv.size()) * sizeof(float));
  timer.reset();
  if (ddp) allreduce(trainers_, model_->grads(), ReduceOp::sum, Channel::gradients);
  r.loss = allreduce_value(trainers_, r.grpo.loss, ReduceOp::sum) / (ddp ? 1.0 : num_trainers);
  r.comm_s += timer.seconds();

  AdamWHyper h;
  h.lr = r.lr = c_.warmup_steps > 0 && t <= c_.warmup_steps ? c_.lr * double(t) / c_.warmup_steps : c_.lr;
  h.weight_decay = c_.weight_decay;  // betas and eps: AdamWHyper's defaults
  if (keep_master_before) {
    r.master_before = Kokkos::View<float*>("master_before", params_->weights().extent(0));
    Kokkos::deep_copy(r.master_before, params_->master());
  }
  // Trainer 0 has AdamW list what it changed, unless an outer step changes the weights again.
  r.outer_step = outer_ && t % c_.inner_steps == 0;
  r.listed = first && !r.outer_step;
  r.grad_norm = params_->step(t, model_->grads(), h, c_.grad_clip, r.listed);
  // DiLoCo/PULSELoCo: every H steps the trainers agree on new global weights and restart there.
  if (r.outer_step) {
    r.outer = outer_->outer_step(params_->master());
    params_->weights_from_master();
    r.comm_s += r.outer.comm_seconds;
  }
  return r;
}

void Trainer::save(RankCheckpoint& state) {
  for_each_state_buffer([&](const std::string& name, const auto& view) {
    using T = typename std::decay_t<decltype(view)>::non_const_value_type;
    state.add(name, std::is_same_v<T, float> ? io::DType::F32 : io::DType::BF16, to_host(view));
  });
  if (outer_) state.metadata["outer_steps"] = std::to_string(outer_->outer_steps());
  // No batch before the first step (a checkpoint of the initial state): stored empty.
  state.add("rollouts", io::DType::U8, batch_.rows ? batch_.serialize() : std::vector<std::uint8_t>{});
}

void Trainer::load(const RankCheckpoint& state) {
  const index_t n = params_->weights().extent(0);
  if (outer_) outer_->set_outer_steps(std::stoll(state.meta("outer_steps")));
  for_each_state_buffer([&](const std::string& name, const auto& view) {
    using View = std::decay_t<decltype(view)>;
    if constexpr (!std::is_const_v<typename View::value_type>)
      Kokkos::deep_copy(view, to_device(state.get<typename View::value_type>(name, n)));
  });
  const auto bytes = state.get<std::uint8_t>("rollouts");
  batch_ = bytes.empty() ? RolloutBatch{} : RolloutBatch::deserialize(bytes.data(), bytes.size());
}

}  // namespace pulse
