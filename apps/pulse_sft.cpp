// pulse-sft: supervised fine-tuning from scratch on the addition task. The GPT learns to
// continue "a+b=" with "c$" from complete "a+b=c$" sequences, then greedy decoding on held-out
// problems (GPTDecoder, KV cache) measures pass@1. --loss answer (the default) is the mean cross
// entropy over the answer tokens and their eos only, through GPT::backward(position weights):
// the operands are random and the padding is trivial, so they would only dilute the signal;
// --loss all weighs every position equally, operands and padding included. The training itself
// is SftTrainer (src/rl/sft_trainer.hpp), which pulse-train shares as its warm start.
//   pulse-sft --out runs/sft [--model tiny --digits 2 --steps 3000 --batch 32 --lr 1e-3 --loss answer ...]
#include <CLI/CLI.hpp>
#include <Kokkos_Core.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "cli/conventions.hpp"
#include "cli/json_summary.hpp"
#include "cli/unsigned_option.hpp"
#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "core/version.hpp"
#include "kernels/host_copy.hpp"
#include "model/gpt.hpp"
#include "model/gpt_decoder.hpp"
#include "rl/rollout.hpp"
#include "rl/sft_trainer.hpp"
#include "rl/task.hpp"
#include "rl/tokenizer.hpp"

using namespace pulse;

