// pulse-measure's patch size without encoding: equal to the size of the patch sync::encode_patch
// writes, for units of BF16, F16 and F32 tensors given in any order (pieces named "t[b:e]" as
// pulse-measure names them), from no change to every element changed, at several zstd levels.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "measure/patch_size.hpp"
#include "sync/patch.hpp"

using namespace pulse;

namespace {

struct Tensor {
  std::string name, dtype;
  std::vector<std::byte> base, target;
  std::size_t element_bytes() const { return dtype == "F32" ? 4 : 2; }
  std::size_t numel() const { return base.size() / element_bytes(); }
};

// A unit whose tensors change `fraction` of their elements: one-ulp steps, random new bits,
// sign flips (keydiff's large differences) and, once in a while, a value and back.
std::vector<Tensor> make_unit(std::mt19937_64& rng, double fraction) {
  const char* dtypes[] = {"BF16", "F16", "F32"};
  const char* names[] = {"model.layers.1.mlp.up_proj.weight[4096:8192]", "lm_head.weight", "model.norm.weight",
                         "model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.up_proj.weight[0:4096]", "z"};
  std::vector<Tensor> unit;
  const std::size_t count = 1 + rng() % 6;
  for (std::size_t i = 0; i < count; ++i) {
    Tensor t{names[i], dtypes[rng() % 3], {}, {}};
    const std::size_t n = (rng() % 3 == 0) ? 1 + rng() % 5 : 1000 + rng() % 20000;
    t.base.resize(n * t.element_bytes());
    for (auto& b : t.base) b = std::byte(rng());
    t.target = t.base;
    std::bernoulli_distribution changes(fraction);
    for (std::size_t e = 0; e < n; ++e) {
      if (!changes(rng)) continue;
      std::uint32_t bits = 0;
      std::memcpy(&bits, t.target.data() + e * t.element_bytes(), t.element_bytes());
      const unsigned how = rng() % 4;
      const std::uint32_t sign = t.element_bytes() == 2 ? 0x8000u : 0x80000000u;
      bits = how == 0 ? bits + 1 : how == 1 ? bits - 1 : how == 2 ? std::uint32_t(rng()) : bits ^ sign;
      std::memcpy(t.target.data() + e * t.element_bytes(), &bits, t.element_bytes());
    }
    unit.push_back(std::move(t));
  }
  return unit;
}

std::uint64_t encoded_size(const std::vector<Tensor>& unit, int level) {
  std::vector<sync::TensorRef> base, target;
  for (const Tensor& t : unit) {
    const std::vector<std::int64_t> shape{std::int64_t(t.numel())};
    base.push_back({t.name, t.dtype, shape, t.base.data(), t.base.size()});
    target.push_back({t.name, t.dtype, shape, t.target.data(), t.target.size()});
  }
  sync::EncodeOptions options;
  options.level = level;
  return sync::encode_patch(base, target, options).size();
}

std::uint64_t computed_size(measure::UnitPatchSize& size, const std::vector<Tensor>& unit, int level) {
  size.clear();
  for (const Tensor& t : unit) {
    size.add_tensor(t.name, t.dtype, t.numel());
    const std::size_t w = t.element_bytes();
    for (std::size_t e = 0; e < t.numel(); ++e) {
      std::uint32_t before = 0, after = 0;
      std::memcpy(&before, t.base.data() + e * w, w);
      std::memcpy(&after, t.target.data() + e * w, w);
      if (before != after) size.add_change(e, after, before);
    }
  }
  return size.bytes(level);
}

}  // namespace

TEST(PatchSize, EqualsTheEncodedPatch) {
  std::mt19937_64 rng(11);
  measure::UnitPatchSize size;  // reused from unit to unit, as pulse-measure does
  for (const double fraction : {0.0, 0.001, 0.01, 0.1, 0.5, 1.0})
    for (const int level : {1, 3, 9, -1})
      for (int trial = 0; trial < 3; ++trial) {
        const std::vector<Tensor> unit = make_unit(rng, fraction);
        EXPECT_EQ(computed_size(size, unit, level), encoded_size(unit, level))
            << "fraction " << fraction << ", level " << level << ", " << unit.size() << " tensors";
      }
}

TEST(PatchSize, RejectsDtypesItDoesNotCode) {
  measure::UnitPatchSize size;
  EXPECT_THROW(size.add_tensor("t", "I64", 4), pulse::Error);
}
