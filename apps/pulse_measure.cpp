// pulse-measure: the BF16 (and F16/F32) weight-update sparsity of any run, from its checkpoints.
//   mpirun -n N pulse-measure --out run.h5 CKPT_0 CKPT_1 ... CKPT_T
//   mpirun -n N pulse-measure --out run.h5 --glob 'run/checkpoint-*'
// Each checkpoint is a .safetensors file or a Hugging Face folder (src/io/model_state.hpp); the
// series and its steps: src/measure/checkpoint_series.hpp. The output is pulse-train's statistics
// format (src/io/stats_file.hpp) with the datasets the weights alone determine
// (src/measure/stats_schema.hpp); row i compares checkpoint i + 1 with the ones before.
// Ranks split the model by bytes (src/measure/work_split.hpp); each reads only its share of each
// checkpoint, where the page cache holds it (mapped, not copied: src/measure/checkpoint_reader.hpp),
// comparing it block by block with the previous checkpoint's; earlier versions are rebuilt block by
// block from logs of the changes between checkpoints (src/measure/kstep_history.hpp), so memory per
// rank is two checkpoints' mapped pages plus the logs. Checkpoints are measured in batches of
// consecutive ones, a block of each in turn: each is read from memory once, and one rebuild of the
// earlier versions serves the batch. The kernel reads the next batch ahead.
// A rank's threads (--threads) each take a contiguous run of its units, with their own history:
// every count is a sum of per-block integers, the same at any thread count.
// FP32 tensors are compared as the BF16 (or F16) cast the forward pass reads, or as stored
// (--as raw): src/measure/compare_as.hpp.
#include <signal.h>
#include <unistd.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <Kokkos_Core.hpp>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <cerrno>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <set>

#include "cli/conventions.hpp"
#include "cli/folder_filter.hpp"
#include "cli/json_summary.hpp"
#include "cli/output_path.hpp"
#include "coding/parallel.hpp"
#include "comm/agree.hpp"
#include "core/error.hpp"
#include "core/version.hpp"
#include "io/model_state.hpp"
#include "io/stats_file.hpp"
#include "measure/checkpoint_reader.hpp"
#include "measure/checkpoint_series.hpp"
#include "measure/compare_as.hpp"
#include "measure/kstep_history.hpp"
#include "measure/patch_size.hpp"
#include "measure/rank_threads.hpp"
#include "measure/run_config.hpp"
#include "measure/stats_schema.hpp"
#include "measure/tensor_kind.hpp"
#include "measure/work_split.hpp"

using namespace pulse;
using measure::MeasuredTensor;
using measure::Piece;
using measure::Unit;

