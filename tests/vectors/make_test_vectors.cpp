// Writes the PULSESync test vectors (tests/vectors/README.md): small base and target states as
// safetensors files, a change history, the patches between them in every coding, and
// manifest.json with their digests. `make_test_vectors DIR` writes the checked-in set (seed 1);
// `make_test_vectors DIR --seed N` a fresh set of the same shapes from other random states.
// The states are filled by splitmix64 (no <random> distributions: their output is not portable).
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "io/safetensors.hpp"
#include "sync/change_history.hpp"
#include "coding/digest.hpp"
#include "sync/patch.hpp"

namespace {

using namespace pulse;
using namespace pulse::sync;

std::uint64_t mix(std::uint64_t x) {  // splitmix64
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

struct Tensor {
  std::string name, dtype;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> bytes;
};
struct State {
  std::vector<Tensor> tensors;
  Metadata metadata;
  std::vector<TensorRef> refs() const {
    std::vector<TensorRef> out;
    for (const auto& t : tensors) out.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
    return out;
  }
  Tensor& operator[](const std::string& name) {
    for (auto& t : tensors)
      if (t.name == name) return t;
    throw_error(__FILE__, __LINE__, "no tensor " + name);
  }
};

std::uint64_t numel(const std::vector<std::int64_t>& shape) {
  std::uint64_t n = 1;
  for (auto d : shape) n *= std::uint64_t(d);
  return n;
}

// Weights of one magnitude range per tensor (as trained weights are), some of any bits.
Tensor make_tensor(const std::string& name, const std::string& dtype, std::vector<std::int64_t> shape,
                   std::uint64_t seed) {
  const unsigned w = unsigned(io::dtype_bits(io::parse_dtype(dtype)) / 8);
  const std::uint64_t n = numel(shape);
  Tensor t{name, dtype, std::move(shape), std::vector<std::byte>(n * w)};
  const auto f = sparse_format(dtype);
  for (std::uint64_t i = 0; i < n; ++i) {
    std::uint64_t r = mix(seed * 1000003 + i);
    if (f && r % 8 != 0) {  // sign, exponent near the middle, any mantissa
      const std::uint64_t sign = (r >> 60) & 1;
      const std::uint64_t exponent = ((f->classes() / 2) - 2 + (r >> 40) % 3) & (f->classes() - 1);
      r = (f->sign_magnitude ? sign << (8 * w - 1) : 0) | exponent << f->mantissa_bits |
          (r & ((std::uint64_t(1) << f->mantissa_bits) - 1));
    }
    std::memcpy(t.bytes.data() + i * w, &r, w);
  }
  return t;
}

// Changes about 1 in 5 elements of a sparse-coded tensor (enough for every model to adapt): most by 1 to 3 key steps, some to
// any bits.
void change(Tensor& t, std::uint64_t seed) {
  const SparseFormat f = *sparse_format(t.dtype);
  const std::uint64_t n = t.bytes.size() / f.bytes;
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t r = mix(seed * 7919 + i);
    if (r % 5 != 0) continue;
    std::uint64_t bits = 0;
    std::memcpy(&bits, t.bytes.data() + i * f.bytes, f.bytes);
    if ((r >> 8) % 8 == 0) {
      bits = (r >> 16) & f.mask();
    } else {
      const std::int64_t step = ((r >> 16) & 1 ? 1 : -1) * std::int64_t(1 + (r >> 17) % 3);
      const std::int64_t key = std::int64_t(f.key(bits)) + step;
      if (key < 0 || key > std::int64_t(f.mask())) continue;
      bits = f.from_key(std::uint64_t(key));
    }
    std::memcpy(t.bytes.data() + i * f.bytes, &bits, f.bytes);
  }
}

State base_state(std::uint64_t seed) {
  State s;
  s.tensors = {make_tensor("attn.weight", "BF16", {16, 40}, seed + 1),
               make_tensor("bias.f16", "F16", {70}, seed + 2),
               make_tensor("counts", "I32", {5}, seed + 3),
               make_tensor("empty", "BF16", {0, 4}, seed + 4),
               make_tensor("fp8.e4m3", "F8_E4M3", {96}, seed + 5),
               make_tensor("fp8.e4m3fnuz", "F8_E4M3FNUZ", {40}, seed + 6),
               make_tensor("fp8.e5m2", "F8_E5M2", {33}, seed + 7),
               make_tensor("fp8.e5m2fnuz", "F8_E5M2FNUZ", {17}, seed + 8),
               make_tensor("frozen", "BF16", {8}, seed + 9),
               make_tensor("mask", "BOOL", {10}, seed + 10),
               make_tensor("norm.f32", "F32", {50}, seed + 11),
               make_tensor("scale.e8m0", "F8_E8M0", {20}, seed + 12)};
  for (auto& t : s.tensors)
    if (t.dtype == "BOOL")
      for (auto& b : t.bytes) b = std::byte(std::uint8_t(b) & 1);
  s.metadata = {{"format", "pt"}};
  return s;
}

// The base with sparse changes and the I32 tensor changed (carried whole).
State target_state(const State& base, std::uint64_t seed) {
  State s = base;
  std::uint64_t k = 0;
  for (auto& t : s.tensors)
    if (is_sparse_dtype(t.dtype) && t.name != "frozen") change(t, seed + 100 + k++);
  s["counts"].bytes[0] = std::byte(std::uint8_t(s["counts"].bytes[0]) ^ 1);
  return s;
}

// A layout change: "frozen" removed, "new.head" added, "bias.f16" reshaped (removed and added).
State layout_target(const State& target, std::uint64_t seed) {
  State s = target;
  for (std::size_t i = 0; i < s.tensors.size(); ++i)
    if (s.tensors[i].name == "frozen") s.tensors.erase(s.tensors.begin() + std::ptrdiff_t(i));
  s["bias.f16"].shape = {7, 10};
  s.tensors.push_back(make_tensor("new.head", "F16", {12}, seed + 200));
  return s;
}

State metadata_target(const State& target, std::uint64_t seed) {
  State s = target;
  s.metadata["step"] = std::to_string(seed % 1000);
  s.metadata["note"] = "pulse test vector";
  return s;
}

// Every element of a tracked tensor never changed (1/4), or changed up or down 1 to 20 versions
// ago (every age bucket's edges), or up to 127; the digest names this history (it is not a
// chain of real versions).
ChangeHistory make_history(const State& base, std::uint64_t seed) {
  std::vector<std::uint8_t> bytes = ChangeHistory(base.refs(), Digest{}).bytes();
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const std::uint64_t r = mix(seed * 31 + i);
    const std::uint64_t age = 1 + (r >> 8) % ((r >> 16) % 4 == 0 ? ChangeHistory::kMaxAge : 20);
    bytes[i] = r % 4 == 0 ? 0 : std::uint8_t((r & 0x80) | age);
  }
  const std::string origin = "pulse test vector history " + std::to_string(seed);
  return ChangeHistory(base.refs(), bytes, digest_bytes(origin.data(), origin.size()));
}

