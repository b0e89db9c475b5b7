// Writes valid PULSESync patches for the fixed receiver state of fuzz_patch_decoder into the
// folder given as argument: target variants (no change, ~1 %, 50 % and 100 % of the BF16
// elements changed, NaN payloads, +-0 flips, a changed F32 tensor) in every value coding x
// index coding x compressor (expclass included), and one signed patch.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "patch_fuzz_state.hpp"
#include "sync/patch.hpp"
#include "sync/sparse_format.hpp"

namespace {

using namespace pulse::sync;
using pulse_fuzz::FuzzState;
using pulse_fuzz::FuzzTensor;

// Applies f(index, bits) to every BF16 element of a copy of the base state.
FuzzState map_bf16(const FuzzState& base, const std::function<std::uint16_t(std::size_t, std::uint16_t)>& f) {
  FuzzState t = base;
  for (auto& tensor : t) {
    if (tensor.dtype != "BF16") continue;
    auto bits = pulse_fuzz::bf16_bits_of(tensor);
    for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = f(i, bits[i]);
    tensor = pulse_fuzz::bf16_tensor(tensor.name, tensor.shape, bits);
  }
  return t;
}

std::uint16_t nudge(std::uint16_t b, int steps) {
  // BF16's monotone key, as the patch format sees it (the seeds need no Kokkos).
  const auto bf16 = *pulse::sync::sparse_format("BF16");
  return static_cast<std::uint16_t>(bf16.from_key((bf16.key(b) + std::uint64_t(std::int64_t(steps))) & bf16.mask()));
}

// A seed is only useful if the fuzz target accepts it: it must apply to the fixed state.
void check_applies(const std::vector<std::uint8_t>& bytes, const FuzzState& base, const FuzzState& target,
                   const PublicKey* key = nullptr, const ChangeHistory* history = nullptr) {
  FuzzState receiver = base;
  auto m = pulse_fuzz::mutables(receiver);
  std::optional<ChangeHistory> receiver_history;
  if (history) receiver_history.emplace(*history);
  apply_patch(parse_patch(bytes.data(), bytes.size(), {}, key), m, {}, nullptr, nullptr, {}, nullptr,
              receiver_history ? &*receiver_history : nullptr);
  for (std::size_t i = 0; i < receiver.size(); ++i)
    PULSE_CHECK(receiver[i].bytes == target[i].bytes, "seed patch does not reproduce tensor " + receiver[i].name);
}

void write_file(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  PULSE_CHECK(f && std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size() && std::fclose(f) == 0,
              "cannot write " + path);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s FOLDER\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  try {
    const FuzzState base = pulse_fuzz::base_state();
    std::vector<std::pair<std::string, FuzzState>> targets;
    targets.emplace_back("same", base);
    // ~1 %: a few elements of the big tensor, one gap over 255 (2-byte fixed gaps), and the scalar.
    targets.emplace_back("sparse1", base);
    for (std::size_t i : {0, 5, 300, 301, 450, 639}) {
      auto bits = pulse_fuzz::bf16_bits_of(targets.back().second[0]);
      bits[i] = nudge(bits[i], i % 2 ? -1 : 1);
      targets.back().second[0] = pulse_fuzz::bf16_tensor(base[0].name, base[0].shape, bits);
    }
    targets.back().second[3] = pulse_fuzz::bf16_tensor("one", {}, {nudge(0x3F80, 2)});
    targets.emplace_back("half", map_bf16(base, [](std::size_t i, std::uint16_t b) {
      return pulse_fuzz::mix(i + 1000) % 2 ? nudge(b, int(i % 5) - 2 == 0 ? 3 : int(i % 5) - 2) : b;
    }));
    targets.emplace_back("all", map_bf16(base, [](std::size_t i, std::uint16_t b) {
      return i % 3 == 0 ? static_cast<std::uint16_t>(b ^ 0x8000) : nudge(b, i % 3 == 1 ? 1 : -300);
    }));
    targets.emplace_back("nan", map_bf16(base, [](std::size_t i, std::uint16_t b) {
      if (i == 200) return std::uint16_t(0x7FC1);  // quiet NaN, other payload
      if (i == 201) return std::uint16_t(0xFF81);  // signalling NaN, sign flipped
      if (i == 300) return std::uint16_t(0x7FFF);  // finite -> NaN
      if (i == 4) return std::uint16_t(0xFFC0);
      return b;
    }));
    targets.emplace_back("zeros", map_bf16(base, [](std::size_t i, std::uint16_t b) {
      if (b == 0x0000 || b == 0x8000) return static_cast<std::uint16_t>(b ^ 0x8000);  // +0 <-> -0
      if (i == 500) return std::uint16_t(0xFF80);  // +inf -> -inf
      return b;
    }));
    FuzzState f32 = targets[1].second;
    const float fv[3] = {1.0f, 7.0f, -0.0f};
    std::memcpy(f32[4].bytes.data(), fv, sizeof fv);
    targets.emplace_back("f32", f32);
    FuzzState small_floats = targets[1].second;  // one-ulp steps of F16 and FP8 elements
    for (auto& t : small_floats) {
      if (t.dtype == "F16") t.bytes[2] = std::byte(std::to_integer<unsigned>(t.bytes[2]) + 1);
      if (t.dtype == "F8_E4M3") t.bytes[5] = std::byte(std::to_integer<unsigned>(t.bytes[5]) - 1);
      if (t.dtype == "F8_E8M0") t.bytes[0] = std::byte(std::to_integer<unsigned>(t.bytes[0]) + 1);
    }
    targets.emplace_back("f16-fp8", small_floats);

    // Every value coding with each index coding it pairs with (expclass codes both).
    std::vector<std::pair<ValueCoding, IndexCoding>> codings;
    for (auto values : {ValueCoding::raw, ValueCoding::keydiff})
      for (auto indices : {IndexCoding::gap_fixed, IndexCoding::gap_varint}) codings.emplace_back(values, indices);
    codings.emplace_back(ValueCoding::exponent_class, IndexCoding::exponent_class);
    int written = 0;
    for (const auto& [name, target] : targets)
      for (const auto& [values, indices] : codings)
        for (auto compressor : {Compressor::none, Compressor::zstd, Compressor::lz4}) {
          EncodeOptions opt;
          opt.values = values;
          opt.indices = indices;
          opt.compressor = compressor;
          opt.base_version = 6;
          opt.target_version = 7;
          const auto bytes = encode_patch(pulse_fuzz::refs(base), pulse_fuzz::refs(target), opt);
          check_applies(bytes, base, target);
          write_file(dir + "/" + name + "-" + value_coding_name(values) + "-" + index_coding_name(indices) + "-" +
                         compressor_name(compressor) + ".pulsepatch",
                     bytes);
          ++written;
        }
    // expclass-history against the receiver's history (fuzz_patch_decoder's), no layout change.
    const ChangeHistory history = pulse_fuzz::base_history(base);
    for (const auto& [name, target] : targets) {
      if (target.size() != base.size()) continue;
      EncodeOptions opt = exponent_class_history_options(history);
      opt.base_version = 6;
      opt.target_version = 7;
      std::vector<std::uint8_t> bytes;
      try {
        bytes = encode_patch(pulse_fuzz::refs(base), pulse_fuzz::refs(target), opt);
      } catch (const pulse::Error&) {
        continue;  // a target that adds or removes tensors
      }
      check_applies(bytes, base, target, nullptr, &history);
      write_file(dir + "/" + name + "-expclass-history.pulsepatch", bytes);
      ++written;
    }
    const KeyPair keys = pulse_fuzz::signing_keys();
    EncodeOptions opt;
    opt.signing_key = &keys.secret_key;
    const auto bytes = encode_patch(pulse_fuzz::refs(base), pulse_fuzz::refs(targets[2].second), opt);
    check_applies(bytes, base, targets[2].second, &keys.public_key);
    write_file(dir + "/signed-keydiff-gap-varint-zstd.pulsepatch", bytes);
    std::printf("%d patches\n", written + 1);
  } catch (const pulse::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
