#pragma once
// The fixed receiver state of fuzz_patch_decoder and its seed generator: BF16 tensors of
// different sizes (640 elements, 7, an empty one, a one-element scalar) and an F32 tensor,
// filled deterministically (no <random> distributions: their output is not portable), the
// receiver's change history (expclass-history patches), and the fixed Ed25519 key pair of the
// signed seed.
#include <sodium.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "sync/change_history.hpp"
#include "sync/patch.hpp"
#include "coding/signing.hpp"

namespace pulse_fuzz {

struct FuzzTensor {
  std::string name, dtype;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> bytes;
};
using FuzzState = std::vector<FuzzTensor>;

inline std::uint64_t mix(std::uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline FuzzTensor bf16_tensor(const std::string& name, std::vector<std::int64_t> shape,
                              const std::vector<std::uint16_t>& bits) {
  FuzzTensor t{name, "BF16", std::move(shape), std::vector<std::byte>(2 * bits.size())};
  if (!bits.empty()) std::memcpy(t.bytes.data(), bits.data(), t.bytes.size());
  return t;
}

inline std::vector<std::uint16_t> bf16_bits_of(const FuzzTensor& t) {
  std::vector<std::uint16_t> out(t.bytes.size() / 2);
  if (!out.empty()) std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
  return out;
}

// Small weights of both signs (|w| in [2^-9, 2^-5)), with +0, -0, a quiet and a signalling NaN
// and both infinities among them.
inline FuzzState base_state() {
  std::vector<std::uint16_t> w(16 * 40), b(7);
  for (std::size_t i = 0; i < w.size(); ++i) {
    const std::uint64_t r = mix(i);
    w[i] = static_cast<std::uint16_t>(((r & 1) << 15) | (0x3B00 + ((r >> 1) % 0x200)));
  }
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::uint16_t>(0x3F80 + 3 * i);  // 1.0, ...
  w[10] = 0x0000;
  w[11] = 0x8000;
  w[200] = 0x7FC0;
  w[201] = 0x7F81;
  w[500] = 0x7F80;
  w[501] = 0xFF80;
  b[3] = 0x8000;
  FuzzState s;
  s.push_back(bf16_tensor("blocks.0.attn.weight", {16, 40}, w));
  s.push_back(bf16_tensor("blocks.0.ln.bias", {7}, b));
  s.push_back(bf16_tensor("empty", {0, 4}, {}));
  s.push_back(bf16_tensor("one", {}, {0x3F80}));
  FuzzTensor f{"scale", "F32", {3}, std::vector<std::byte>(12)};
  const float fv[3] = {1.0f, -2.0f, 0.5f};
  std::memcpy(f.bytes.data(), fv, sizeof fv);
  s.push_back(f);
  // Other sparse-coded dtypes of format 2: F16, and FP8 with and without a sign bit.
  const std::uint16_t hv[6] = {0x3C00, 0xBC00, 0x0001, 0x7BFF, 0x8000, 0x3555};  // 1, -1, tiny, max, -0, 1/3
  FuzzTensor h{"proj.f16", "F16", {2, 3}, std::vector<std::byte>(sizeof hv)};
  std::memcpy(h.bytes.data(), hv, sizeof hv);
  s.push_back(h);
  FuzzTensor q{"q.fp8", "F8_E4M3", {8}, std::vector<std::byte>(8)};
  FuzzTensor e{"scales.e8m0", "F8_E8M0", {4}, std::vector<std::byte>(4)};
  for (std::size_t i = 0; i < 8; ++i) q.bytes[i] = std::byte(0x30 + 9 * i);
  for (std::size_t i = 0; i < 4; ++i) e.bytes[i] = std::byte(0x7F - i);
  s.push_back(q);
  s.push_back(e);
  return s;
}

inline std::vector<pulse::sync::TensorRef> refs(const FuzzState& s) {
  std::vector<pulse::sync::TensorRef> out;
  for (const auto& t : s) out.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  return out;
}

inline std::vector<pulse::sync::MutableTensor> mutables(FuzzState& s) {
  std::vector<pulse::sync::MutableTensor> out;
  for (auto& t : s) out.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  return out;
}

// The receiver's change history of the base state: every element never changed, or changed
// up or down 1 to 127 versions ago (deterministic), under a fixed digest.
inline pulse::sync::ChangeHistory base_history(const FuzzState& base) {
  using pulse::sync::ChangeHistory;
  std::vector<std::uint8_t> bytes = ChangeHistory(refs(base), pulse::sync::Digest{}).bytes();
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const std::uint64_t r = mix(i + 1000003);
    bytes[i] = r % 3 == 0 ? 0 : std::uint8_t((r & 0x80) | (1 + (r >> 8) % ChangeHistory::kMaxAge));
  }
  pulse::sync::Digest digest;
  digest.fill(0x5A);
  return ChangeHistory(refs(base), bytes, digest);
}

inline pulse::sync::KeyPair signing_keys() {
  if (sodium_init() < 0) std::abort();
  unsigned char seed[crypto_sign_SEEDBYTES];
  for (std::size_t i = 0; i < sizeof seed; ++i) seed[i] = static_cast<unsigned char>(i * 7 + 1);
  pulse::sync::KeyPair k;
  crypto_sign_seed_keypair(k.public_key.data(), k.secret_key.data(), seed);
  return k;
}

}  // namespace pulse_fuzz