void write_file(const std::string& path, const void* data, std::size_t size) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), std::streamsize(size));
  PULSE_CHECK(out.good(), "cannot write " + path);
}

void write_state(const std::string& path, const State& s) {
  std::vector<io::TensorToWrite> tensors;
  for (const auto& t : s.tensors)
    tensors.push_back({t.name, io::parse_dtype(t.dtype), t.shape, t.bytes.data(), t.bytes.size()});
  io::write_safetensors(path, tensors, s.metadata);
}

struct Vector {
  std::string name;
  const char* target;  // which target state
  const char* values;
  const char* indices;
  const char* compressor;
  std::uint64_t part_elements;
};

// Every coding, every compressor, gap-fixed and gap-varint, a layout change, a metadata change,
// and patches of many parts (small part_elements).
const Vector kVectors[] = {
    {"raw-gapfixed-none", "target", "raw", "gap-fixed", "none", 1u << 24},
    {"raw-gapvarint-zstd", "target", "raw", "gap-varint", "zstd", 1u << 24},
    {"keydiff-gapfixed-lz4", "target", "keydiff", "gap-fixed", "lz4", 1u << 24},
    {"keydiff-gapvarint-none", "target", "keydiff", "gap-varint", "none", 1u << 24},
    {"keydiff-gapvarint-zstd", "target", "keydiff", "gap-varint", "zstd", 1u << 24},
    {"expclass-none", "target", "expclass", "expclass", "none", 1u << 24},
    {"expclass-zstd", "target", "expclass", "expclass", "zstd", 1u << 24},
    {"expclass-lz4", "target", "expclass", "expclass", "lz4", 1u << 24},
    {"expclass-history-none", "target", "expclass-history", "expclass-history", "none", 1u << 24},
    {"layout-keydiff-gapvarint-zstd", "target-layout", "keydiff", "gap-varint", "zstd", 1u << 24},
    {"metadata-expclass-none", "target-metadata", "expclass", "expclass", "none", 1u << 24},
    {"parts-raw-gapvarint-lz4", "target", "raw", "gap-varint", "lz4", 128},
    {"parts-keydiff-gapfixed-none", "target", "keydiff", "gap-fixed", "none", 128},
    {"parts-expclass-none", "target", "expclass", "expclass", "none", 128},
    {"parts-expclass-history-zstd", "target", "expclass-history", "expclass-history", "zstd", 64},
};

}  // namespace