namespace {

const std::vector<int> kstep_values = {1, 2, 4, 8, 16, 32};  // as pulse-train, up to --max-k

const char* kAbsent =
    "pulse-measure reads weight checkpoints only: gradients (/steps/grad_sparsity, grad_norm), Adam moments "
    "(/steps/adam_ratio), rewards, losses, evaluations and the run's own sync timings (reward, loss, eval_pass1, "
    "step_s, sync_s, apply_s, verify_ok) are not in them and are absent";

struct Options {
  std::vector<std::string> checkpoints;
  std::string glob_pattern;
  std::vector<std::int64_t> steps;
  std::string out;
  bool overwrite = false;
  bool quiet = false;
  double unit_mb = 16;
  int level = 3;
  int max_k = 32;
  unsigned threads = 0;  // per rank; 0: its share of the cores (measure/rank_threads.hpp)
  std::string as;  // bf16, f16, raw; empty: bf16 for a series of FP32 tensors only, raw otherwise
  std::vector<std::string> settings;  // --set key=value
  std::string label;
  std::vector<std::string> include, exclude;  // globs on a folder's files
  cli::FolderFilter filter() const { return cli::FolderFilter(include, exclude); }
};

std::vector<int> ks_up_to(int max_k) {
  std::vector<int> ks;
  for (const int k : kstep_values)
    if (k <= max_k) ks.push_back(k);
  return ks;
}

bool is_measured(io::DType d) { return d == io::DType::BF16 || d == io::DType::F16 || d == io::DType::F32; }

// A folder's file by its path relative to the folder.
std::string relative_name(const io::ModelState& state, const std::string& path) {
  return std::filesystem::relative(path, state.path()).generic_string();
}

// The BF16/F16/F32 tensors in storage order (shard by shard, by offset), so that each rank reads
// its share of a checkpoint front to back, and a single file's patch is the one pulse-sync writes;
// of a folder, those of the shards the filter keeps.
std::vector<MeasuredTensor> measured_tensors(const io::ModelState& state, const cli::FolderFilter& filter) {
  std::vector<MeasuredTensor> out;
  for (const io::SafetensorsFile& shard : state.shards()) {
    if (state.is_folder() && !filter.keeps(relative_name(state, shard.path()))) continue;
    for (const io::TensorView& t : shard.tensors()) {
      if (!is_measured(t.dtype)) continue;
      MeasuredTensor m{t.name, io::dtype_name(t.dtype), t.shape, 1, io::dtype_size(t.dtype)};
      for (const std::int64_t d : t.shape) m.numel *= d;
      out.push_back(m);
    }
  }
  return out;
}

// Every checkpoint opens and holds the first one's measured tensors (names, dtypes, shapes).
void check_series(const std::vector<std::pair<std::int64_t, std::string>>& series, const std::vector<MeasuredTensor>& first,
                  const cli::FolderFilter& filter) {
  for (std::size_t i = 1; i < series.size(); ++i) {
    const std::string& path = series[i].second;
    const std::vector<MeasuredTensor> these =
        measured_tensors(io::ModelState::open(path, {}, io::ShardBytes::header_only), filter);
    std::set<std::string> names;
    for (const MeasuredTensor& t : these) names.insert(t.name);
    for (const MeasuredTensor& a : first) {
      auto it = std::find_if(these.begin(), these.end(), [&](const MeasuredTensor& b) { return b.name == a.name; });
      if (it == these.end())
        throw Error(path + ": not the model of " + series[0].second + ": lacks tensor \"" + a.name + "\"");
      if (it->dtype != a.dtype || it->shape != a.shape)
        throw Error(path + ": not the model of " + series[0].second + ": tensor \"" + a.name + "\" is " + it->dtype +
                    " of another shape or dtype");
      names.erase(a.name);
    }
    if (!names.empty())
      throw Error(path + ": not the model of " + series[0].second + ": has extra tensor \"" + *names.begin() + "\"");
  }
}

// What the FP32 tensors are compared as: --as, or by default the BF16 cast where every tensor
// is FP32 (an FP32 master, which the forward pass reads cast), as stored otherwise (FP32 tensors
// beside BF16 or F16 ones are kept in FP32 on purpose, as norms often are, and read so).
measure::CompareAs compare_as(const std::string& as, const std::vector<MeasuredTensor>& tensors) {
  if (!as.empty()) return measure::parse_compare_as(as);
  const bool all_f32 = std::all_of(tensors.begin(), tensors.end(), [](const MeasuredTensor& t) { return t.dtype == "F32"; });
  return all_f32 ? measure::CompareAs::bf16 : measure::CompareAs::raw;
}

// Elements compared per block: small enough for the batch's blocks to stay in cache while every
// version they need is rebuilt and compared with them (2048 and 4096 were no faster, measured).
constexpr std::size_t kBlockElements = 8192;

// Checkpoints measured together (measure/kstep_history.hpp): a block read from memory for one
// is compared from cache as the next one's block before, and one chain of reverts of the logs
// serves them all (30 + 8 logs for 8 checkpoints at --max-k 32, not 31 each). Their mapped pages
// are let go unit by unit, so a rank maps two checkpoints' shares and a unit of each of the
// batch's checkpoints at most; the history holds the logs of max-k + 8 checkpoints.
constexpr std::size_t kBatchCheckpoints = 8;

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + 1e-6 * double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char s[32];
  std::strftime(s, sizeof(s), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return s;
}

std::string fixed(double v, int digits) {
  char out[64];
  std::snprintf(out, sizeof out, "%.*f", digits, v);
  return out;
}

std::string clock_text(double s) {
  char out[32];
  const long v = long(std::llround(std::max(0.0, s)));
  std::snprintf(out, sizeof out, "%ld:%02ld:%02ld", v / 3600, v / 60 % 60, v % 60);
  return out;
}

class Measurement {
 public:
  Measurement(const Options& o, std::vector<std::pair<std::int64_t, std::string>> series,
              std::vector<MeasuredTensor> tensors, measure::CompareAs as, measure::RunConfig config,
              std::string command_line)
      : o_(o), series_(std::move(series)), tensors_(std::move(tensors)), as_(as), config_(std::move(config)),
        command_line_(std::move(command_line)), ks_(ks_up_to(o.max_k)) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks_);
    std::vector<MeasuredTensor> compared = tensors_;  // units by the bytes compared: the patches of a cast
    for (std::size_t t = 0; t < tensors_.size(); ++t) {  // series are those of the cast checkpoints
      cast_.push_back(as_ != measure::CompareAs::raw && tensors_[t].dtype == "F32");
      compared[t].element_bytes = compared_bytes(t);
      numel_ += tensors_[t].numel;
      dense_bytes_ += std::uint64_t(tensors_[t].numel) * compared_bytes(t);
      stored_bytes_ += std::uint64_t(tensors_[t].numel) * tensors_[t].element_bytes;
    }
    units_ = measure::make_units(compared, std::uint64_t(o.unit_mb * (1 << 20)));
    std::tie(first_unit_, last_unit_) = measure::units_of_rank(units_, rank_, nranks_);
    for (std::size_t u = first_unit_; u < last_unit_; ++u)
      for (const Piece& p : units_[u].pieces) share_bytes_ += std::uint64_t(p.end - p.begin) * tensors_[p.tensor].element_bytes;
    threads_ = std::max(1u, o.threads);
    // The threads split the share as ranks split the model; a thread without a unit has no worker.
    const std::vector<Unit> share(units_.begin() + std::ptrdiff_t(first_unit_), units_.begin() + std::ptrdiff_t(last_unit_));
    for (unsigned w = 0; w < threads_; ++w) {
      const auto [first, last] = measure::units_of_rank(share, int(w), int(threads_));
      if (first < last) workers_.push_back(std::make_unique<Worker>(first_unit_ + first, first_unit_ + last, ks_));
    }
  }

  void run() {
    stats_ = std::make_unique<io::StatsFile>(MPI_COMM_WORLD, o_.out,
                                             o_.overwrite ? io::StatsOpen::overwrite : io::StatsOpen::create);
    wrote_output_ = true;
    declare();
    const auto t0 = std::chrono::steady_clock::now();
    // Every rank opens every checkpoint; an error may be one rank's (comm/agree.hpp). The first
    // checkpoint is a batch alone: the base of the first row.
    const auto batch_end = [&](std::size_t first) { return first == 0 ? 1 : std::min(series_.size(), first + kBatchCheckpoints); };
    const auto open_batch = [&](std::size_t first) {
      std::vector<std::unique_ptr<measure::CheckpointReader>> readers;
      for (std::size_t i = first; i < batch_end(first); ++i)
        readers.push_back(std::make_unique<measure::CheckpointReader>(series_[i].second));
      return readers;
    };
    std::vector<std::unique_ptr<measure::CheckpointReader>> next, batch;
    std::unique_ptr<measure::CheckpointReader> previous;
    agree_on_error(MPI_COMM_WORLD, [&] { next = open_batch(0); });
    for (std::size_t first = 0; first < series_.size(); first = batch_end(first)) {
      const auto batch_t0 = std::chrono::steady_clock::now();
      const double cpu0 = cpu_seconds();
      batch = std::move(next);
      next.clear();
      agree_on_error(MPI_COMM_WORLD, [&] {
        if (batch_end(first) < series_.size()) next = open_batch(batch_end(first));
      });
      measure_batch(first, previous.get(), batch, next, batch_t0, cpu0);
      previous = std::move(batch.back());
      const std::size_t i = batch_end(first) - 1;  // the batch's last checkpoint
      if (rank_ == 0 && !o_.quiet) {
        const double el = seconds_since(t0);
        const double gb = double(stored_bytes_) * double(i + 1) / 1e9;
        std::fprintf(stderr, "pulse-measure: checkpoint %zu/%zu (step %lld), %.3g GB read in %s (%.3g GB/s), ETA %s\n",
                     i + 1, series_.size(), (long long)series_[i].first, gb, clock_text(el).c_str(), gb / el,
                     clock_text(el / double(i + 1) * double(series_.size() - i - 1)).c_str());
      }
    }
    stats_.reset();
  }

  // Whether run() created --out (a failed run's file is incomplete).
  bool wrote_output() const { return wrote_output_; }

  // The run's figures (rank 0), for --json and the closing line.
  nlohmann::json figures() const {
    nlohmann::json k = nlohmann::json::object();
    for (std::size_t j = 0; j < ks_.size(); ++j)
      k[std::to_string(ks_[j])] = totals_.kstep_rows[j] ? nlohmann::json(totals_.kstep_sum[j] / double(totals_.kstep_rows[j]))
                                                         : nlohmann::json(nullptr);
    const auto ratio = [](double a, double b) { return b > 0 ? nlohmann::json(a / b) : nlohmann::json(nullptr); };
    return {{"rows", totals_.rows},
            {"num_parameters", numel_},
            {"mean_sparsity", ratio(totals_.sparsity_sum, double(totals_.rows))},
            {"min_sparsity", totals_.rows ? nlohmann::json(totals_.min_sparsity) : nlohmann::json(nullptr)},
            {"kstep_mean_sparsity", k},
            {"changed", totals_.changed},
            {"patch_bytes", totals_.patch},
            {"dense_bytes", totals_.dense},
            {"dense_over_patch", ratio(double(totals_.dense), double(totals_.patch))},
            {"bits_per_changed", ratio(8.0 * double(totals_.patch), double(totals_.changed))}};
  }

  std::string figures_line() const {
    const nlohmann::json f = figures();
    auto pct = [](const nlohmann::json& v) { return v.is_null() ? std::string("-") : fixed(100 * v.get<double>(), 3) + "%"; };
    std::string k = ks_.empty() ? "" : ", k=" + std::to_string(ks_.back()) + " " + pct(f["kstep_mean_sparsity"][std::to_string(ks_.back())]);
    return std::to_string(totals_.rows) + " rows: mean sparsity " + pct(f["mean_sparsity"]) + " (min " +
           pct(f["min_sparsity"]) + ")" + k + ", " + std::to_string(totals_.changed) + " changed, patches " +
           std::to_string(totals_.patch) + " B against " + std::to_string(totals_.dense) + " B dense (" +
           (f["dense_over_patch"].is_null() ? "-" : fixed(f["dense_over_patch"].get<double>(), 1) + "x") + "), " +
           (f["bits_per_changed"].is_null() ? "-" : fixed(f["bits_per_changed"].get<double>(), 2)) + " bits per change";
  }

 private:
  std::size_t compared_bytes(std::size_t t) const { return cast_[t] ? 2 : tensors_[t].element_bytes; }
  std::string compared_dtype(std::size_t t) const {
    return cast_[t] ? (as_ == measure::CompareAs::bf16 ? "BF16" : "F16") : tensors_[t].dtype;
  }

  void declare() {
    auto& s = *stats_;
    io::StatsColumnValues columns;
    for (const MeasuredTensor& t : tensors_) columns.tensor_names.push_back(t.name);
    for (const measure::TensorKind k : measure::all_tensor_kinds()) columns.kind_names.push_back(measure::tensor_kind_name(k));
    columns.k_values.assign(ks_.begin(), ks_.end());
    io::declare_statistics(s, measure::measure_stats_schema(), columns);
    const std::vector<std::string>& names = columns.tensor_names;
    const std::vector<std::string>& kinds = columns.kind_names;

    s.set_attribute("format", std::string("pulse-train statistics"));
    s.set_attribute("format_version", std::int64_t(1));
    s.set_attribute("writer", std::string("pulse-measure"));
    s.set_attribute("program_version", version_string());
    s.set_attribute("start_utc", utc_now());
    s.set_attribute("command_line", command_line_);
    s.set_attribute("num_ranks", std::int64_t(nranks_));
    s.set_attribute("threads_per_rank", std::int64_t(threads_));  // rank 0's (--threads, or its share of the cores)
    s.set_attribute("absent_datasets", std::string(kAbsent));
    s.set_attribute("compared_as", measure::compare_as_name(as_));
    std::vector<std::string> paths, shapes, dtypes, compared_dtypes, tensor_kinds;
    std::vector<double> steps, numel, kind_numel(kinds.size(), 0.0);
    for (const auto& [step, path] : series_) steps.push_back(double(step)), paths.push_back(path);
    for (const MeasuredTensor& t : tensors_) {
      std::string shape;
      for (const std::int64_t d : t.shape) shape += (shape.empty() ? "" : "x") + std::to_string(d);
      shapes.push_back(shape);
      dtypes.push_back(t.dtype);
      compared_dtypes.push_back(compared_dtype(dtypes.size() - 1));
      numel.push_back(double(t.numel));
      const measure::TensorKind kind = measure::classify_tensor(t.name);
      tensor_kinds.push_back(measure::tensor_kind_name(kind));
      kind_numel[std::size_t(kind)] += double(t.numel);
    }
    s.set_attribute("checkpoints", paths);
    // What else the first checkpoint holds, for the record: its folder's other files and the
    // safetensors __metadata__ of each file.
    const io::ModelState first = io::ModelState::open(series_[0].second, {}, io::ShardBytes::header_only);
    std::vector<std::string> files, metadata, left_out;
    const cli::FolderFilter filter = o_.filter();
    for (const io::OtherFile& f : first.other_files())
      (filter.keeps(f.name) ? files : left_out).push_back(f.name + " (" + std::to_string(f.bytes) + " bytes)");
    for (const io::SafetensorsFile& shard : first.shards())
      if (first.is_folder() && !filter.keeps(relative_name(first, shard.path())))
        left_out.push_back(relative_name(first, shard.path()));
    for (const io::SafetensorsFile& shard : first.shards())
      for (const auto& [key, value] : shard.metadata())
        metadata.push_back(std::filesystem::path(shard.path()).filename().string() + ": " + key + "=" + value);
    if (!files.empty()) s.set_attribute("checkpoint_other_files", files);
    if (!left_out.empty()) s.set_attribute("checkpoint_left_out_files", left_out);
    if (!metadata.empty()) s.set_attribute("checkpoint_metadata", metadata);
    s.set_attribute("checkpoint_steps", steps);
    s.set_attribute("tensor_names", names);
    s.set_attribute("tensor_shapes", shapes);
    s.set_attribute("tensor_dtypes", dtypes);
    s.set_attribute("tensor_compared_dtypes", compared_dtypes);
    s.set_attribute("tensor_numel", numel);
    s.set_attribute("tensor_kinds", tensor_kinds);
    s.set_attribute("kind_names", kinds);
    s.set_attribute("kind_numel", kind_numel);
    s.set_attribute("num_parameters", std::int64_t(numel_));
    s.set_attribute("unit_bytes", std::int64_t(o_.unit_mb * (1 << 20)));
    // What the run was, as --set and --label say (never guessed from the checkpoints), except
    // that the BF16 view of an FP32 series is the mixed-precision regime by what is compared.
    s.set_attribute("config", config_.toml());
    if (!o_.label.empty()) s.set_attribute("label", o_.label);
    if (!config_.text("model").empty()) s.set_attribute("model", config_.text("model"));
    const bool fp32_master_view = as_ == measure::CompareAs::bf16 &&
                                  std::all_of(cast_.begin(), cast_.end(), [](bool cast) { return cast; });
    const std::string precision = config_.text("precision");
    s.set_attribute("precision", !precision.empty() ? precision : fp32_master_view ? "mixed" : "checkpoint");
    const std::string trainer_sync = config_.text("trainer-sync");
    s.set_attribute("trainer_sync", trainer_sync.empty() ? std::string("unknown") : trainer_sync);  // not ddp
  }

  // One thread's part of the rank's share: units [first_unit, last_unit), the history of their
  // blocks, and per checkpoint of the batch the patch of the unit being sized, its sums and a
  // cast block (and one for the checkpoint before the batch).
  struct Worker {
    Worker(std::size_t first, std::size_t last, const std::vector<int>& ks)
        : first_unit(first), last_unit(last), history(ks) {}
    std::size_t first_unit, last_unit;
    measure::KStepHistory history;
    std::vector<measure::UnitPatchSize> patches;
    std::vector<std::vector<std::byte>> cast;     // the versions' blocks cast, as measure_units' versions
    std::vector<std::vector<std::int64_t>> sums;  // per checkpoint of the batch, as measure_batch's
    std::vector<double> encode_s;                 // per checkpoint of the batch
  };

  // A worker's units of a batch (see measure_batch): versions[0] is the checkpoint before the
  // batch (null before the first), versions[j + 1] the batch's checkpoint j.
  void measure_units(Worker& w, const std::vector<measure::CheckpointReader*>& versions,
                     const std::vector<std::unique_ptr<measure::CheckpointReader>>& next) {
    const std::size_t nt = tensors_.size();
    const std::size_t measured = versions[0] ? 0 : 1;  // the batch's first checkpoint with one before it
    const std::size_t batch = versions.size() - 1;
    std::vector<const std::byte*> pieces(versions.size()), blocks(versions.size(), nullptr);
    std::vector<std::int64_t*> differing;  // per checkpoint of the batch: its counts k steps back
    for (std::vector<std::int64_t>& sums : w.sums) differing.push_back(sums.data() + nt);
    for (std::size_t u = w.first_unit; u < w.last_unit; ++u) {
      for (const auto& reader : next) reader->read_ahead(tensors_, units_[u]);
      for (measure::UnitPatchSize& patch : w.patches) patch.clear();
      for (const Piece& p : units_[u].pieces) {
        const MeasuredTensor& t = tensors_[p.tensor];
        const bool cast = cast_[p.tensor];
        const std::size_t esz = compared_bytes(p.tensor), n = std::size_t(p.end - p.begin);
        for (std::size_t v = 0; v < versions.size(); ++v)
          pieces[v] = versions[v] ? versions[v]->data(t, p.begin, p.end) : nullptr;
        const bool whole = p.begin == 0 && p.end == t.numel;
        const std::string name =
            whole ? t.name : t.name + "[" + std::to_string(p.begin) + ":" + std::to_string(p.end) + "]";
        for (std::size_t j = measured; j < batch; ++j) w.patches[j].add_tensor(name, compared_dtype(p.tensor), n);
        if (measured >= batch) continue;  // the series' first checkpoint: mapped, compared with none
        for (std::size_t b = 0; b < n; b += kBlockElements) {
          const std::size_t m = std::min(kBlockElements, n - b);
          for (std::size_t v = measured; v < versions.size(); ++v) {
            blocks[v] = pieces[v] + b * t.element_bytes;
            if (cast) measure::cast_block(as_, blocks[v], m, w.cast[v].data()), blocks[v] = w.cast[v].data();
          }
          for (std::size_t j = measured; j < batch; ++j) {
            const std::byte* now = blocks[j + 1];
            const std::byte* before = blocks[j];
            std::vector<std::int64_t>& sums = w.sums[j];
            const std::vector<std::uint16_t>& changed = w.history.record(j, now, before, m, esz, sums.data() + nt);
            sums[p.tensor] += std::int64_t(changed.size());
            const auto e0 = std::chrono::steady_clock::now();
            if (esz == 4)
              w.patches[j].add_block<std::uint32_t>(b, changed, now, before);
            else
              w.patches[j].add_block<std::uint16_t>(b, changed, now, before);
            w.encode_s[j] += seconds_since(e0);
          }
          w.history.count(blocks, m, esz, differing);
        }
      }
      for (std::size_t j = measured; j < batch; ++j) {
        const auto e0 = std::chrono::steady_clock::now();
        w.sums[j][nt + ks_.size()] += std::int64_t(w.patches[j].bytes(o_.level));
        w.encode_s[j] += seconds_since(e0);
      }
      // The batch's last checkpoint is the next batch's first version: it stays mapped.
      for (std::size_t v = 0; v + 1 < versions.size(); ++v)
        if (versions[v]) versions[v]->release(tensors_, units_[u]);
    }
  }

  // Compares each checkpoint of a batch (first, first + 1, ...) with the one before it block by
  // block, as mapped from the page cache: records the changes of a block of each checkpoint in
  // turn in a new log (counted, and sized as a patch), then reverts a copy of the block before the
  // batch's last checkpoint with the older logs, newest first, comparing the version reached at
  // each step with the blocks of the checkpoints k steps after it. Meanwhile the kernel reads the
  // next batch's unit ahead, unit by unit (a window of one unit of each, not a second share at
  // once). Writes a row per checkpoint.
  void measure_batch(std::size_t first, measure::CheckpointReader* previous,
                     const std::vector<std::unique_ptr<measure::CheckpointReader>>& batch,
                     const std::vector<std::unique_ptr<measure::CheckpointReader>>& next,
                     std::chrono::steady_clock::time_point t0, double cpu0) {
    const std::size_t nt = tensors_.size(), nk = ks_.size();
    std::vector<std::int64_t> steps;
    for (std::size_t j = 0; j < batch.size(); ++j) steps.push_back(series_[first + j].first);
    std::vector<measure::CheckpointReader*> versions = {previous};
    for (const auto& reader : batch) versions.push_back(reader.get());
    // sums over ranks: tensor_changed (nt), elements changed since k steps back (nk), patch bytes (1)
    for (const auto& w : workers_) {
      w->history.start(steps, previous ? std::optional<std::int64_t>(series_[first - 1].first) : std::nullopt);
      w->sums.assign(batch.size(), std::vector<std::int64_t>(nt + nk + 1, 0));
      w->encode_s.assign(batch.size(), 0);
      w->patches.resize(batch.size());
      w->cast.resize(batch.size() + 1, std::vector<std::byte>(kBlockElements * 2));
    }
    // This rank's share: a file cut short or unreadable fails it here alone, so every rank
    // agrees on the outcome before the reductions below (comm/agree.hpp).
    agree_on_error(MPI_COMM_WORLD, [&] {
      sync::parallel_for(unsigned(workers_.size()), workers_.size(),
                         [&](std::size_t w) { measure_units(*workers_[w], versions, next); });
    });
    // The checkpoints of a batch share its time alike.
    const double measure_s = seconds_since(t0) / double(batch.size());
    const double cpu_s = (cpu_seconds() - cpu0) / double(batch.size());
    for (std::size_t j = 0; j < batch.size(); ++j) {
      std::vector<std::int64_t> sums(nt + nk + 1, 0);
      double encode_s = 0;  // over the threads
      for (const auto& w : workers_) {
        for (std::size_t c = 0; c < sums.size(); ++c) sums[c] += w->sums[j][c];
        encode_s += w->encode_s[j];
      }
      write_row(first + j, sums, encode_s, measure_s, cpu_s);
    }
  }

  // Checkpoint i's row from this rank's sums (see measure_batch) and times.
  void write_row(std::size_t i, const std::vector<std::int64_t>& sums, double encode_s, double measure_s, double cpu_s) {
    const std::int64_t step = series_[i].first;
    const std::size_t nt = tensors_.size(), nk = ks_.size();
    std::vector<std::int64_t> total(sums.size(), 0);
    MPI_Reduce(sums.data(), total.data(), int(sums.size()), MPI_INT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
    double slowest[2] = {0, 0};
    const double mine[2] = {encode_s, measure_s};
    MPI_Reduce(mine, slowest, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (i == 0) return;  // the first checkpoint is the base of the first row
    io::StatsRow row;
    if (rank_ == 0) {
      std::int64_t changed = 0;
      std::vector<std::int64_t> per_kind(measure::all_tensor_kinds().size(), 0), kind_numel(per_kind.size(), 0);
      for (std::size_t t = 0; t < nt; ++t) {
        changed += total[t];
        const auto kind = std::size_t(measure::classify_tensor(tensors_[t].name));
        per_kind[kind] += total[t];
        kind_numel[kind] += tensors_[t].numel;
      }
      std::vector<double> kind_sparsity, kstep;
      for (std::size_t k = 0; k < per_kind.size(); ++k)
        kind_sparsity.push_back(kind_numel[k] ? 1.0 - double(per_kind[k]) / double(kind_numel[k])
                                              : std::numeric_limits<double>::quiet_NaN());
      for (std::size_t k = 0; k < nk; ++k)
        kstep.push_back(held_globally(step - ks_[k], i) ? 1.0 - double(total[nt + k]) / double(numel_)
                                                                : std::numeric_limits<double>::quiet_NaN());
      const std::int64_t patch = total[nt + nk];
      row.set_int("/steps/step", step);
      row.set_int("/steps/steps_apart", step - series_[i - 1].first);
      row.set_int("/steps/changed", changed);
      row.set("/steps/sparsity", 1.0 - double(changed) / double(numel_));
      row.set_int("/steps/tensor_changed", std::vector<std::int64_t>(total.begin(), total.begin() + std::ptrdiff_t(nt)));
      row.set_int("/steps/patch_bytes", patch);
      row.set_int("/steps/dense_bytes", std::int64_t(dense_bytes_));
      row.set("/steps/bits_per_changed", changed ? 8.0 * double(patch) / double(changed) : std::nan(""));
      row.set("/steps/encode_s", slowest[0]);
      row.set("/steps/measure_s", slowest[1]);
      row.set("/kstep/sparsity", kstep);
      row.set_int("/kinds/changed", per_kind);
      row.set("/kinds/sparsity", kind_sparsity);
      totals_.add(changed, patch, std::int64_t(dense_bytes_), 1.0 - double(changed) / double(numel_), kstep);
    }
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    row.set_rank_int("/ranks/read_bytes", std::int64_t(share_bytes_));
    row.set_rank("/ranks/measure_s", measure_s);
    row.set_rank("/ranks/cpu_s", cpu_s);
    row.set_rank_int("/ranks/max_rss_bytes", std::int64_t(usage.ru_maxrss) * 1024);
    stats_->append(row);
  }

  // Whether the checkpoint of this step precedes checkpoint i in the series (every rank holds
  // the same steps, including a rank with an empty share).
  bool held_globally(std::int64_t step, std::size_t i) const {
    for (std::size_t j = 0; j < i; ++j)
      if (series_[j].first == step) return true;
    return false;
  }

  Options o_;
  std::vector<std::pair<std::int64_t, std::string>> series_;
  std::vector<MeasuredTensor> tensors_;
  measure::CompareAs as_;
  measure::RunConfig config_;
  std::vector<bool> cast_;  // per tensor: compared as its 16-bit cast
  std::string command_line_;
  int rank_ = 0, nranks_ = 1;
  std::vector<Unit> units_;
  std::size_t first_unit_ = 0, last_unit_ = 0;
  std::uint64_t share_bytes_ = 0, dense_bytes_ = 0, stored_bytes_ = 0;  // dense: as compared; stored: as read
  std::int64_t numel_ = 0;
  std::vector<int> ks_;          // k-step distances measured
  unsigned threads_ = 1;
  std::vector<std::unique_ptr<Worker>> workers_;  // one per thread with units
  struct Totals {  // over the rows (rank 0)
    std::int64_t rows = 0, changed = 0, patch = 0, dense = 0;
    double sparsity_sum = 0, min_sparsity = 1;
    std::vector<double> kstep_sum;
    std::vector<std::int64_t> kstep_rows;
    void add(std::int64_t c, std::int64_t p, std::int64_t d, double sparsity, const std::vector<double>& kstep) {
      ++rows, changed += c, patch += p, dense += d, sparsity_sum += sparsity;
      min_sparsity = std::min(min_sparsity, sparsity);
      kstep_sum.resize(kstep.size(), 0.0), kstep_rows.resize(kstep.size(), 0);
      for (std::size_t j = 0; j < kstep.size(); ++j)
        if (std::isfinite(kstep[j])) kstep_sum[j] += kstep[j], ++kstep_rows[j];
    }
  } totals_;
  std::unique_ptr<io::StatsFile> stats_;
  bool wrote_output_ = false;
};

// A checkpoint file cut short while mapped (rewritten in place during the run) raises SIGBUS at
// the first access past its new end: one line and exit 1, not a crash report.
extern "C" void file_cut_short(int) {
  static const char message[] = "pulse-measure: a checkpoint file was cut short while being measured (SIGBUS)\n";
  (void)!::write(STDERR_FILENO, message, sizeof message - 1);
  ::_exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  struct sigaction on_bus {};
  on_bus.sa_handler = file_cut_short;
  sigaction(SIGBUS, &on_bus, nullptr);  // after MPI_Init, which installs its own
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int code = 0;
  {
    Kokkos::ScopeGuard kokkos;  // no argv: --help is ours
    Options o;
    CLI::App app{"pulse-measure: per-step and k-step BF16/F16/F32 weight sparsity of a run's checkpoints"};
    cli::set_conventions(app, "pulse-measure");
    app.add_option("checkpoints", o.checkpoints, "checkpoints in step order: .safetensors files or Hugging Face folders");
    app.add_option("--glob", o.glob_pattern, "checkpoints matching this pattern, ordered by the step number in the names");
    std::string steps_list;
    app.add_option("--steps", steps_list, "comma-separated step of each checkpoint, in the order given (with --glob: "
                                          "alphabetical order); default 0, 1, 2, ... or the numbers in --glob names");
    app.add_option("-o,--out", o.out, "HDF5 statistics file to write (pulse-train's schema)")->required();
    app.add_flag("--overwrite", o.overwrite, "replace --out if it exists");
    app.add_option("--unit-mb", o.unit_mb, "MiB of weights per work unit (one patch each; large tensors are cut)")
        ->check(CLI::Range(0.001, 1e6))
        ->capture_default_str();
    app.add_option("--max-k", o.max_k, "largest k of the k-step sparsity (k = 1, 2, 4, ..., 32); the history holds "
                                       "the changes of the last max-k checkpoints of each rank's share")
        ->check(CLI::Range(1, 32))
        ->capture_default_str();
    app.add_option("--threads", o.threads, "threads per rank, each measuring a contiguous part of its share (0: the "
                                           "rank's share of the cores it may run on among its node's ranks; the "
                                           "output does not depend on it)")
        ->check(CLI::Range(0u, 1024u))
        ->capture_default_str();
    app.add_option("--level", o.level, "zstd level of the patches")->check(CLI::Range(-7, 22))->capture_default_str();
    app.add_option("--as", o.as, "compare FP32 tensors as their BF16 or F16 cast (round to nearest even, what the "
                                 "forward pass reads) or as stored (raw); default bf16 when every tensor is FP32, raw "
                                 "otherwise")
        ->check(CLI::IsMember({"bf16", "f16", "raw"}));
    app.add_option("--set", o.settings, "describe the run: key=value into the file's config (lr=3e-6, precision=bf16, "
                                        "model=..., seed=2; repeat --set for each); the report groups runs by them")
        ->expected(1)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
        ->allow_extra_args(false);
    app.add_option("--label", o.label, "the run's name in the report (config key label)");
    app.add_option("--include", o.include, "read only a folder's files matching this glob (repeatable; paths relative "
                                           "to the folder, or file names); names a Trainer file to keep it")
        ->expected(1)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
        ->allow_extra_args(false);
    app.add_option("--exclude", o.exclude, "leave out a folder's files matching this glob (repeatable); the Hugging "
                                           "Face Trainer's (optimizer.pt, scheduler.pt, rng_state*.pth, "
                                           "trainer_state.json, training_args.bin) are left out by default")
        ->expected(1)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
        ->allow_extra_args(false);
    app.add_flag("-q,--quiet", o.quiet, "no progress lines");
    app.add_flag_callback(
        "--print-schema",
        [rank] {
          if (rank == 0) std::cout << measure::measure_schema_markdown();
          throw CLI::Success();
        },
        "print the statistics file's datasets (path, shape, type, units, description) as a Markdown table and exit");
    cli::JsonSummary summary(app, "pulse-measure");
    std::string command_line;
    for (int i = 0; i < argc; ++i) command_line += (i ? " " : "") + std::string(argv[i]);
    bool parsed = false;
    try {
      app.parse(argc, argv);
      parsed = true;
    } catch (const CLI::ParseError& e) {
      code = cli::exit_on_parse_error(app, e, "pulse-measure", rank == 0);
    }
    // Collective, so before any check that one rank alone could fail.
    if (parsed && o.threads == 0) o.threads = measure::default_rank_threads(MPI_COMM_WORLD);
    if (parsed) {
      std::unique_ptr<Measurement> m;
      try {
        // Everything is checked on every rank alike before the output is created: a bad series
        // exits with one line and writes nothing.
        o.steps = measure::parse_steps(steps_list);
        const measure::RunConfig config = measure::parse_run_config(o.settings, o.label);
        const auto series = measure::resolve_series(o.checkpoints, o.glob_pattern, o.steps);
        summary.set("checkpoints", series.size());
        const io::ModelState first = io::ModelState::open(series[0].second, {}, io::ShardBytes::header_only);
        const std::vector<MeasuredTensor> tensors = measured_tensors(first, o.filter());
        if (tensors.empty())
          throw Error(series[0].second + ": holds no BF16, F16 or F32 tensor to measure" +
                      (o.include.empty() && o.exclude.empty() ? "" : " in the files --include/--exclude keep"));
        check_series(series, tensors, o.filter());
        std::vector<std::string> names;
        for (const io::OtherFile& f : first.other_files()) names.push_back(f.name);
        for (const io::SafetensorsFile& shard : first.shards())
          if (first.is_folder()) names.push_back(relative_name(first, shard.path()));
        const std::string left_out = o.filter().left_out_line(names);
        const measure::CompareAs as = compare_as(o.as, tensors);
        summary.set("compared_as", measure::compare_as_name(as));
        std::vector<std::string> inputs;
        for (const auto& s : series) inputs.push_back(s.second);
        cli::refuse_output_over_inputs(o.out, "--out", inputs);  // even with --overwrite
        if (!o.overwrite && std::filesystem::exists(o.out))
          throw Error(o.out + ": exists (give --overwrite to replace it)");
        const std::filesystem::path out_dir = std::filesystem::absolute(o.out).parent_path();
        if (!std::filesystem::is_directory(out_dir)) throw Error(o.out + ": folder " + out_dir.string() + " does not exist");
        m = std::make_unique<Measurement>(o, series, tensors, as, config, command_line);
        if (rank == 0 && !o.quiet && !left_out.empty())
          std::fprintf(stderr, "pulse-measure: %s: %s\n", series[0].second.c_str(), left_out.c_str());
        if (rank == 0 && !o.quiet && o.as.empty() && as != measure::CompareAs::raw)
          std::fprintf(stderr, "pulse-measure: every tensor is FP32: comparing their BF16 cast (round to nearest even, "
                               "as the forward pass reads them); --as raw compares the FP32 bits\n");
      } catch (const std::exception& e) {
        if (rank == 0) std::cerr << "pulse-measure: " << e.what() << "\n";
        code = 1;
      }
      if (m) {
        try {
          m->run();
          if (rank == 0) {
            summary.set("figures", m->figures());
            if (!o.quiet) std::fprintf(stderr, "pulse-measure: %s\n", m->figures_line().c_str());
          }
        } catch (const AgreedError& e) {
          // Met by every rank alike (comm/agree.hpp): one line, no file left that blocks the rerun.
          const bool incomplete_output = m->wrote_output();
          m.reset();  // closes the statistics file (rank 0), which this run's rows left incomplete
          if (rank == 0) {
            std::error_code ec;
            if (incomplete_output) std::filesystem::remove(o.out, ec);
            std::cerr << "pulse-measure: " << e.what() << "\n";
          }
          code = 1;
        } catch (const std::exception& e) {
          // One rank's error alone, while the others may wait in a collective call: only
          // MPI_Abort ends them.
          std::cerr << "pulse-measure: rank " << rank << ": " << e.what() << "\n";
          std::cerr.flush();
          MPI_Abort(MPI_COMM_WORLD, 1);
        }
      }
      summary.print(code, rank == 0);
    }
  }
  MPI_Finalize();
  return code;
}
