// pulse-train: GRPO on the addition task with trainer and inference ranks, PULSESync in the loop
// and the sparsity of every BF16 weight update recorded in an HDF5 file.
//   mpirun -n 3 pulse-train --config jobs/configs/smoke.toml --out runs/smoke.h5
//
// Ranks 0..T-1 train (data parallel: gradients summed with MPI_Allreduce), ranks T..N-1 only
// generate rollouts from BF16 weights that reach them as PULSESync patches. Each role is a class
// (src/train): Generator, Trainer, Publisher, StepRecorder. One step reads top to bottom in
// Run::step(): rollouts -> GRPO gradients -> allreduce -> AdamW -> patch -> measurement ->
// statistics row; the loop in Run::train() checkpoints. Trainer 0 measures while the inference
// ranks apply the patch, and they sample the next step's rollouts as soon as its version is
// theirs (Generator::sample_ahead): with an async lag while the trainers train.
#include <CLI/CLI.hpp>
#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <functional>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>

#include "cli/conventions.hpp"
#include "cli/json_summary.hpp"
#include "comm/agree.hpp"
#include "comm/collectives.hpp"
#include "comm/communicator.hpp"
#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "core/version.hpp"
#include "io/model_state.hpp"
#include "io/safetensors.hpp"
#include "io/stats_file.hpp"
#include "kernels/absorption.hpp"
#include "kernels/adamw.hpp"
#include "kernels/bf16.hpp"
#include "kernels/host_copy.hpp"
#include "model/gpt_decoder.hpp"
#include "rl/rollout.hpp"
#include "rl/sft_trainer.hpp"
#include "rl/task.hpp"
#include "rl/tokenizer.hpp"
#include "coding/digest.hpp"
#include "train/generator.hpp"
#include "train/publisher.hpp"
#include "train/sparsity_meter.hpp"
#include "train/stats_schema.hpp"
#include "train/step_recorder.hpp"
#include "train/transfer_counter.hpp"
#include "train/train_checkpoint.hpp"
#include "train/train_config.hpp"
#include "train/trainer.hpp"

using namespace pulse;

