// pulse-sync: PULSESync patches on Hugging Face safetensors checkpoints: a .safetensors file or
// a model folder (shards + index, config and tokenizer files) wherever a checkpoint is taken.
//   pulse-sync diff A B [--json]                changed counts and sparsity per tensor
//   pulse-sync encode --base A --target B -o P  write the patch A -> B
//   pulse-sync apply --base A --patch P -o OUT  (or --in-place FILE) apply it, transactionally
//                                               (file to file and folder to folder: streamed, sync/file_apply.hpp)
//   pulse-sync verify FILE [--digest D] [--json] print or check the state digest
//   pulse-sync inspect P [--json]               header and entries of a patch
//   pulse-sync keygen --public K.pub --secret K.sec [--force]
//   pulse-sync publish --relay DIR --version V FILE [--previous PREV] [--sign K.sec] [--threads N]
//   pulse-sync pull --relay DIR -o OUT [--have FILE --have-version V] [--min-version V] [--public-key K.pub] [--threads N]
// Every A, B, FILE, OUT may be a model folder (src/sync/FORMAT.md, "Model folders"); a folder is
// written whole next to the old one and swapped in, so a failure leaves the old folder as it was.
#include <CLI/CLI.hpp>
#include <Kokkos_Core.hpp>
#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>

#include "cli/conventions.hpp"
#include "cli/json_summary.hpp"
#include "cli/unsigned_option.hpp"
#include "cli/output_path.hpp"
#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "core/file_read.hpp"
#include "kernels/sparsity.hpp"
#include "io/folder_swap.hpp"
#include "sync/checkpoint.hpp"
#include "sync/codec_choice.hpp"
#include "sync/file_apply.hpp"
#include "coding/parallel.hpp"
#include "sync/patch.hpp"
#include "sync/patch_summary.hpp"
#include "sync/relay.hpp"
#include "sync/relay_names.hpp"
#include "coding/signing.hpp"
#include "sync/streamed_state.hpp"

using namespace pulse;
using namespace pulse::sync;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Versions on the command line: canonical unsigned decimals in range (no sign, wrap or saturation).
const CLI::Validator kVersionNumber(
    [](std::string& text) {
      return parse_canonical_version(text) ? std::string() : "'" + text + "' is not a version (0 to 2^64-1, in decimal)";
    },
    "VERSION");

