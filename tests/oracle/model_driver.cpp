// Runs pulse's GPT for tests/oracle/test_model_torch.py: initialises the weights, writes them
// with the tensor table, then runs forward/backward and optionally AdamW steps on one batch.
//   model_driver DIR   reads DIR/config.json, DIR/tokens.i32, DIR/targets.i32 and writes
//     DIR/table.json    [{name, shape, offset, weight_decay}] in flat-buffer order
//     DIR/master.f32    the initial FP32 weights theta (the forward sees bf16(theta))
//     DIR/logits.f32, DIR/grads.f32   at the initial weights
//     DIR/out.json      {"losses": [...]}: the loss before each AdamW step and after the last
//   and, when config.json has "grpo", at the initial weights (inputs DIR/position_weights.f32,
//   DIR/mask.u8, DIR/log_ratio.f32, DIR/rewards.f32):
//     DIR/logprobs.f32        GPT::target_logprobs()
//     DIR/grads_weighted.f32  gradient of sum_i position_weights[i] * CE_i (GPT::backward(weights))
//     DIR/old_logprobs.f32    logprobs - log_ratio: the rollout's "generating policy", so the
//                             GRPO ratios are exp(log_ratio) up to rounding
//     DIR/grads_grpo.f32, DIR/grpo.json   grpo_backward's gradient and stats
#include <Kokkos_Core.hpp>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "kernels/adamw.hpp"
#include "kernels/host_copy.hpp"
#include "model/gpt.hpp"
#include "rl/grpo.hpp"
#include "raw_io.hpp"

using namespace pulse;

namespace {

void run_grpo(GPT& model, const nlohmann::json& cfg, const std::string& dir, const Kokkos::View<int*>& tokens,
              const Kokkos::View<int*>& targets) {
  const std::size_t n = std::size_t(model.batch()) * model.seq_len();
  model.forward(tokens, targets);
  const std::vector<float> logprobs = to_host(model.target_logprobs());
  oracle::write_raw(dir + "/logprobs.f32", logprobs);
  model.zero_grad();
  model.backward(to_device(oracle::read_raw<float>(dir + "/position_weights.f32", n)));
  oracle::write_raw(dir + "/grads_weighted.f32", to_host(model.grads()));

  RolloutBatch batch;
  batch.rows = model.batch(), batch.seq_len = model.seq_len(), batch.group_size = cfg["grpo"]["group_size"];
  batch.tokens = to_host(tokens);
  batch.targets = to_host(targets);
  batch.completion_mask = oracle::read_raw<std::uint8_t>(dir + "/mask.u8", n);
  const std::vector<float> log_ratio = oracle::read_raw<float>(dir + "/log_ratio.f32", n);
  batch.old_logprobs.resize(n);
  for (std::size_t i = 0; i < n; ++i) batch.old_logprobs[i] = batch.completion_mask[i] ? logprobs[i] - log_ratio[i] : 0;
  batch.rewards = oracle::read_raw<float>(dir + "/rewards.f32", batch.rows);
  oracle::write_raw(dir + "/old_logprobs.f32", batch.old_logprobs);
  const GrpoHyper hyper;
  const std::vector<float> adv = group_advantages(batch.rewards, batch.group_size, hyper.advantage_eps);
  model.zero_grad();
  const GrpoLossStats s = grpo_backward(model, batch, adv, hyper, cfg["grpo"]["token_normaliser"].get<double>());
  oracle::write_raw(dir + "/grads_grpo.f32", to_host(model.grads()));
  std::ofstream(dir + "/grpo.json") << nlohmann::json{{"loss", s.loss}, {"clip_fraction", s.clip_fraction},
                                                      {"mean_ratio", s.mean_ratio}, {"tokens", s.tokens},
                                                      {"advantages", adv}}
                                           .dump();
}

int run(const std::string& dir) {
  nlohmann::json cfg;
  std::ifstream(dir + "/config.json") >> cfg;
  GPTConfig mc;
  mc.vocab_size = cfg["vocab_size"];
  mc.max_seq_len = cfg["max_seq_len"];
  mc.num_layers = cfg["num_layers"];
  mc.num_heads = cfg["num_heads"];
  mc.channels = cfg["channels"];
  mc.tied_lm_head = cfg["tied_lm_head"];
  GPT model(mc, cfg["batch"], cfg["seq_len"]);
  const TensorTable& table = model.table();

  std::vector<float> init = gpt_init(mc, cfg["seed"]);
  if (cfg["perturb"]) {
    // GPT-2's init leaves biases at 0 and LayerNorm weights at 1, which would hide layout
    // mistakes in those tensors; give them random values.
    std::mt19937 rng(cfg["seed"].get<unsigned>() + 1);
    std::normal_distribution<float> noise(0.0f, 0.2f);
    for (const TensorInfo& t : table.tensors())
      if (!t.weight_decay)
        for (index_t i = t.offset; i < t.offset + t.numel; ++i) init[i] += noise(rng);
  }
  nlohmann::json tj = nlohmann::json::array();
  for (const TensorInfo& t : table.tensors())
    tj.push_back({{"name", t.name}, {"shape", t.shape}, {"offset", t.offset}, {"weight_decay", t.weight_decay}});
  std::ofstream(dir + "/table.json") << tj.dump(1);
  oracle::write_raw(dir + "/master.f32", init);

  const std::size_t n_ids = std::size_t(model.batch()) * model.seq_len();
  const Kokkos::View<int*> tokens = to_device(oracle::read_raw<int>(dir + "/tokens.i32", n_ids));
  const Kokkos::View<int*> targets = to_device(oracle::read_raw<int>(dir + "/targets.i32", n_ids));

  // Mixed-precision AdamW as in training: FP32 master, BF16 copy that the forward pass reads.
  const index_t n = table.num_elements();
  Kokkos::View<float*> master = to_device(init), m("m", n), v("v", n);
  Kokkos::View<bf16_bits*> weights("weights", n);
  cast_to_bf16(DefaultExec(), master, weights);
  const auto segs = make_segments(table.offsets());
  const auto decay_mask = to_device(table.weight_decay_mask());
  AdamWHyper hyper;
  hyper.lr = cfg["lr"];
  hyper.weight_decay = cfg["weight_decay"];
  const int steps = cfg["steps"];

  if (cfg.contains("grpo")) {
    model.set_weights(weights);
    run_grpo(model, cfg, dir, tokens, targets);
  }

  std::vector<float> losses;
  for (int step = 0; step <= steps; ++step) {
    model.set_weights(weights);
    losses.push_back(model.forward(tokens, targets));
    if (step == steps) break;
    model.zero_grad();
    model.backward();
    if (step == 0) {
      oracle::write_raw(dir + "/logits.f32", to_host(model.logits()));
      oracle::write_raw(dir + "/grads.f32", to_host(model.grads()));
    }
    adamw_mixed(DefaultExec(), segs, decay_mask, adamw_scalars(hyper, step + 1, 1.0f, Precision::mixed), master,
                model.grads(), m, v, weights, false);
  }
  std::ofstream(dir + "/out.json") << nlohmann::json{{"losses", losses}}.dump();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  if (argc != 2) {
    std::cerr << "usage: model_driver DIR\n";
    return 2;
  }
  try {
    return run(argv[1]);
  } catch (const std::exception& e) {
    std::cerr << "model_driver: " << e.what() << "\n";
    return 1;
  }
}
