// pulse-measure's split of a model among ranks: units tile every tensor exactly once, no unit
// exceeds the unit size unless one element does, units do not depend on the rank count, and the
// ranks take contiguous runs of units that together cover the model, balanced by bytes.
#include <gtest/gtest.h>

#include <numeric>

#include "measure/tensor_kind.hpp"
#include "measure/work_split.hpp"

using namespace pulse::measure;

namespace {

std::vector<MeasuredTensor> model() {
  // numel 1000 BF16, 7 F32, 100000 F16, 1 BF16, 3000 F32
  return {{"a", "BF16", {10, 100}, 1000, 2}, {"b", "F32", {7}, 7, 4}, {"c", "F16", {100000}, 100000, 2},
          {"d", "BF16", {1}, 1, 2}, {"e", "F32", {3000}, 3000, 4}};
}

}  // namespace

TEST(WorkSplit, UnitsTileEveryTensorOnce) {
  const auto tensors = model();
  for (const std::uint64_t unit : {1ull, 2ull, 3ull, 64ull, 1000ull, 4096ull, 1ull << 30}) {
    const auto units = make_units(tensors, unit);
    std::vector<std::int64_t> next(tensors.size(), 0);
    for (const Unit& u : units) {
      std::uint64_t bytes = 0;
      for (const Piece& p : u.pieces) {
        ASSERT_EQ(p.begin, next[p.tensor]) << "unit size " << unit;
        ASSERT_LT(p.begin, p.end);
        next[p.tensor] = p.end;
        bytes += std::uint64_t(p.end - p.begin) * tensors[p.tensor].element_bytes;
      }
      EXPECT_EQ(bytes, u.bytes);
      EXPECT_TRUE(u.bytes <= unit || u.pieces.size() == 1 && u.pieces[0].end - u.pieces[0].begin == 1);
    }
    for (std::size_t t = 0; t < tensors.size(); ++t) EXPECT_EQ(next[t], tensors[t].numel) << tensors[t].name;
  }
}

TEST(WorkSplit, RanksTakeContiguousBalancedRuns) {
  const auto tensors = model();
  const auto units = make_units(tensors, 4096);
  std::uint64_t total = 0;
  for (const Unit& u : units) total += u.bytes;
  for (const int nranks : {1, 2, 3, 4, 7, 64}) {
    std::size_t expected_first = 0;
    for (int r = 0; r < nranks; ++r) {
      const auto [first, last] = units_of_rank(units, r, nranks);
      if (first == last) continue;  // more ranks than units: some have none
      EXPECT_EQ(first, expected_first) << nranks << " ranks, rank " << r;
      expected_first = last;
      std::uint64_t bytes = 0;
      for (std::size_t u = first; u < last; ++u) bytes += units[u].bytes;
      EXPECT_LE(bytes, total / nranks + 4096) << nranks << " ranks, rank " << r;
    }
    EXPECT_EQ(expected_first, units.size()) << nranks << " ranks";
  }
}

TEST(TensorKind, NamesOfLlamaGpt2AndPulse) {
  EXPECT_EQ(classify_tensor("model.layers.0.self_attn.q_proj.weight"), TensorKind::attention);
  EXPECT_EQ(classify_tensor("model.layers.0.post_attention_layernorm.weight"), TensorKind::norms);
  EXPECT_EQ(classify_tensor("model.layers.3.mlp.down_proj.weight"), TensorKind::mlp);
  EXPECT_EQ(classify_tensor("model.embed_tokens.weight"), TensorKind::embeddings);
  EXPECT_EQ(classify_tensor("lm_head.weight"), TensorKind::embeddings);
  EXPECT_EQ(classify_tensor("model.norm.weight"), TensorKind::norms);
  EXPECT_EQ(classify_tensor("transformer.h.0.attn.c_attn.weight"), TensorKind::attention);
  EXPECT_EQ(classify_tensor("transformer.h.0.mlp.c_fc.weight"), TensorKind::mlp);
  EXPECT_EQ(classify_tensor("transformer.h.0.ln_1.weight"), TensorKind::norms);
  EXPECT_EQ(classify_tensor("blocks.1.ln2.bias"), TensorKind::norms);
  EXPECT_EQ(classify_tensor("blocks.1.attn.qkv.weight"), TensorKind::attention);
  EXPECT_EQ(classify_tensor("blocks.1.mlp.fc.weight"), TensorKind::mlp);
  EXPECT_EQ(classify_tensor("wpe.weight"), TensorKind::embeddings);
  EXPECT_EQ(classify_tensor("model.layers.0.mlp.experts.3.w1.weight"), TensorKind::mlp);
  EXPECT_EQ(classify_tensor("score.weight"), TensorKind::other);
}