namespace {

volatile std::sig_atomic_t stop_signal = 0;
extern "C" void on_stop_signal(int signal) { stop_signal = signal; }

// First thing in main, before MPI_Init: Slurm may deliver a time-limit or preemption signal
// within the job's first seconds, and the default action would kill the rank unsaved.
void install_stop_handlers() {
  struct sigaction action = {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGUSR1, &action, nullptr);
}

// Any rank signalled: collective, so every rank takes the same branch.
int stop_requested(const Communicator& world) { return allreduce_value(world, int(stop_signal), ReduceOp::max); }

constexpr std::uint64_t eval_seed_offset = 0x9E3779B97F4A7C15ull;
constexpr int exit_stopped_resumable = 75;  // EX_TEMPFAIL: checkpointed on a signal, resume with --resume

std::string ckpt_dir_of(const std::string& out) {
  std::filesystem::path p(out);
  return (p.parent_path() / (p.stem().string() + ".ckpt")).string();
}

std::int64_t digest_word(const sync::Digest& d) {
  std::int64_t w;
  std::memcpy(&w, d.data(), sizeof(w));
  return w;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (b >= 1024 && u < 3) b /= 1024, ++u;
  char s[32];
  std::snprintf(s, sizeof(s), u ? "%.1f %s" : "%.0f %s", b, units[u]);
  return s;
}

// 128 random bits in hex: a run's identity (see Run::run_id_).
std::string new_run_id() {
  std::random_device random;
  char text[33];
  std::snprintf(text, sizeof text, "%08x%08x%08x%08x", random(), random(), random(), random());
  return text;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char s[32];
  std::strftime(s, sizeof(s), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return s;
}

// Weights to start from: --init, a safetensors file or a Hugging Face folder (BF16, the model's
// tensor names), else GPT-2 init.
std::vector<float> initial_weights(const TrainConfig& c, const GPTConfig& config, const TensorTable& table) {
  if (c.init.empty()) return gpt_init(config, c.seed);
  const io::ModelState state = io::ModelState::open(c.init);
  std::vector<float> master(table.num_elements());
  for (const TensorInfo& t : table.tensors()) {
    const io::StateTensor* found = state.find(t.name);
    const io::TensorView* v = found ? &found->view : nullptr;
    PULSE_CHECK(v != nullptr, "--init " + c.init + ": no tensor '" + t.name + "' (model " + c.model + ")");
    PULSE_CHECK(v->dtype == io::DType::BF16 && v->bytes == std::size_t(t.numel) * 2,
                "--init " + c.init + ": tensor '" + t.name + "' is not BF16 of " + std::to_string(t.numel) +
                    " elements (another model size?)");
    for (index_t i = 0; i < t.numel; ++i) {
      bf16_bits b;
      std::memcpy(&b, v->data + 2 * i, 2);
      master[t.offset + i] = bf16_to_float(b);
    }
  }
  return master;
}

// after - before, element by element. A free function: nvcc rejects a device lambda in a
// private member function.
Kokkos::View<float*> weight_update(const Kokkos::View<const float*>& after, const Kokkos::View<const float*>& before) {
  Kokkos::View<float*> update("pulse::train::update", after.extent(0));
  Kokkos::parallel_for("pulse::train::update", FlatPolicy<DefaultExec>(DefaultExec(), 0, after.extent(0)),
                       KOKKOS_LAMBDA(const index_t i) { update(i) = after(i) - before(i); });
  return update;
}

// What one step came to on this rank: the values of its statistics row and progress line.
struct StepOutcome {
  TrainStepResult train;
  Publication published;
  double changes_s = 0, apply_s = 0, measure_s = 0, pass1 = 0, step_s = 0, elapsed_s = 0;
  std::uint64_t version = 0, rollout_version = 0;
};

// Rank 0's columns of /steps that the measurement does not set (n: the parameter count).
void set_step_columns(io::StatsRow& row, std::int64_t t, const StepOutcome& s, index_t n, bool ddp,
                      const TransferCounter& copies) {
  const TrainStepResult& train = s.train;
  const SyncStepStats& sync = s.published.sync;
  row.set_int("/steps/step", t);
  row.set("/steps/time_s", s.elapsed_s);
  row.set("/steps/lr", train.lr);
  row.set("/steps/loss", train.loss);
  row.set("/steps/reward", train.reward);
  row.set("/steps/grad_norm", train.grad_norm);
  row.set("/steps/clip_fraction", train.grpo.clip_fraction);
  row.set("/steps/mean_ratio", train.grpo.mean_ratio);
  row.set_int("/steps/tokens", train.tokens);
  row.set_int("/steps/outer_step", train.outer_step || ddp ? 1 : 0);
  if (train.outer_step) {
    row.set("/steps/gate_density", train.outer.density);
    row.set("/steps/outer_s", train.outer.comm_seconds + train.outer.compute_seconds);
  }
  row.set_int("/steps/patch_bytes", std::int64_t(sync.patch_bytes));
  row.set_int("/steps/patch_raw_bytes", std::int64_t(sync.patch_raw_bytes));
  row.set_int("/steps/dense_bytes", std::int64_t(n) * 2);
  row.set("/steps/encode_s", sync.encode_seconds);
  row.set("/steps/apply_s", s.apply_s);
  row.set_int("/steps/policy_version", std::int64_t(s.version));
  row.set_int("/steps/rollout_version", std::int64_t(s.rollout_version));
  row.set("/steps/step_s", s.step_s);
  row.set("/steps/measure_s", s.measure_s);
  row.set("/steps/sync_s", s.changes_s + s.published.seconds - s.published.wait_seconds);
  row.set("/steps/eval_pass1", s.pass1);
  row.set_int("/steps/d2h_bytes", std::int64_t(copies.d2h_bytes));
  row.set_int("/steps/h2d_bytes", std::int64_t(copies.h2d_bytes));
}

// The run's ranks in their roles: trainers (ranks 0..T-1; trainer 0 also measures and publishes)
// and inference ranks (T..N-1), which generate the rollouts when there are any.
class Run {
 public:
  Run(const TrainConfig& c, const Communicator& world, std::string command_line);
  // Checks the inputs and opens the statistics file. Errors here are the same on every rank.
  // Returns false, having written nothing, when a stop signal came during start-up.
  bool open();
  // Returns the process exit code.
  int train();
  void make_warm_start();
  // What this process's steps came to (rank 0), for --json: steps, mean sparsity, patch bytes
  // against dense, the last reward and pass@1.
  nlohmann::json results() const { return totals_; }

 private:
  void declare_statistics();
  void write_root_attributes();
  // Every role of this rank, from the initial weights or the resumed checkpoint.
  void start_roles();
  void step(std::int64_t t);
  double gather_step_changes(bool listed);
  double measure_step(std::int64_t t, io::StatsRow& row);
  double evaluate(std::int64_t t);
  void write_absorption(std::int64_t t, const Kokkos::View<const float*>& before);
  void count_totals(std::int64_t t, const StepOutcome& s);
  void print_progress(std::int64_t t, const StepOutcome& s) const;
  void save_checkpoint(std::int64_t t);
  void check_resumable();
  void write_final_weights() const;
  // A trainer's BF16 weights on the device (empty elsewhere).
  Kokkos::View<const bf16_bits*> trainer_weights() const {
    return trainer_ ? trainer_->weights() : Kokkos::View<const bf16_bits*>();
  }

  TrainConfig c_;
  Communicator world_, trainers_, sync_;
  // One per inference rank: the trainers and that inference rank (last), which sends its share of
  // the rollouts to the trainers only. Ranks outside one hold an unused communicator there.
  std::vector<Communicator> rollout_routes_;
  std::string command_line_;
  int num_trainers_, rank_;
  bool is_trainer_;
  CharTokenizer tok_ = arithmetic_tokenizer();
  GPTConfig config_;
  TensorTable table_;
  index_t n_;
  int seq_len_, rows_per_trainer_;
  std::string ckpt_dir_;

  // The roles.
  std::unique_ptr<Trainer> trainer_;      // trainer ranks
  std::unique_ptr<Generator> generator_;  // rollouts: inference ranks, or trainers when there are none
  std::unique_ptr<Publisher> publisher_;  // host versions of the weights, PULSESync
  std::unique_ptr<StepRecorder> recorder_;
  // Measurement on trainer 0.
  std::unique_ptr<SparsityMeter> meter_;
  std::unique_ptr<GPTDecoder> eval_decoder_;
  std::vector<AdditionProblem> eval_problems_;

  std::unique_ptr<io::StatsFile> stats_;
  TransferCounter copies_;  // host <-> device bytes of the current step
  nlohmann::json totals_ = nlohmann::json::object();
  double sparsity_sum_ = 0, patch_bytes_sum_ = 0, dense_bytes_sum_ = 0;
  std::int64_t first_step_ = 1, resume_step_ = 0;
  std::optional<RankCheckpoint> resumed_;  // this rank's checkpoint, read and checked by open()
  std::vector<std::string> resumes_;       // one line per resume of the run (HDF5 "resumes")
  // Names the run in its statistics file and rank 0's checkpoints, so --resume refuses another
  // run's statistics file (whose rows it would continue).
  std::string run_id_ = new_run_id();
  std::vector<float> initial_;  // starting FP32 weights, until the trainers take them
  std::chrono::steady_clock::time_point start_time_ = std::chrono::steady_clock::now();
};

Run::Run(const TrainConfig& c, const Communicator& world, std::string command_line)
    : c_(c), world_(world), command_line_(std::move(command_line)) {
  rank_ = world_.rank();
  num_trainers_ = world_.size() - c_.inference_ranks;
  is_trainer_ = rank_ < num_trainers_;
  trainers_ = world_.split(is_trainer_ ? 0 : 1, rank_);
  sync_ = world_.split(rank_ == 0 || !is_trainer_ ? 0 : 1, rank_);
  for (int r = num_trainers_; r < world_.size(); ++r)
    rollout_routes_.push_back(world_.split(is_trainer_ || rank_ == r ? 0 : 1, rank_));

  config_ = gpt_preset(c_.model);
  config_.vocab_size = tok_.vocab_size();
  const AdditionTask probe(c_.digits, 0);
  seq_len_ = probe.max_text_length() - 1;
  PULSE_CHECK(seq_len_ <= config_.max_seq_len, "config: digits " + std::to_string(c_.digits) + " needs " +
                                                    std::to_string(seq_len_) + " positions; model " + c_.model +
                                                    " has " + std::to_string(config_.max_seq_len));
  table_ = gpt_tensor_table(config_);
  n_ = table_.num_elements();
  rows_per_trainer_ = rows_per_trainer(c_, num_trainers_);
  ckpt_dir_ = ckpt_dir_of(c_.out);
}

void Run::declare_statistics() {
  std::vector<std::string> names;
  for (const TensorInfo& t : table_.tensors()) names.push_back(t.name);
  declare_train_statistics(*stats_, train_column_values(names));
}

void Run::write_root_attributes() {
  auto& s = *stats_;
  s.set_attribute("format", std::string("pulse-train statistics"));
  s.set_attribute("format_version", std::int64_t(1));
  s.set_attribute("program_version", version_string());
  s.set_attribute("start_utc", utc_now());
  s.set_attribute("run_id", run_id_);
  s.set_attribute("config", to_toml(c_));
  s.set_attribute("command_line", command_line_);
  s.set_attribute("num_ranks", std::int64_t(world_.size()));
  s.set_attribute("trainer_ranks", std::int64_t(num_trainers_));
  s.set_attribute("inference_ranks", std::int64_t(c_.inference_ranks));
  std::vector<std::string> roles, names, shapes;
  for (int r = 0; r < world_.size(); ++r) roles.push_back(r < num_trainers_ ? "trainer" : "inference");
  std::vector<double> numel;
  for (const TensorInfo& t : table_.tensors()) {
    names.push_back(t.name);
    std::string shape;
    for (const index_t d : t.shape) shape += (shape.empty() ? "" : "x") + std::to_string(d);
    shapes.push_back(shape);
    numel.push_back(double(t.numel));
  }
  s.set_attribute("roles", roles);
  s.set_attribute("tensor_names", names);
  s.set_attribute("tensor_shapes", shapes);
  s.set_attribute("tensor_numel", numel);
  s.set_attribute("num_parameters", std::int64_t(n_));
  s.set_attribute("seq_len", std::int64_t(seq_len_));
  s.set_attribute("model", c_.model);
  s.set_attribute("precision", std::string(name_of(precision_names, c_.precision)));
  s.set_attribute("trainer_sync", std::string(loco::trainer_sync_name(c_.trainer_sync)));
}

void Run::write_absorption(std::int64_t t, const Kokkos::View<const float*>& before) {
  // Updates of this step against the weights they were applied to (trainer 0; others pass empty).
  std::vector<std::int64_t> ratio_counts, weight_counts;
  std::int64_t absorbed = 0;
  const Log2Range ratio_range{-24, 16}, weight_range{-40, 8};
  if (rank_ == 0) {
    const Kokkos::View<const float*> update = weight_update(trainer_->params().master(), before);
    const AbsorptionStats a = absorption_stats(DefaultExec(), before, update, ratio_range, weight_range);
    auto pack = [](const Log2Histogram& h) {
      std::vector<std::int64_t> v(h.bins.begin(), h.bins.end());
      v.insert(v.end(), {h.zero, h.below, h.above, h.non_finite});
      return v;
    };
    ratio_counts = pack(a.ratio), weight_counts = pack(a.weight);
    absorbed = a.absorbed;
  }
  const int rb = ratio_range.k_max - ratio_range.k_min + 4, wb = weight_range.k_max - weight_range.k_min + 4;
  ratio_counts.resize(rb), weight_counts.resize(wb);
  auto write_histogram = [&](const std::string& path, const std::vector<std::int64_t>& counts, const Log2Range& range) {
    write_stats_array(*stats_, path, t, counts);
    stats_->set_dataset_attribute(stats_array_path(path, t), columns_attribute(StatsColumns::log2_bins),
                                  std::vector<double>{double(range.k_min), double(range.k_max)});
  };
  write_histogram("/absorption/step_NNNNNN/ratio_counts", ratio_counts, ratio_range);
  write_histogram("/absorption/step_NNNNNN/weight_counts", weight_counts, weight_range);
  write_stats_array(*stats_, "/absorption/step_NNNNNN/absorbed", t, {absorbed});
}

void Run::save_checkpoint(std::int64_t t) {
  RankCheckpoint state;
  state.metadata = {{"program", "pulse-train"}, {"ranks", std::to_string(world_.size())}, {"config", to_toml(c_)}};
  for (const std::string& line : resumes_) state.metadata["resumes"] += line + "\n";
  if (rank_ == 0) state.metadata["run_id"] = run_id_;  // rank 0 writes the statistics file
  if (trainer_) trainer_->save(state);
  publisher_->save(state);
  if (meter_) {
    const auto snaps = meter_->snapshots();
    for (std::size_t i = 0; i < snaps.size(); ++i) state.add("ring." + std::to_string(i), io::DType::BF16, snaps[i]);
  }
  save_checkpoint_collective(world_, ckpt_dir_, t, state);
}

// Every rank reads its own checkpoint (checksum verified) and compares the run's settings with
// the checkpoint's before any file changes.
void Run::check_resumable() {
  const auto latest = latest_checkpoint_step(ckpt_dir_);
  PULSE_CHECK(latest.has_value(), "--resume: no checkpoint in '" + ckpt_dir_ + "'");
  resume_step_ = *latest;
  PULSE_CHECK(std::filesystem::exists(c_.out), "--resume: '" + c_.out + "' does not exist");
  resumed_ = load_rank_checkpoint(ckpt_dir_, rank_, resume_step_);
  const RankCheckpoint& state = *resumed_;
  PULSE_CHECK(state.meta("ranks") == std::to_string(world_.size()),
              "--resume: the checkpoint was written by " + state.meta("ranks") + " ranks, this run has " +
                  std::to_string(world_.size()));
  if (rank_ == 0) {
    // A run from before run ids has none in either file.
    const auto in_stats = io::read_root_string_attribute(c_.out, "run_id");
    const auto in_checkpoint = state.metadata.find("run_id");
    const std::string checkpoint_id = in_checkpoint == state.metadata.end() ? "" : in_checkpoint->second;
    PULSE_CHECK(in_stats.value_or("") == checkpoint_id,
                "--resume: '" + c_.out + "' is the statistics file of another run (run id " +
                    (in_stats ? *in_stats : "none") + "), not of the checkpoint's run (" +
                    (checkpoint_id.empty() ? "none" : checkpoint_id) + ")");
    run_id_ = checkpoint_id;
  }
  const std::string changes = resume_changes(state.meta("config"), c_);
  std::istringstream lines(state.metadata.count("resumes") ? state.meta("resumes") : "");
  resumes_.clear();
  for (std::string line; std::getline(lines, line);) resumes_.push_back(line);
  resumes_.push_back("after step " + std::to_string(resume_step_) + " at " + utc_now() + ": " +
                     (changes.empty() ? "no setting changed" : changes));
}

// The SFT warm start: rank 0 trains from scratch on a+b=c and caches the BF16 weights at --init.
void Run::make_warm_start() {
  int ok = 1;
  std::string error;
  if (rank_ == 0) {
    try {
      std::printf("pulse-train: no %s; making it with %d SFT steps\n", c_.init.c_str(), c_.sft_steps);
      std::fflush(stdout);
      std::error_code ec;
      const std::filesystem::path folder = std::filesystem::path(c_.init).parent_path();
      if (!folder.empty()) std::filesystem::create_directories(folder, ec);
      SftOptions options;
      options.digits = c_.digits, options.steps = c_.sft_steps, options.seed = c_.seed;
      SftTrainer sft(config_, options);
      double loss = 0;
      for (int s = 0; s < c_.sft_steps && !stop_signal; ++s) loss = sft.step();
      if (!stop_signal) {  // a stopped warm start is not cached; open() reports the stop
        write_sft_checkpoint(c_.init, sft, c_.model);
        std::printf("pulse-train: SFT warm start done (last loss %.4f)\n", loss);
      }
    } catch (const std::exception& e) {
      ok = 0, error = e.what();
    }
  }
  PULSE_CHECK(allreduce_value(world_, ok, ReduceOp::min) == 1, "SFT warm start failed: " + error);
}

bool Run::open() {
  // Input checks before anything is written; every rank reaches the same outcome.
  if (c_.sft_steps > 0 && !std::filesystem::exists(c_.init)) {
    make_warm_start();
    // A stop during the warm start comes before any output exists: nothing to resume from.
    if (const int signal = stop_requested(world_)) {
      if (rank_ == 0)
        std::printf("pulse-train: signal %d during the SFT warm start, before any output was written; run again%s\n",
                    signal, c_.resume ? " with --resume" : " without --resume");
      return false;
    }
  }
  agree_on_error(world_.raw(), [&] { initial_ = initial_weights(c_, config_, table_); });
  resume_step_ = 0;
  if (c_.resume) agree_on_error(world_.raw(), [&] { check_resumable(); });
  const io::StatsOpen mode = c_.resume ? io::StatsOpen::resume
                             : c_.overwrite ? io::StatsOpen::overwrite : io::StatsOpen::create;
  stats_ = std::make_unique<io::StatsFile>(world_.raw(), c_.out, mode, resume_step_);
  if (!c_.resume) {
    std::error_code ec;
    if (c_.overwrite && rank_ == 0) std::filesystem::remove_all(ckpt_dir_, ec);
    write_root_attributes();
  } else {
    stats_->set_attribute("config", to_toml(c_));  // the settings the run continues with
    stats_->set_attribute("resumes", resumes_);
  }
  declare_statistics();
  std::vector<Communicator> counted = {world_, trainers_, sync_};
  counted.insert(counted.end(), rollout_routes_.begin(), rollout_routes_.end());
  recorder_ = std::make_unique<StepRecorder>(*stats_, world_, trainers_, sync_, counted);
  return true;
}

void Run::start_roles() {
  const RankCheckpoint* resumed = resumed_ ? &*resumed_ : nullptr;
  if (is_trainer_) {
    trainer_ = std::make_unique<Trainer>(c_, trainers_, config_, table_, rows_per_trainer_, seq_len_, initial_, resumed);
    initial_.clear();
    if (rank_ == 0) meter_ = std::make_unique<SparsityMeter>(table_, kstep_values);
  }
  generator_ = std::make_unique<Generator>(c_, config_, seq_len_, rank_, num_trainers_, rollout_routes_);
  if (rank_ == 0 && c_.eval_every > 0) {
    eval_decoder_ = std::make_unique<GPTDecoder>(config_, std::min(c_.eval_problems, 256), seq_len_);
    AdditionTask eval_task(c_.digits, c_.seed + eval_seed_offset);
    for (int i = 0; i < c_.eval_problems; ++i) eval_problems_.push_back(eval_task.sample());
  }
  // Trainer 0 is the one publisher; trainers keep versions when they generate.
  const SyncRole role = rank_ == 0 ? SyncRole::sender : is_trainer_ ? SyncRole::trainer : SyncRole::receiver;
  publisher_ = std::make_unique<Publisher>(sync_, table_, c_, role, c_.inference_ranks == 0);
  if (resumed) {
    publisher_->load(*resumed);
    if (meter_) {
      std::vector<std::vector<bf16_bits>> snaps;
      for (int i = 0; resumed->has("ring." + std::to_string(i)); ++i)
        snaps.push_back(resumed->get<bf16_bits>("ring." + std::to_string(i), n_));
      meter_->restore(snaps);
    }
    resumed_.reset();
    first_step_ = resume_step_ + 1;
    if (rank_ == 0) std::printf("pulse-train: resuming %s after step %lld\n", c_.out.c_str(), (long long)resume_step_);
  } else if (meter_) {
    meter_->start(trainer_->weights());
  }
  // The inference ranks start from trainer 0's bytes.
  publisher_->start(trainer_ ? to_host(trainer_->weights()) : std::vector<bf16_bits>{}, c_.resume);
}

int Run::train() {
  start_roles();
  if (rank_ == 0)
    std::printf("pulse-train: %s (%lld parameters), %d trainer + %d inference ranks, %d x %d rollouts/step, "
                "lr %g, %s, steps %lld..%d -> %s\n",
                c_.model.c_str(), (long long)n_, num_trainers_, c_.inference_ranks, c_.prompts_per_step,
                c_.group_size, c_.lr, name_of(precision_names, c_.precision), (long long)first_step_, c_.steps, c_.out.c_str());
  // A stop during start-up: the initial state becomes checkpoint 0, so --resume starts from it.
  if (const int signal = stop_requested(world_)) {
    if (!c_.resume) save_checkpoint(0);
    if (rank_ == 0)
      std::printf("pulse-train: signal %d during start-up: checkpointed the state of step %lld; continue with --resume\n",
                  signal, (long long)(first_step_ - 1));
    return exit_stopped_resumable;
  }
  start_time_ = std::chrono::steady_clock::now();
  for (std::int64_t t = first_step_; t <= c_.steps; ++t) {
    step(t);
    const int signalled = stop_requested(world_);
    const bool due = c_.checkpoint_every > 0 && t % c_.checkpoint_every == 0;
    if (due || signalled || t == c_.steps) {
      stats_->flush();  // first: the file then holds every row a resume from this checkpoint keeps
      save_checkpoint(t);
    }
    if (signalled && t < c_.steps) {
      if (rank_ == 0)
        std::printf("pulse-train: signal %d: checkpointed after step %lld; continue with --resume\n", signalled,
                    (long long)t);
      return exit_stopped_resumable;
    }
  }
  agree_on_error(world_.raw(), [&] {
    if (rank_ == 0) write_final_weights();
  });
  return 0;
}

// The final BF16 weights under the model's names (pulse-sync reads them).
void Run::write_final_weights() const {
  const std::vector<bf16_bits> w = to_host(trainer_->weights());
  std::vector<io::TensorToWrite> tensors;
  for (const TensorInfo& t : table_.tensors())
    tensors.push_back({t.name, io::DType::BF16, std::vector<std::int64_t>(t.shape.begin(), t.shape.end()),
                       w.data() + t.offset, std::size_t(t.numel) * 2});
  const std::filesystem::path p(c_.out);
  const std::string name = p.stem().string() + ".weights.safetensors";
  const std::string path = (p.parent_path() / name).string();
  remove_abandoned_temp_files(p.parent_path().empty() ? "." : p.parent_path().string(),
                              [&](const std::string& base) { return base == name; });
  io::write_safetensors(path, tensors, {{"format", "pt"}, {"program", "pulse-train"}, {"version", std::to_string(publisher_->version())}});
  std::printf("pulse-train: done, wrote %s and %s\n", c_.out.c_str(), path.c_str());
}

// 4. Trainer 0: what changed in the BF16 weights the forward pass sees, as the change set that
// PULSESync codes (the only weight data that leaves the device): AdamW's own when it listed it,
// else compacted against the previous version. Returns the seconds it took.
double Run::gather_step_changes(bool listed) {
  Kokkos::Timer timer;
  ParameterStore& params = trainer_->params();
  if (listed) params.gather_changes(copies_);
  else meter_->compact(params.weights(), params.changes(), copies_);
  return timer.seconds();
}

// 6. Trainer 0's statistics of step t, once its patch is sent: the inference ranks apply it
// meanwhile. The gradient, the weights, the change set and the Adam moments stay as step t left
// them until the next step. Returns the seconds it took.
double Run::measure_step(std::int64_t t, io::StatsRow& row) {
  Kokkos::Timer timer;
  // Gradient sparsity is measured on the summed, unclipped gradient.
  row.set("/steps/grad_sparsity", gradient_sparsity(trainer_->grads(), grad_thresholds));
  copies_.downloaded(grad_thresholds.size() * sizeof(index_t));  // the counts
  ParameterStore& params = trainer_->params();
  const StepSparsity sp = meter_->measure(params.weights(), params.changes());
  copies_.downloaded(kstep_values.size() * sizeof(index_t));  // the k-step counts
  row.set_int("/steps/changed", sp.changed);
  row.set("/steps/sparsity", 1.0 - double(sp.changed) / double(n_));
  row.set_int("/steps/tensor_changed", std::vector<std::int64_t>(sp.per_tensor.begin(), sp.per_tensor.end()));
  row.set("/kstep/sparsity", sp.kstep);
  const ParameterStore::Moments moments = params.moments_fp32();
  const AdamWHyper adam;  // the betas and eps the trainer steps with
  row.set("/steps/adam_ratio", adam_ratio_quantiles(moments.m, moments.v, adam.beta1, adam.beta2, adam.eps, t, adam_quantiles));
  copies_.downloaded(adam_quantiles.size() * sizeof(double));
  return timer.seconds();
}

// 7. Held-out greedy pass@1 on trainer 0 when due, else NaN.
double Run::evaluate(std::int64_t t) {
  if (rank_ != 0 || c_.eval_every <= 0 || (t % c_.eval_every != 0 && t != c_.steps)) return std::nan("");
  eval_decoder_->set_weights(trainer_->weights());
  AdditionTask eval_task(c_.digits, c_.seed + eval_seed_offset);
  return greedy_pass_at_1(*eval_decoder_, tok_, eval_task, eval_problems_, seq_len_);
}

void Run::step(std::int64_t t) {
  Kokkos::Timer step_timer;
  double comm_s = 0;
  recorder_->start_step();
  io::StatsRow row;
  copies_ = TransferCounter{};
  StepOutcome s;

  // 1. Rollouts: new every num_iterations steps, reused (with importance ratios) in between.
  if (generator_->new_rollouts_due(t)) {
    RolloutBatch b = generator_->rollouts_for_step(t, *publisher_, trainer_weights(), copies_, comm_s);
    if (trainer_) trainer_->set_batch(std::move(b));
  }
  // With an async lag the inference ranks sample the next batch while the trainers train on this one.
  generator_->sample_ahead(t, c_.steps, *publisher_, copies_);
  // 2-3. GRPO gradients, allreduce, AdamW and (DiLoCo/PULSELoCo) the outer step; trainer 0 keeps
  // the master weights before it on absorption steps.
  const bool absorb = c_.precision == Precision::mixed && c_.absorption_every > 0 && t % c_.absorption_every == 0;
  if (trainer_) s.train = trainer_->step(t, rank_ == 0 && absorb, copies_);
  comm_s += s.train.comm_s;
  // 4. Trainer 0's change set; the absorption histograms are written collectively.
  if (rank_ == 0) s.changes_s = gather_step_changes(s.train.listed);
  if (absorb) {
    Kokkos::Timer absorb_timer;
    write_absorption(t, s.train.master_before);
    if (rank_ == 0) s.measure_s += absorb_timer.seconds();
  }
  // 5. PULSESync, every rank agreeing that the inference ranks hold the new version.
  // An inference rank whose patch does not reach the target digest fails here (apply_patch and
  // the relay's pull check it), and so every rank.
  // 6. Trainer 0 measures the step once its patch is sent, while the inference ranks apply it.
  sync::ChangeSet* changes = rank_ == 0 ? &trainer_->params().changes() : nullptr;
  agree_on_error(world_.raw(), [&] {
    s.published = publisher_->publish(changes, trainer_weights(), copies_);
    if (rank_ == 0) s.measure_s += measure_step(t, row);
  });
  if (!trainer_) comm_s += s.published.seconds;
  s.apply_s = allreduce_value(world_, s.published.sync.apply_seconds, ReduceOp::max);
  s.version = publisher_->version();
  // Without a lag the inference ranks sample the next rollouts from the version just published,
  // while trainer 0 evaluates when due.
  generator_->sample_ahead(t, c_.steps, *publisher_, copies_);
  // 7. Held-out greedy pass@1.
  s.pass1 = evaluate(t);

  // 8. The statistics row (rank 0's values for /steps, every rank's own for /ranks).
  s.step_s = step_timer.seconds();
  s.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time_).count();
  if (rank_ == 0) {
    s.rollout_version = trainer_->batch().policy_version;
    set_step_columns(row, t, s, n_, c_.trainer_sync == loco::TrainerSync::ddp, copies_);
    count_totals(t, s);
  }
  recorder_->finish_step(row, s.step_s, comm_s, digest_word(s.published.sync.state), s.version);
  if (rank_ == 0 && !c_.quiet) print_progress(t, s);
}

void Run::count_totals(std::int64_t t, const StepOutcome& s) {
  const std::int64_t steps_run = t - first_step_ + 1;
  sparsity_sum_ += 1.0 - double(s.published.sync.changed) / double(n_);
  patch_bytes_sum_ += double(s.published.sync.patch_bytes), dense_bytes_sum_ += double(n_) * 2;
  totals_["steps_run"] = steps_run, totals_["last_step"] = t;
  totals_["mean_sparsity"] = sparsity_sum_ / double(steps_run);
  totals_["dense_over_patch_bytes"] = patch_bytes_sum_ > 0 ? dense_bytes_sum_ / patch_bytes_sum_ : 0.0;
  totals_["final_reward"] = s.train.reward;
  if (!std::isnan(s.pass1)) totals_["final_eval_pass1"] = s.pass1;
}

void Run::print_progress(std::int64_t t, const StepOutcome& s) const {
  const double eta = s.elapsed_s / double(t - first_step_ + 1) * double(c_.steps - t);
  std::printf("step %lld/%d  eta %4.0fs  reward %.3f  loss %+.4f  sparsity %.4f  patch %s  %.2f s/step%s\n",
              (long long)t, c_.steps, eta, s.train.reward, s.train.loss,
              1.0 - double(s.published.sync.changed) / double(n_), human_bytes(double(s.published.sync.patch_bytes)).c_str(),
              s.step_s, std::isnan(s.pass1) ? "" : ("  pass@1 " + std::to_string(s.pass1).substr(0, 5)).c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  install_stop_handlers();
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  TrainConfig config;
  CLI::App app{"pulse-train: GRPO with trainer and inference ranks, PULSESync, and BF16 update sparsity in HDF5"};
  cli::set_conventions(app, "pulse-train");
  add_train_options(app, config);
  cli::JsonSummary summary(app, "pulse-train");
  bool print_schema = false, print_options = false;
  app.add_flag("--print-schema", print_schema,
               "print the statistics file's datasets (path, shape, type, units, description) as a Markdown table and exit");
  app.add_flag("--print-options", print_options,
               "print the settings (flag and TOML key, default, accepted values, meaning) as a Markdown table and exit");
  std::string command_line;
  for (int i = 0; i < argc; ++i) command_line += (i ? " " : "") + std::string(argv[i]);
  // Checks every rank makes identically: a bad config exits cleanly on all ranks, no files made.
  int code = -1;
  try {
    app.parse(argc, argv);
    if (print_schema || print_options) {
      if (rank == 0) std::cout << (print_schema ? stats_schema_markdown() : train_options_markdown());
      code = 0;
    } else {
      validate(config, size);
    }
  } catch (const CLI::ParseError& e) {
    code = cli::exit_on_parse_error(app, e, "pulse-train", rank == 0);
  } catch (const std::exception& e) {
    if (rank == 0) std::cerr << "pulse-train: " << e.what() << "\n";
    code = 2;
  }
  if (code >= 0) {
    MPI_Finalize();
    return code;
  }
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    try {
      Communicator world(MPI_COMM_WORLD);
      std::unique_ptr<Run> run;
      try {
        run = std::make_unique<Run>(config, world, command_line);
        if (!run->open()) code = exit_stopped_resumable;
      } catch (const std::exception& e) {
        if (rank == 0) std::cerr << "pulse-train: " << e.what() << "\n";
        code = 1;
      }
      if (code < 0) {
        // An error of one rank alone, while the others may wait in a collective call, can only
        // end in MPI_Abort; the input errors of a run are agreed on, every rank throwing them.
        try {
          code = run->train();
          if (rank == 0) summary.set("results", run->results());
        } catch (const AgreedError& e) {  // met by every rank alike (comm/agree.hpp): one line, then finalize
          if (rank == 0) std::cerr << "pulse-train: " << e.what() << "\n";
          code = 1;
        } catch (const std::exception& e) {
          std::cerr << "pulse-train: rank " << rank << ": " << e.what() << "\n";
          std::cerr.flush();
          MPI_Abort(MPI_COMM_WORLD, 1);
        }
      }
    } catch (const std::exception& e) {
      // Output errors (existing file, unwritable folder) arise on every rank alike; anything
      // else may be one rank's, so the job is aborted rather than left waiting in a collective.
      std::cerr << "pulse-train: " << e.what() << "\n";
      std::cerr.flush();
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  summary.set("steps", config.steps);
  summary.print(code, rank == 0);
  MPI_Finalize();
  return code;
}