// A checkpoint on the command line: a file or a model folder. A folder left missing by an
// interrupted swap (io/folder_swap.hpp) is put back first.
const CLI::Validator kExistingState(
    [](std::string& path) {
      try {
        io::recover_folder_swap(path);
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return CLI::ExistingPath(path);
    },
    "PATH");

using cli::same_file;

// How an existing folder at `out` may be replaced: it is the base being updated, the user said
// --replace, or only when nothing in it is lost (sync/checkpoint.hpp).
ReplaceFolder replace_mode(const std::string& out, const std::string& base, bool replace) {
  if (replace) return ReplaceFolder::any_model;
  return !base.empty() && same_file(out, base) ? ReplaceFolder::own_base : ReplaceFolder::if_nothing_lost;
}

// The secret key from path into storage, or nullptr (no signing) when path is empty.
const SecretKey* signing_key(const std::string& path, SecretKey& storage) {
  if (path.empty()) return nullptr;
  storage = read_secret_key(path);
  return &storage;
}

// "12.3x smaller than dense" or "1.4x larger than dense": never a ratio below 1 called smaller.
std::string versus_dense(std::uint64_t patch_bytes, std::uint64_t dense_bytes) {
  char text[64];
  if (patch_bytes <= dense_bytes)
    std::snprintf(text, sizeof text, "%.1fx smaller than dense", patch_bytes ? double(dense_bytes) / patch_bytes : 0.0);
  else
    std::snprintf(text, sizeof text, "%.2fx larger than dense", dense_bytes ? double(patch_bytes) / dense_bytes : 0.0);
  return text;
}


// One line per dtype of a patch's summary: changed counts and sparsity for sparse-coded
// dtypes, bytes carried whole for the others.
void print_summary(const std::vector<DtypeSummary>& summary) {
  for (const auto& s : summary) {
    std::printf("  %-12s %4llu tensors %12llu elements", s.dtype.c_str(), static_cast<unsigned long long>(s.tensors),
                static_cast<unsigned long long>(s.elements));
    if (is_sparse_dtype(s.dtype))
      std::printf(" %12llu changed (sparsity %.4f%%)", static_cast<unsigned long long>(s.changed),
                  sparsity_percent(s.changed, s.elements));
    if (s.whole_bytes) std::printf(" %llu bytes carried whole", static_cast<unsigned long long>(s.whole_bytes));
    std::printf("\n");
  }
}

// The comparison of two checkpoints (sync/patch_summary.hpp) and the paths compared.
int cmd_diff(const std::string& a_path, const std::string& b_path, bool json, unsigned threads) {
  const StreamedState a = StreamedState::open(a_path), b = StreamedState::open(b_path);
  nlohmann::json d = nlohmann::json::parse(diff_json(diff_states(a, b, threads)));
  d["a"] = a_path, d["b"] = b_path;
  if (json) {
    std::printf("%s\n", cli::json_text(d).c_str());
    return 0;
  }
  std::printf("%-48s %8s %12s %12s %10s\n", "tensor", "dtype", "elements", "changed", "sparsity");
  for (const auto& t : d["tensors"]) {
    const std::string name = t["name"], dtype = t["dtype"];
    if (t.contains("status"))
      std::printf("%-48s %8s %s in %s\n", name.c_str(), dtype.c_str(), t["status"].get<std::string>().c_str(),
                  b_path.c_str());
    else if (t.contains("differs"))
      std::printf("%-48s %8s %12s %12s %10s\n", name.c_str(), dtype.c_str(), "-", t["differs"].get<bool>() ? "differs" : "same", "-");
    else
      std::printf("%-48s %8s %12llu %12llu %9.4f%%\n", name.c_str(), dtype.c_str(), t["elements"].get<unsigned long long>(),
                  t["changed"].get<unsigned long long>(), t["sparsity_percent"].get<double>());
  }
  for (const auto& [dtype, t] : d["totals"].items()) {
    if (t.contains("differing_tensors"))
      std::printf("total %s: %llu tensors differ\n", dtype.c_str(), t["differing_tensors"].get<unsigned long long>());
    else
      std::printf("total %s: %llu elements, %llu changed, sparsity %.4f%%\n", dtype.c_str(),
                  t["elements"].get<unsigned long long>(), t["changed"].get<unsigned long long>(),
                  t["sparsity_percent"].get<double>());
  }
  std::printf("metadata: %s\n", d["metadata_changed"].get<bool>() ? "changed" : "same");
  return 0;
}

// A coding table's names less one: the history codings need a change history that sender and
// receiver keep from version to version, which a patch file's receiver does not.
template <class E, std::size_t N>
std::vector<std::string> names_without(const NamedValue<E> (&names)[N], E left_out) {
  std::vector<std::string> out;
  for (const NamedValue<E>& n : names)
    if (n.value != left_out) out.push_back(n.name);
  return out;
}

struct EncodeArgs {
  std::string base, target, out, sign;
  std::string values = value_coding_name(EncodeOptions{}.values), indices = index_coding_name(EncodeOptions{}.indices),
              compressor = compressor_name(EncodeOptions{}.compressor);
  std::string codec, bandwidth = "10Gbit";
  int level = 3;
  unsigned threads = 0;  // parts coded at once; 0: the cores
  std::uint64_t base_version = 0, target_version = 1;
};

int cmd_encode(const EncodeArgs& args) {
  cli::refuse_output_over_inputs(args.out, "encode: -o", {args.base, args.target, args.sign});
  EncodeOptions opt;
  opt.values = parse_value_coding(args.values);
  // expclass codes indices and values together: naming it for the values is enough.
  opt.indices = opt.values == ValueCoding::exponent_class ? IndexCoding::exponent_class : parse_index_coding(args.indices);
  opt.compressor = parse_compressor(args.compressor);
  opt.level = args.level;
  opt.threads = args.threads;
  opt.base_version = args.base_version;
  opt.target_version = args.target_version;
  SecretKey key;
  opt.signing_key = signing_key(args.sign, key);
  // Streamed (a tensor of each in memory at a time), except where --codec auto measures every
  // codec on the states in memory.
  const StreamedState base_state = StreamedState::open(args.base), target_state = StreamedState::open(args.target);
  const auto &base = base_state.tensors(), &target = target_state.tensors();
  if (args.codec == "auto") {
    const double bits_per_second = parse_bandwidth(args.bandwidth);
    const OpenState base_whole = open_state(args.base), target_whole = open_state(args.target);
    const auto measured = measure_codecs(base_whole.flat.tensors, target_whole.flat.tensors);
    const std::size_t best = best_codec(measured, bits_per_second);
    std::printf("codec choice at %s (%.3g bit/s): T = encode + 8 S / B + apply, measured here on this patch\n",
                args.bandwidth.c_str(), bits_per_second);
    std::printf("  %-16s %12s %10s %10s %12s %10s\n", "codec", "bytes", "encode s", "apply s", "transfer s", "total s");
    for (std::size_t i = 0; i < measured.size(); ++i) {
      const auto& m = measured[i];
      std::printf("%c %-16s %12zu %10.4f %10.4f %12.4f %10.4f\n", i == best ? '*' : ' ', m.name.c_str(), m.patch_bytes,
                  m.encode_seconds, m.apply_seconds, 8.0 * m.patch_bytes / bits_per_second, m.total_seconds(bits_per_second));
    }
    // Where the choice would change: the crossover with each candidate that is faster but larger.
    for (std::size_t i = 0; i < measured.size(); ++i) {
      const auto &a = measured[best], &b = measured[i];
      const double dt = (b.encode_seconds + b.apply_seconds) - (a.encode_seconds + a.apply_seconds);
      if (i == best || b.patch_bytes <= a.patch_bytes || dt >= 0) continue;
      std::printf("  %s beats %s above B* = 8 (S_b - S_a) / (t_a - t_b) = %.3g bit/s\n", b.name.c_str(), a.name.c_str(),
                  8.0 * double(b.patch_bytes - a.patch_bytes) / -dt);
    }
    std::printf("chose %s\n", measured[best].name.c_str());
    const SecretKey* key_ptr = opt.signing_key;
    opt = measured[best].options;
    opt.signing_key = key_ptr;
    opt.base_version = args.base_version;
    opt.target_version = args.target_version;
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::uint8_t> patch;
  try {
    patch = encode_patch(base, target, opt, nullptr, nullptr, base_state.metadata(), target_state.metadata(),
                         base_state.loader(), target_state.loader());
  } catch (const std::bad_alloc&) {
    throw_out_of_memory("encode", std::max(encode_unit_bytes(base, opt), encode_unit_bytes(target, opt)),
                        2 * resolve_threads(opt.threads), "a segment of each state per thread");
  }
  const double seconds = seconds_since(t0);
  write_file_atomically(args.out, patch.data(), patch.size());
  const ParsedPatch p = parse_patch(patch.data(), patch.size());
  std::uint64_t dense = 0;
  for (const auto& t : target) dense += t.bytes;
  std::printf("wrote %s: %zu bytes, %s, %llu elements changed in sparse-coded tensors, %.2f bits per change, "
              "encoded in %.3f s\n",
              args.out.c_str(), patch.size(), versus_dense(patch.size(), dense).c_str(),
              static_cast<unsigned long long>(p.header.total_changed),
              p.header.total_changed ? 8.0 * patch.size() / p.header.total_changed : 0.0, seconds);
  print_summary(p.summary);
  if (p.header.changes_layout)
    std::printf("  layout: %zu tensors removed, %zu added\n", p.removed.size(), p.added.size());
  if (p.header.changes_metadata) std::printf("  metadata changed (carried whole)\n");
  return 0;
}

// A .safetensors file to a .safetensors file, and a folder to a folder, stream
// (sync/file_apply.hpp): the base is copied into the output and patched there, never loaded.
// Compressed files and patches that change the layout, the metadata or a folder's index load
// the base whole; so does everything with stream false.
int cmd_apply(const std::string& base, const std::string& patch_path, const std::string& out,
              const std::string& public_key_path, bool stream, unsigned threads, bool replace) {
  cli::refuse_output_over_inputs(out, "apply: the output", {patch_path, public_key_path});
  threads = resolve_threads(threads);
  PublicKey key;
  if (!public_key_path.empty()) key = read_public_key(public_key_path);
  struct stat st {};
  const bool plain_file = stream && ::stat(base.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
                          !(base.size() > 4 && base.compare(base.size() - 4, 4, ".zst") == 0);
  std::optional<io::SafetensorsFile> header;  // a plain file's header bounds the patch
  std::optional<OpenState> folder_headers;     // a folder's: its headers and other files
  std::optional<Checkpoint> state;
  if (plain_file)
    header.emplace(io::SafetensorsFile::open_header(base));
  else if (stream && std::filesystem::is_directory(base))
    folder_headers.emplace(open_state(base, io::ShardBytes::header_only));
  else
    state.emplace(load_checkpoint(base));
  const std::vector<TensorRef> layout = header           ? tensor_refs(*header)
                                        : folder_headers ? folder_headers->flat.tensors
                                                         : state->layout;
  PatchLimits limits;
  limits.max_patch_bytes = patch_bytes_limit(layout);
  const auto bytes = read_regular_file(patch_path, limits.max_patch_bytes, "patch");
  const ParsedPatch patch = parse_patch(bytes.data(), bytes.size(), limits, public_key_path.empty() ? nullptr : &key);
  double seconds = 0;
  bool folder = false;
  std::uint64_t largest = 0;
  for (const auto& t : layout) largest = std::max<std::uint64_t>(largest, t.bytes);
  if (plain_file && file_apply_fits(base, out, layout, patch)) {
    try {
      apply_file(base, patch, out, threads, &seconds);
    } catch (const std::bad_alloc&) {
      throw_out_of_memory("apply", largest, 1);
    }
  } else if (folder_headers && folder_apply_fits(*folder_headers, out, patch)) {
    try {
      apply_folder(*folder_headers, patch, out, replace_mode(out, base, replace), threads, &seconds);
    } catch (const std::bad_alloc&) {
      throw_out_of_memory("apply", largest, 1);
    }
    folder = true;
  } else {
    if (!state) state.emplace(load_checkpoint(base));
    const auto t0 = std::chrono::steady_clock::now();
    apply_to_checkpoint(patch, *state, threads);
    seconds = seconds_since(t0);
    folder = save_state(out, *state, replace_mode(out, base, replace));
  }
  std::printf("applied %s (version %llu -> %llu) in %.3f s, target state digest %s verified (tensors and metadata); "
              "wrote %s%s\n",
              patch_path.c_str(), static_cast<unsigned long long>(patch.header.base_version),
              static_cast<unsigned long long>(patch.header.target_version), seconds,
              to_hex(patch.header.target_state).c_str(), folder ? "the folder " : "", out.c_str());
  print_summary(patch.summary);
  if (patch.header.changes_layout)
    std::printf("  layout: %zu tensors removed, %zu added\n", patch.removed.size(), patch.added.size());
  if (patch.header.changes_metadata) std::printf("  metadata changed\n");
  return 0;
}

int cmd_verify(const std::string& path, const std::string& expected, bool json, unsigned threads) {
  const StreamedState state = StreamedState::open(path);  // hashed in pieces, tensors on the threads
  std::vector<Digest> digests(state.tensors().size());
  parallel_for(threads, digests.size(), [&](std::size_t i) { digests[i] = state.digest(i); });
  const Digest d = state_digest(state.tensors(), digests, state.metadata());
  const bool verified = expected.empty() || d == digest_from_hex(expected);
  if (json) {
    nlohmann::json out = {{"file", path}, {"state_digest", to_hex(d)}};
    if (!expected.empty()) out["expected"] = expected, out["verified"] = verified;
    std::printf("%s\n", cli::json_text(out).c_str());
  }
  if (expected.empty()) {
    if (!json) std::printf("%s  %s\n", to_hex(d).c_str(), path.c_str());
    return 0;
  }
  if (!verified) {
    std::fprintf(stderr, "pulse-sync: %s has state digest %s, expected %s\n", path.c_str(), to_hex(d).c_str(),
                 expected.c_str());
    return 1;
  }
  if (!json) std::printf("%s: state digest %s verified\n", path.c_str(), to_hex(d).c_str());
  return 0;
}

int cmd_inspect(const std::string& path, bool json) {
  const auto bytes = read_regular_file(path, physical_memory_bytes(), "patch");
  const ParsedPatch p = parse_patch(bytes.data(), bytes.size());
  if (json) {
    std::printf("%s\n", describe_patch(p).c_str());
    return 0;
  }
  const PatchHeader& h = p.header;
  std::printf("PULSESync patch v%u, %zu bytes%s\n", h.format_version, bytes.size(), h.is_signed ? ", signed" : "");
  std::printf("versions %llu -> %llu\nbase state   %s\ntarget state %s\n",
              static_cast<unsigned long long>(h.base_version), static_cast<unsigned long long>(h.target_version),
              to_hex(h.base_state).c_str(), to_hex(h.target_state).c_str());
  std::printf("coding: values %s, indices %s, compressor %s\n", value_coding_name(h.values),
              index_coding_name(h.indices), compressor_name(h.compressor));
  std::printf("streams (coded/raw bytes): index %llu/%llu, value %llu/%llu, whole %llu/%llu\n",
              static_cast<unsigned long long>(h.index_stream.coded), static_cast<unsigned long long>(h.index_stream.raw),
              static_cast<unsigned long long>(h.value_stream.coded), static_cast<unsigned long long>(h.value_stream.raw),
              static_cast<unsigned long long>(h.whole_stream.coded), static_cast<unsigned long long>(h.whole_stream.raw));
  std::size_t kinds[3] = {0, 0, 0};
  for (const auto& e : p.entries) ++kinds[static_cast<int>(e.kind)];
  std::printf("entry table: %llu bytes for %zu tensors (%zu sparse, %zu same, %zu whole)\n",
              static_cast<unsigned long long>(p.table_bytes), p.entries.size(),
              kinds[int(EntryKind::sparse)], kinds[int(EntryKind::same)], kinds[int(EntryKind::whole)]);
  std::printf("changed elements in sparse-coded tensors: %llu\n", static_cast<unsigned long long>(h.total_changed));
  print_summary(p.summary);
  for (const auto& name : p.removed) std::printf("  removes %s\n", name.c_str());
  for (const auto& t : p.added) std::printf("  adds %s %s\n", t.name.c_str(), t.dtype.c_str());
  if (h.changes_metadata) {
    std::printf("  target metadata:\n");
    for (const auto& [key, value] : p.metadata) std::printf("    %s = %s\n", key.c_str(), value.c_str());
  }
  return 0;
}

int cmd_keygen(const std::string& public_path, const std::string& secret_path, bool force) {
  PULSE_CHECK(!same_file(public_path, secret_path) && public_path != secret_path, "keygen: --public and --secret are one file");
  write_key_pair(public_path, secret_path, generate_keypair(), force);
  std::printf("wrote %s and %s\n", public_path.c_str(), secret_path.c_str());
  return 0;
}

struct RelayArgs {
  std::string relay, file, previous, out, have, sign, public_key;
  std::uint64_t version = 0, have_version = 0, min_version = 0, anchor_every = 10, keep_anchors = 2;
  bool compress_anchors = false, replace = false;
  unsigned threads = 0;  // 0: the cores
};

int cmd_publish(const RelayArgs& args) {
  Relay relay(args.relay);
  PublishOptions opt;
  opt.anchor_every = args.anchor_every;
  opt.keep_anchors = args.keep_anchors;
  opt.compress_anchors = args.compress_anchors;
  opt.encode.threads = args.threads;
  SecretKey key;
  opt.encode.signing_key = signing_key(args.sign, key);
  // Streamed: a tensor of each state in memory at a time (and the patch), not the model.
  const StreamedState state = StreamedState::open(args.file);
  std::optional<StreamedState> previous;
  if (!args.previous.empty()) previous.emplace(StreamedState::open(args.previous));
  try {
    relay.publish(args.version, state.tensors(), state.metadata(), previous ? &previous->tensors() : nullptr,
                  previous ? &previous->metadata() : nullptr, opt, state.loader(),
                  previous ? previous->loader() : TensorLoader{});
  } catch (const std::bad_alloc&) {
    if (!previous) throw_out_of_memory("publish", StreamedState::kPieceBytes, 1, "a piece of a tensor");
    throw_out_of_memory("publish", std::max(encode_unit_bytes(state.tensors(), opt.encode),
                                            encode_unit_bytes(previous->tensors(), opt.encode)),
                        2 * resolve_threads(opt.encode.threads), "a segment of each state per thread");
  }
  std::printf("published version %llu to %s\n", static_cast<unsigned long long>(args.version), args.relay.c_str());
  return 0;
}

int cmd_pull(const RelayArgs& args) {
  cli::refuse_output_over_inputs(args.out, "pull: -o", {args.relay, args.public_key});
  const Relay relay(args.relay);
  PublicKey key;
  if (!args.public_key.empty()) key = read_public_key(args.public_key);
  PullOptions options;
  options.public_key = args.public_key.empty() ? nullptr : &key;
  options.min_version = args.min_version;
  // Streamed into -o (sync/relay.hpp, pull_into): patches, anchors and the state never whole in memory.
  const PullResult r = relay.pull_into(args.out, args.have, args.have_version, options,
                                       replace_mode(args.out, args.have, args.replace), resolve_threads(args.threads));
  if (!r.fallback.empty()) std::fprintf(stderr, "pulse-sync: note: fell back (%s)\n", r.fallback.c_str());
  const bool folder = r.folder;
  std::printf("pulled version %llu (%s path, %llu patches), digest verified; wrote %s%s\n",
              static_cast<unsigned long long>(r.version), r.fast_path ? "fast" : "slow",
              static_cast<unsigned long long>(r.patches_applied), folder ? "the folder " : "", args.out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pulse-sync: lossless sparse patches (PULSESync) on safetensors checkpoints and model folders"};
  cli::set_conventions(app, "pulse-sync");
  app.require_subcommand(1);

  std::string a, b;
  auto* diff = app.add_subcommand("diff", "changed elements and sparsity per tensor between two checkpoints");
  diff->add_option("A", a, "older checkpoint (.safetensors file or model folder)")->required()->check(kExistingState);
  diff->add_option("B", b, "newer checkpoint")->required()->check(kExistingState);
  bool json = false;
  diff->add_flag("--json", json, "print one JSON object instead of the table");
  unsigned diff_threads = 0;
  diff->add_option("--threads", diff_threads, "threads comparing the tensors (0: the cores)")->capture_default_str();

  EncodeArgs enc;
  auto* encode = app.add_subcommand("encode", "write the patch from --base to --target");
  encode->add_option("--base", enc.base, "base checkpoint (file or model folder)")->required()->check(kExistingState);
  encode->add_option("--target", enc.target, "target checkpoint (file or model folder)")->required()->check(kExistingState);
  encode->add_option("-o,--out", enc.out, "patch file to write")->required();
  encode->add_option("--values", enc.values, "value coding")->check(CLI::IsMember(names_without(value_coding_names, ValueCoding::exponent_class_history)))->capture_default_str();
  encode->add_option("--indices", enc.indices, "index coding")
      ->check(CLI::IsMember(names_without(index_coding_names, IndexCoding::exponent_class_history)))
      ->capture_default_str();
  encode->add_option("--compressor", enc.compressor, "stream compressor")
      ->check(CLI::IsMember(names_of(compressor_names)))
      ->capture_default_str();
  encode->add_option("--level", enc.level, "zstd level")->check(CLI::Range(-7, 22))->capture_default_str();
  encode->add_option("--threads", enc.threads, "threads coding the patch's parts (0: the cores; the bytes do not depend on it)")
      ->capture_default_str();
  encode->add_option("--base-version", enc.base_version, "version number of the base")
      ->check(kVersionNumber)
      ->capture_default_str();
  encode->add_option("--target-version", enc.target_version, "version number of the target")
      ->check(kVersionNumber)
      ->capture_default_str();
  encode->add_option("--sign", enc.sign, "sign with this Ed25519 secret key file")->check(CLI::ExistingFile);
  encode->add_option("--codec", enc.codec, "auto: measure every codec on this patch and pick the fastest end to end")
      ->check(CLI::IsMember({"auto"}));
  encode->add_option("--bandwidth", enc.bandwidth, "link bandwidth for --codec auto (e.g. 1Gbit, 100Mbit, 2GB)")
      ->capture_default_str();

  std::string base, patch, out, in_place, public_key;
  auto* apply = app.add_subcommand("apply", "apply a patch; the output appears only when the result verifies");
  apply->add_option("--base", base, "base checkpoint (file or model folder)")->check(kExistingState);
  apply->add_option("--patch", patch, "patch file")->required()->check(CLI::ExistingFile);
  auto* out_opt = apply->add_option("-o,--out", out, "checkpoint to write (a folder when the base is one)");
  auto* in_place_opt = apply->add_option("--in-place", in_place, "update this checkpoint (file or folder) in place (atomically)")
                           ->check(kExistingState);
  out_opt->excludes(in_place_opt);
  apply->add_option("--public-key", public_key, "require a valid signature by this Ed25519 public key")
      ->check(CLI::ExistingFile);
  bool replace = false;
  apply->add_flag("--replace", replace, "replace an existing model folder at -o even if files in it would be deleted");
  unsigned apply_threads = 0;
  apply->add_option("--threads", apply_threads,
                    "threads decoding the patch's parts, copying, hashing and writing (0: the cores; the output does "
                    "not depend on it)")
      ->check(CLI::Range(0u, 1024u))
      ->capture_default_str();
  bool no_stream = false;  // hidden: the load-whole path, for apps/bench/stream_apply_bench.py
  apply->add_flag("--no-stream", no_stream, "load the base whole even for a file-to-file apply")->group("");

  std::string verify_path, digest;
  auto* verify = app.add_subcommand("verify", "print a checkpoint's state digest, or check it with --digest");
  verify->add_option("FILE", verify_path, "checkpoint (file or model folder)")->required()->check(kExistingState);
  verify->add_option("--digest", digest, "expected state digest (32 hex digits)");
  unsigned verify_threads = 0;
  verify->add_option("--threads", verify_threads, "threads hashing the tensors (0: the cores)")->capture_default_str();
  verify->add_flag("--json", json, "print one JSON object (file, state_digest, and with --digest: expected, verified)");

  std::string inspect_path;
  auto* inspect = app.add_subcommand("inspect", "print a patch's header and entries");
  inspect->add_option("PATCH", inspect_path, "patch file")->required()->check(CLI::ExistingFile);
  inspect->add_flag("--json", json, "print one JSON object instead of the text");

  std::string public_out, secret_out;
  bool force_keys = false;
  auto* keygen = app.add_subcommand("keygen", "create an Ed25519 key pair for signing patches and relay state");
  keygen->add_option("--public", public_out, "public key file to write")->required();
  keygen->add_option("--secret", secret_out, "secret key file to write (mode 0600)")->required();
  keygen->add_flag("--force", force_keys, "replace existing key files (otherwise they are kept)");

  RelayArgs rel;
  auto* publish = app.add_subcommand("publish", "publish a checkpoint as the relay's next version");
  publish->add_option("--relay", rel.relay, "relay folder")->required();
  publish->add_option("--version", rel.version, "version number of FILE")->required()->check(kVersionNumber);
  publish->add_option("FILE", rel.file, "checkpoint to publish (file or model folder)")->required()->check(kExistingState);
  publish->add_option("--previous", rel.previous, "the relay's head version, to write a patch from")
      ->check(kExistingState);
  publish->add_option("--anchor-every", rel.anchor_every, "a full anchor every K versions")
      ->check(cli::unsigned_decimal(1))
      ->capture_default_str();
  publish->add_option("--keep-anchors", rel.keep_anchors, "anchors to keep (and the patches they need)")
      ->check(cli::unsigned_decimal(1))
      ->capture_default_str();
  publish->add_option("--sign", rel.sign, "sign HEAD, anchor records and patches with this Ed25519 secret key file")
      ->check(CLI::ExistingFile);
  publish->add_flag("--compress-anchors", rel.compress_anchors, "write anchors zstd-compressed (.safetensors.zst)");
  publish->add_option("--threads", rel.threads, "threads coding the patch's parts (0: the cores; the bytes do not depend on it)")
      ->check(CLI::Range(0u, 256u))
      ->capture_default_str();

  auto* pull = app.add_subcommand("pull", "bring a checkpoint to the relay's head version");
  pull->add_option("--relay", rel.relay, "relay folder")->required()->check(CLI::ExistingDirectory);
  pull->add_option("-o,--out", rel.out, "checkpoint to write (a folder for a folder state)")->required();
  auto* have_opt = pull->add_option("--have", rel.have, "checkpoint (file or folder) the receiver holds")->check(kExistingState);
  auto* have_version_opt = pull->add_option("--have-version", rel.have_version, "its version (pull never moves below it)")
                               ->needs(have_opt)
                               ->check(kVersionNumber);
  have_opt->needs(have_version_opt);  // an unknown version would count as 0 and accept any older HEAD
  pull->add_flag("--replace", rel.replace, "replace an existing model folder at -o even if files in it would be deleted");
  pull->add_option("--min-version", rel.min_version, "refuse a relay whose HEAD is older than this version")
      ->check(kVersionNumber);
  pull->add_option("--public-key", rel.public_key, "accept only HEAD, anchors and patches signed by this key")
      ->check(CLI::ExistingFile);
  pull->add_option("--threads", rel.threads, "threads of each streamed apply (0: the cores; the output does not depend on it)")
      ->check(CLI::Range(0u, 256u))
      ->capture_default_str();

  // diff, verify and inspect have a --json of their own; the other subcommands get the summary line.
  cli::JsonSummary summary(app, "pulse-sync", {"--out", "--in-place", "--public", "--secret", "--relay"});
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return cli::exit_on_parse_error(app, e, "pulse-sync");
  }
  Kokkos::ScopeGuard kokkos;
  try {
    if (*diff) return cmd_diff(a, b, json, diff_threads);
    if (*encode) return summary.print(cmd_encode(enc));
    if (*apply) {
      if (in_place.empty()) {
        PULSE_CHECK(!base.empty() && !out.empty(), "apply needs --base A -o OUT, or --in-place FILE");
        return summary.print(cmd_apply(base, patch, out, public_key, !no_stream, apply_threads, replace));
      }
      PULSE_CHECK(base.empty(), "--in-place takes its base from FILE; drop --base");
      return summary.print(cmd_apply(in_place, patch, in_place, public_key, !no_stream, apply_threads, replace));
    }
    if (*verify) return cmd_verify(verify_path, digest, json, verify_threads);
    if (*inspect) return cmd_inspect(inspect_path, json);
    if (*keygen) return summary.print(cmd_keygen(public_out, secret_out, force_keys));
    if (*publish) return summary.print(cmd_publish(rel));
    if (*pull) return summary.print(cmd_pull(rel));
  } catch (const std::exception& e) {
    std::cerr << "pulse-sync: " << e.what() << "\n";
    summary.set("error", e.what());
    return summary.print(1);
  }
  return 0;
}
