#include "rl/sft_trainer.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.hpp"
#include "core/version.hpp"
#include "io/safetensors.hpp"
#include "kernels/adamw.hpp"
#include "kernels/bf16.hpp"
#include "kernels/grad_norm.hpp"
#include "kernels/host_copy.hpp"

namespace pulse {

namespace {

// Checks everything the constructor needs before any allocation; returns T, the inputs (and
// targets) of the longest "a+b=c$".
int checked_seq_len(const GPTConfig& config, const SftOptions& o) {
  PULSE_CHECK(o.digits >= 1 && o.digits <= 18, "SFT digits must be in 1..18, got " + std::to_string(o.digits));
  PULSE_CHECK(o.batch >= 1, "SFT batch must be positive, got " + std::to_string(o.batch));
  PULSE_CHECK(o.steps >= 1, "SFT steps must be positive, got " + std::to_string(o.steps));
  PULSE_CHECK(o.warmup >= 1, "SFT warmup must be positive, got " + std::to_string(o.warmup));
  PULSE_CHECK(o.lr > 0 && o.weight_decay >= 0, "SFT lr must be positive and weight decay non-negative");
  const int vocab = arithmetic_tokenizer().vocab_size();
  PULSE_CHECK(config.vocab_size == vocab, "SFT needs vocab_size " + std::to_string(vocab) +
                                              " (the arithmetic tokenizer's), the config has " +
                                              std::to_string(config.vocab_size));
  const int T = AdditionTask(o.digits, 0).max_text_length() - 1;
  PULSE_CHECK(T <= config.max_seq_len, std::to_string(o.digits) + "-digit addition needs sequences of " +
                                           std::to_string(T) + " tokens; the model takes at most " +
                                           std::to_string(config.max_seq_len));
  return T;
}

SftOptions effective(SftOptions o) {
  o.warmup = std::min(o.warmup, std::max(1, o.steps / 10));  // pulse-sft's rule, kept for short runs
  return o;
}

}  // namespace

double sft_learning_rate(const SftOptions& o, int step) {
  if (step <= o.warmup) return o.lr * step / o.warmup;
  const double progress = double(step - o.warmup) / std::max(1, o.steps - o.warmup);
  return o.lr * (0.1 + 0.9 * 0.5 * (1.0 + std::cos(3.141592653589793 * std::min(1.0, progress))));
}

void encode_sft_row(const CharTokenizer& tok, const AdditionTask& task, const AdditionProblem& p, bool answer_only,
                    int T, int* tokens, int* targets, float* in_loss) {
  std::vector<int> ids = tok.encode(task.solution_text(p));
  ids.resize(T + 1, tok.eos());
  // Target t predicts character t+1: the answer starts at the target of the '=' (prompt end - 1).
  const int first = static_cast<int>(p.prompt.size()) - 1, last = first + static_cast<int>(p.answer.size());
  for (int t = 0; t < T; ++t) {
    tokens[t] = ids[t], targets[t] = ids[t + 1];
    in_loss[t] = !answer_only || (t >= first && t <= last) ? 1.0f : 0.0f;
  }
}

std::vector<float> mean_loss_weights(std::vector<float> in_loss) {
  double count = 0;
  for (float x : in_loss) count += x;
  for (float& x : in_loss) x = static_cast<float>(x / count);
  return in_loss;
}

double weighted_loss(const GPT& model, const std::vector<float>& weights) {
  const std::vector<float> logprobs = to_host(model.target_logprobs());
  double loss = 0;
  for (std::size_t i = 0; i < logprobs.size(); ++i) loss -= double(weights[i]) * logprobs[i];
  return loss;
}

SftTrainer::SftTrainer(const GPTConfig& config, const SftOptions& options,
                       const std::set<std::pair<std::int64_t, std::int64_t>>& held_out)
    : options_(effective(options)),
      tok_(arithmetic_tokenizer()),
      task_(options.digits, options.seed),
      held_out_(held_out),
      // Rejection sampling against a set covering more than a quarter of the space would
      // slow down and skew the training distribution; such a set is not excluded.
      exclude_(4.0 * held_out.size() <= std::pow(10.0, 2 * options.digits)),
      model_(config, options.batch, checked_seq_len(config, options)),
      segs_(make_segments(model_.table().offsets())),
      decay_mask_(to_device(model_.table().weight_decay_mask())),
      master_(to_device(gpt_init(config, options.seed), "master")),
      m_("adam_m", model_.num_parameters()),
      v_("adam_v", model_.num_parameters()),
      weights_("weights_bf16", model_.num_parameters()) {
  cast_to_bf16(DefaultExec(), master_, weights_);
  const std::size_t cells = std::size_t(options_.batch) * model_.seq_len();
  tokens_h_.resize(cells), targets_h_.resize(cells), in_loss_h_.resize(cells);
}

double SftTrainer::step() {
  const int B = options_.batch, T = model_.seq_len(), t = steps_done_ + 1;
  // A batch of "a+b=c$" rows, padded with '$'.
  batch_problems_.clear();
  for (int b = 0; b < B; ++b) {
    AdditionProblem p = task_.sample();
    while (exclude_ && held_out_.count({p.a, p.b})) p = task_.sample();
    encode_sft_row(tok_, task_, p, options_.answer_only, T, &tokens_h_[std::size_t(b) * T],
                   &targets_h_[std::size_t(b) * T], &in_loss_h_[std::size_t(b) * T]);
    batch_problems_.push_back(std::move(p));
  }

  // Forward on bf16(master), backward, clip to norm 1, mixed-precision AdamW.
  model_.set_weights(weights_);
  const std::vector<float> loss_weights = mean_loss_weights(in_loss_h_);
  model_.forward(to_device(tokens_h_), to_device(targets_h_));
  const double loss = weighted_loss(model_, loss_weights);
  model_.zero_grad();
  model_.backward(to_device(loss_weights));
  const GradNorm norm = grad_norm(DefaultExec(), segs_, model_.grads(), Precision::mixed);
  const float clip = clip_coefficient(norm.total, 1.0, Precision::mixed);
  PULSE_CHECK(std::isfinite(loss) && std::isfinite(clip),
              "training diverged at step " + std::to_string(t) + " (loss " + std::to_string(loss) + ")");
  AdamWHyper hyper;
  hyper.beta2 = 0.95;
  hyper.weight_decay = options_.weight_decay;
  hyper.lr = sft_learning_rate(options_, t);
  const AdamWScalars s = adamw_scalars(hyper, t, clip, Precision::mixed);
  adamw_mixed(DefaultExec(), segs_, decay_mask_, s, master_, model_.grads(), m_, v_, weights_, false);
  steps_done_ = t;
  return loss;
}

void write_sft_checkpoint(const std::string& path, const SftTrainer& trainer, const std::string& model_name) {
  const GPTConfig& config = trainer.config();
  const std::vector<bf16_bits> weights_h = to_host(trainer.weights());
  std::vector<io::TensorToWrite> tensors;
  for (const TensorInfo& t : trainer.table().tensors())
    tensors.push_back({t.name, io::DType::BF16, std::vector<std::int64_t>(t.shape.begin(), t.shape.end()),
                       weights_h.data() + t.offset, std::size_t(t.numel) * sizeof(bf16_bits)});
  // The alphabet in id order, so a reader can rebuild the tokenizer.
  const CharTokenizer tok = arithmetic_tokenizer();
  std::vector<int> ids(tok.vocab_size());
  for (int i = 0; i < tok.vocab_size(); ++i) ids[i] = i;
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"program", "pulse-sft"}, {"version", version_string()}, {"model", model_name},
      {"vocab_size", std::to_string(config.vocab_size)}, {"max_seq_len", std::to_string(config.max_seq_len)},
      {"num_layers", std::to_string(config.num_layers)}, {"num_heads", std::to_string(config.num_heads)},
      {"channels", std::to_string(config.channels)}, {"tied_lm_head", config.tied_lm_head ? "true" : "false"},
      {"alphabet", tok.decode(ids)}, {"digits", std::to_string(trainer.options().digits)},
      {"steps", std::to_string(trainer.steps_done())}};
  io::write_safetensors(path, tensors, metadata);  // atomic: temporary file, fsync, rename
}

}  // namespace pulse