int main(int argc, char** argv) {
  try {
    PULSE_CHECK(argc == 2 || (argc == 4 && std::string(argv[2]) == "--seed"), "usage: make_test_vectors DIR [--seed N]");
    const std::string dir = argv[1];
    const std::uint64_t seed = argc == 4 ? std::stoull(argv[3]) : 1;
    const State base = base_state(seed), target = target_state(base, seed);
    const std::map<std::string, State> states = {{"base", base},
                                                 {"target", target},
                                                 {"target-layout", layout_target(target, seed)},
                                                 {"target-metadata", metadata_target(target, seed)}};
    const ChangeHistory history = make_history(base, seed);

    nlohmann::ordered_json manifest;
    manifest["format_version"] = 3;
    manifest["generator"] = "make_test_vectors DIR --seed " + std::to_string(seed);
    for (const auto& [name, s] : states) {
      write_state(dir + "/" + name + ".safetensors", s);
      manifest["states"][name] = {{"file", name + ".safetensors"},
                                  {"state_digest", to_hex(compute_digests(s.refs(), s.metadata, 1).state)}};
    }
    const std::vector<std::uint8_t> history_bytes = history.bytes();
    write_file(dir + "/history.bin", history_bytes.data(), history_bytes.size());
    nlohmann::ordered_json tracked = nlohmann::json::array();
    for (const auto& t : base.tensors)
      if (is_sparse_dtype(t.dtype)) tracked.push_back(t.name);
    manifest["history"] = {{"file", "history.bin"}, {"digest", to_hex(history.digest())}, {"tensors", tracked}};

    for (const Vector& v : kVectors) {
      EncodeOptions o;
      o.values = parse_value_coding(v.values);
      o.indices = parse_index_coding(v.indices);
      o.compressor = parse_compressor(v.compressor);
      o.part_elements = v.part_elements;
      o.base_version = 7;
      o.target_version = 8;
      o.threads = 1;
      const bool with_history = o.values == ValueCoding::exponent_class_history;
      if (with_history) o.history = &history;
      const State& t = states.at(v.target);
      const std::vector<std::uint8_t> patch =
          encode_patch(base.refs(), t.refs(), o, nullptr, nullptr, base.metadata, t.metadata);
      const ParsedPatch parsed = parse_patch(patch.data(), patch.size());
      const std::string file = v.name + ".pulse";
      write_file(dir + "/" + file, patch.data(), patch.size());
      manifest["vectors"].push_back({{"name", v.name},
                                     {"patch", file},
                                     {"base", "base"},
                                     {"target", v.target},
                                     {"values", v.values},
                                     {"indices", v.indices},
                                     {"compressor", v.compressor},
                                     {"part_elements", v.part_elements},
                                     {"history", with_history},
                                     {"parts", parsed.parts.size()},
                                     {"patch_bytes", patch.size()},
                                     {"patch_xxh3", to_hex(digest_bytes(patch.data(), patch.size()))}});
    }
    const std::string text = manifest.dump(1) + "\n";
    write_file(dir + "/manifest.json", text.data(), text.size());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_test_vectors: %s\n", e.what());
    return 1;
  }
}
