// One describe and one diff for pulse-sync and Python (src/sync/patch_summary): the diff of two
// states counted by hand (changed, added, removed, re-declared, packed dtypes, metadata), the
// same from memory and from files at any thread count, and a patch's description against the
// patch it describes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sync/checkpoint.hpp"
#include "sync/patch_summary.hpp"
#include "sync/streamed_state.hpp"
#include "support/temp_dir.hpp"

using namespace pulse::sync;

namespace {

struct Tensor {
  std::string name, dtype;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> bytes;
};

std::vector<TensorRef> refs(const std::vector<Tensor>& state) {
  std::vector<TensorRef> out;
  for (const Tensor& t : state) out.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  return out;
}

Tensor zeros(const std::string& name, const std::string& dtype, std::int64_t n, std::size_t width) {
  return {name, dtype, {n}, std::vector<std::byte>(std::size_t(n) * width)};
}

// A: w (BF16, 1000), x (F32, 10), p (F4, 8: packed), gone (BF16, 4), r (F32, 3).
// B: w with elements 3, 5 and 999 changed (999 only in its high byte), x alike, p with one
// nibble changed, r re-declared with 4 elements, and new (U8, 2).
struct Pair {
  std::vector<Tensor> a, b;
};
Pair example() {
  Pair s;
  s.a = {zeros("w", "BF16", 1000, 2), zeros("x", "F32", 10, 4), zeros("p", "F4", 8, 0), zeros("gone", "BF16", 4, 2),
         zeros("r", "F32", 3, 4)};
  s.a[2].bytes.resize(4);
  s.b = {s.a[0], s.a[1], s.a[2], zeros("r", "F32", 4, 4), zeros("new", "U8", 2, 1)};
  s.b[0].bytes[2 * 3] = std::byte{1};
  s.b[0].bytes[2 * 5] = s.b[0].bytes[2 * 5 + 1] = std::byte{0x3f};
  s.b[0].bytes[2 * 999 + 1] = std::byte{0x80};
  s.b[2].bytes[1] = std::byte{0x10};
  return s;
}

}  // namespace

TEST(PatchSummary, DiffCountsEachKindOfChange) {
  const Pair s = example();
  const StateDiff d = diff_states(refs(s.a), refs(s.b), {}, {{"step", "1"}}, 1);
  ASSERT_EQ(d.tensors.size(), 6u);
  using S = TensorDiff::Status;
  EXPECT_EQ(d.tensors[0].name, "gone");  // what B dropped first, then B's order
  EXPECT_EQ(d.tensors[0].status, S::removed);
  EXPECT_EQ(d.tensors[1].name, "w");
  EXPECT_EQ(d.tensors[1].elements, 1000u);
  EXPECT_EQ(d.tensors[1].changed, 3u);
  EXPECT_TRUE(d.tensors[1].differs);
  EXPECT_EQ(d.tensors[2].changed, 0u);
  EXPECT_FALSE(d.tensors[2].differs);
  EXPECT_FALSE(d.tensors[3].element_wise);  // F4: only whether it differs
  EXPECT_TRUE(d.tensors[3].differs);
  EXPECT_EQ(d.tensors[4].status, S::redeclared);
  EXPECT_EQ(d.tensors[5].status, S::added);
  ASSERT_EQ(d.totals.size(), 3u);  // BF16, F32, F4 of the compared tensors, by name
  EXPECT_EQ(d.totals[0].dtype, "BF16");
  EXPECT_EQ(d.totals[0].changed, 3u);
  EXPECT_EQ(d.totals[2].differing_tensors, 1u);
  EXPECT_TRUE(d.metadata_changed);

  const auto j = nlohmann::json::parse(diff_json(d));
  EXPECT_EQ(j["tensors"][0], (nlohmann::json{{"name", "gone"}, {"dtype", "BF16"}, {"status", "removed"}}));
  EXPECT_EQ(j["tensors"][1]["sparsity_percent"].get<double>(), 100.0 * (1 - 3.0 / 1000));
  EXPECT_EQ(j["tensors"][3], (nlohmann::json{{"name", "p"}, {"dtype", "F4"}, {"differs", true}}));
  EXPECT_EQ(j["tensors"][4]["status"], "re-declared");
  EXPECT_EQ(j["totals"]["F4"], (nlohmann::json{{"differing_tensors", 1}}));
  EXPECT_EQ(j["totals"]["F32"]["sparsity_percent"].get<double>(), 100.0);
  EXPECT_EQ(j["metadata_changed"], true);
}

TEST(PatchSummary, DiffOfFilesIsTheDiffInMemoryAtAnyThreadCount) {
  const Pair s = example();
  pulse::test::TempDir dir;
  const std::string a_path = (dir.path / "a.safetensors").string(), b_path = (dir.path / "b.safetensors").string();
  save_checkpoint(a_path, refs(s.a), {{"step", "0"}});
  save_checkpoint(b_path, refs(s.b), {{"step", "1"}});
  const std::string in_memory = diff_json(diff_states(refs(s.a), refs(s.b), {{"step", "0"}}, {{"step", "1"}}, 1));
  const StreamedState a = StreamedState::open(a_path), b = StreamedState::open(b_path);
  for (unsigned threads : {1u, 2u, 5u}) EXPECT_EQ(diff_json(diff_states(a, b, threads)), in_memory) << threads;
}

TEST(PatchSummary, DescribeHoldsWhatThePatchSays) {
  const Pair s = example();
  EncodeOptions options;
  options.base_version = 4, options.target_version = 5;
  const std::vector<std::uint8_t> patch = encode_patch(refs(s.a), refs(s.b), options);
  const ParsedPatch parsed = parse_patch(patch.data(), patch.size());
  const auto j = nlohmann::json::parse(describe_patch(parsed));
  EXPECT_EQ(j["bytes"], patch.size());
  EXPECT_EQ(j["base_version"], 4);
  EXPECT_EQ(j["target_version"], 5);
  EXPECT_EQ(j["values"], "keydiff");
  EXPECT_EQ(j["indices"], "gap-varint");
  EXPECT_EQ(j["compressor"], "zstd");
  EXPECT_EQ(j["signed"], false);
  EXPECT_EQ(j["total_changed"], 3);  // w's three elements; F4 is carried whole
  EXPECT_EQ(j["target_state"], to_hex(parsed.header.target_state));
  EXPECT_EQ(j["entries"]["tensors"], parsed.entries.size());
  nlohmann::json bf16;
  for (const auto& row : j["summary"])
    if (row["dtype"] == "BF16") bf16 = row;
  EXPECT_EQ(bf16["changed"], 3);
  EXPECT_EQ(bf16["elements"], 1000);
  std::vector<std::string> removed = j["removed"], added;
  for (const auto& t : j["added"]) added.push_back(t["name"]);
  std::sort(removed.begin(), removed.end());
  std::sort(added.begin(), added.end());
  EXPECT_EQ(removed, (std::vector<std::string>{"gone", "r"}));  // a re-declared tensor is removed and added
  EXPECT_EQ(added, (std::vector<std::string>{"new", "r"}));
  EXPECT_FALSE(j.contains("metadata"));  // only when the patch changes it
}