namespace {

struct Options {
  std::string model = "tiny";
  int steps = 3000;
  int batch = 32;
  double lr = 1e-3;
  int warmup = 100;  // linear warm-up steps, then cosine decay to lr/10 at --steps
  double weight_decay = 0.1;
  std::uint64_t seed = 1;
  int digits = 2;
  int eval_every = 250;
  int eval_problems = 200;
  std::string out = "runs/sft";
  double time_limit_s = 0;  // 0: no limit
  std::string loss = "answer";  // answer | all
};

// A different stream of problems than training's, from the same generator.
constexpr std::uint64_t eval_seed_offset = 0x9E3779B97F4A7C15ull;
constexpr int eval_chunk = 256;  // rows per greedy-decoding forward

struct EvalResult {
  double loss;    // teacher-forced cross entropy on the held-out problems, weighted as in training
  double pass1;   // fraction answered exactly by greedy decoding
  std::string example;  // the first problem's completion
};

EvalResult evaluate(GPT& model, GPTDecoder& decoder, const CharTokenizer& tok, const AdditionTask& task,
                    const std::vector<AdditionProblem>& problems, bool answer_only, int max_new_tokens) {
  const int B = model.batch(), T = model.seq_len();
  std::vector<int> tokens_h(std::size_t(B) * T), targets_h(tokens_h.size());
  std::vector<float> in_loss(tokens_h.size());
  double loss_sum = 0;
  for (std::size_t first = 0; first < problems.size(); first += B) {
    const int rows = static_cast<int>(std::min<std::size_t>(B, problems.size() - first));
    // Rows past the end repeat the last problem (so a partial last chunk weighs that problem a
    // little more; exact when --eval-problems <= eval_chunk).
    for (int b = 0; b < B; ++b)
      encode_sft_row(tok, task, problems[first + std::min(b, rows - 1)], answer_only, T, &tokens_h[std::size_t(b) * T],
                 &targets_h[std::size_t(b) * T], &in_loss[std::size_t(b) * T]);
    model.forward(to_device(tokens_h), to_device(targets_h));
    loss_sum += weighted_loss(model, mean_loss_weights(in_loss)) * rows;
  }
  SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = max_new_tokens;
  const RolloutBatch out = sample_rollouts(decoder, tok, task, problems, 1, T, greedy);
  double solved = 0;
  for (float r : out.rewards) solved += r;
  return {loss_sum / problems.size(), solved / problems.size(), problems[0].prompt + completion_text(out, tok, 0)};
}

int run(Options opt, cli::JsonSummary& summary) {
  // Every check before any work, each a one-line error.
  GPTConfig config = gpt_preset(opt.model);
  const CharTokenizer tok = arithmetic_tokenizer();
  config.vocab_size = tok.vocab_size();  // the 13 characters of the task, not the preset's 256
  AdditionTask eval_task(opt.digits, opt.seed + eval_seed_offset);
  const int T = eval_task.max_text_length() - 1;  // inputs and targets of the longest "a+b=c$"
  PULSE_CHECK(T <= config.max_seq_len, "--digits " + std::to_string(opt.digits) + " needs sequences of " +
                                           std::to_string(T) + " tokens; --model " + opt.model + " takes at most " +
                                           std::to_string(config.max_seq_len));
  std::error_code ec;
  std::filesystem::create_directories(opt.out, ec);
  PULSE_CHECK(!ec && std::filesystem::is_directory(opt.out), "cannot create output folder '" + opt.out + "'");

  // Held-out problems; training skips them when the problem space is large enough to spare them.
  std::vector<AdditionProblem> eval_problems;
  std::set<std::pair<std::int64_t, std::int64_t>> held_out;
  for (int i = 0; i < opt.eval_problems; ++i) {
    eval_problems.push_back(eval_task.sample());
    held_out.insert({eval_problems.back().a, eval_problems.back().b});
  }

  const bool answer_only = opt.loss == "answer";
  SftOptions sft;
  sft.digits = opt.digits, sft.batch = opt.batch, sft.lr = opt.lr, sft.warmup = opt.warmup, sft.steps = opt.steps;
  sft.weight_decay = opt.weight_decay, sft.answer_only = answer_only, sft.seed = opt.seed;
  SftTrainer trainer(config, sft, held_out);
  GPT eval_model(config, std::min(opt.eval_problems, eval_chunk), T);
  GPTDecoder eval_decoder(config, std::min(opt.eval_problems, eval_chunk), T);
  const index_t n = trainer.table().num_elements();
  const bool disjoint = trainer.excludes_held_out();

  std::printf("pulse-sft: %s (%lld parameters, vocab %d), %d-digit addition, T %d, batch %d, lr %g, %d steps%s\n",
              opt.model.c_str(), static_cast<long long>(n), config.vocab_size, opt.digits, T, opt.batch, opt.lr,
              opt.steps, disjoint ? "" : " (eval problems not excluded from training: the space is too small)");
  std::printf("%6s %10s %10s %8s %8s  %s\n", "step", "train_loss", "eval_loss", "pass@1", "seconds", "example");
  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  nlohmann::json curve = nlohmann::json::array();
  double loss_sum = 0;
  int loss_count = 0, step = 0;
  auto eval_and_log = [&] {
    eval_model.set_weights(trainer.weights());
    eval_decoder.set_weights(trainer.weights());
    const EvalResult e =
        evaluate(eval_model, eval_decoder, tok, eval_task, eval_problems, answer_only, opt.digits + 2);
    const double train_loss = loss_count ? loss_sum / loss_count : e.loss;
    const double s = seconds();
    std::printf("%6d %10.4f %10.4f %8.4f %8.1f  %s\n", step, train_loss, e.loss, e.pass1, s, e.example.c_str());
    std::fflush(stdout);
    curve.push_back({{"step", step}, {"train_loss", train_loss}, {"eval_loss", e.loss}, {"pass_at_1", e.pass1},
                     {"seconds", s}, {"example", e.example}});
    loss_sum = 0, loss_count = 0;
  };

  eval_and_log();
  bool out_of_time = false;
  while (trainer.steps_done() < opt.steps && !out_of_time) {
    const double loss = trainer.step();
    step = trainer.steps_done();
    loss_sum += loss, ++loss_count;
    out_of_time = opt.time_limit_s > 0 && seconds() >= opt.time_limit_s;
    if (step % opt.eval_every == 0 || step == opt.steps || out_of_time) eval_and_log();
  }

  // The BF16 weights the model computed with, under the table's names, and the config.
  write_sft_checkpoint(opt.out + "/model.safetensors", trainer, opt.model);

  const nlohmann::json log = {
      {"program", "pulse-sft"}, {"version", version_string()}, {"model", opt.model}, {"parameters", n},
      {"vocab_size", config.vocab_size}, {"digits", opt.digits}, {"seq_len", T}, {"batch", opt.batch},
      {"lr", opt.lr}, {"warmup", trainer.options().warmup}, {"weight_decay", opt.weight_decay}, {"seed", opt.seed},
      {"steps_requested", opt.steps}, {"steps", step}, {"time_limit_s", opt.time_limit_s},
      {"eval_problems", opt.eval_problems}, {"eval_disjoint_from_training", disjoint},
      {"loss", answer_only ? "mean cross entropy over the answer tokens and their eos"
                           : "mean cross entropy over all positions"},
      {"curve", curve}};
  const std::string text = cli::json_text(log, 1) + "\n";
  write_file_atomically(opt.out + "/sft_log.json", text.data(), text.size());
  std::printf("wrote %s/model.safetensors and %s/sft_log.json\n", opt.out.c_str(), opt.out.c_str());
  summary.set("steps", step);
  summary.set("final", curve.back());  // the last evaluation: step, losses, pass_at_1, seconds
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"pulse-sft: train the GPT from scratch on a+b=c and measure greedy pass@1"};
  cli::set_conventions(app, "pulse-sft");
  app.add_option("--model", opt.model, "preset")->check(CLI::IsMember({"tiny", "small", "base"}));
  app.add_option("--steps", opt.steps, "optimizer steps")->check(CLI::Range(1, 100000000));
  app.add_option("--batch", opt.batch, "sequences per step")->check(CLI::Range(1, 65536));
  app.add_option("--lr", opt.lr, "peak AdamW learning rate")->check(CLI::PositiveNumber);
  app.add_option("--warmup", opt.warmup, "linear warm-up steps (at most steps/10)")->check(CLI::Range(1, 100000000));
  app.add_option("--weight-decay", opt.weight_decay, "AdamW weight decay on matrices and embeddings")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seed", opt.seed, "seed of the initial weights and the training problems")->check(cli::unsigned_decimal());
  app.add_option("--digits", opt.digits, "operands have up to this many digits")->check(CLI::Range(1, 18));
  app.add_option("--eval-every", opt.eval_every, "steps between evaluations")->check(CLI::Range(1, 100000000));
  app.add_option("--eval-problems", opt.eval_problems, "held-out problems per evaluation")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--loss", opt.loss, "answer: cross entropy on the answer and its eos only; all: every position")
      ->check(CLI::IsMember({"answer", "all"}));
  app.add_option("--out", opt.out, "output folder (model.safetensors, sft_log.json)");
  app.add_option("--time-limit-s", opt.time_limit_s, "stop after this many seconds (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  cli::JsonSummary summary(app, "pulse-sft");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return cli::exit_on_parse_error(app, e, "pulse-sft");
  }
  Kokkos::ScopeGuard kokkos(argc, argv);
  try {
    return summary.print(run(opt, summary));
  } catch (const std::exception& e) {
    std::cerr << "pulse-sft: " << e.what() << "\n";
    summary.set("error", e.what());
    return summary.print(1);
  }
}
