// The checked-in test vectors (tests/vectors, FORMAT.md "Test vectors"): every patch parses,
// applies to the base and reaches its target state byte for byte, with the digests the
// manifest records; the uncompressed ones are also exactly what the encoder writes today (their
// bytes are fixed by the spec, where a compressor's output may vary between library versions).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "sync/change_history.hpp"
#include "sync/checkpoint.hpp"
#include "coding/digest.hpp"
#include "sync/patch.hpp"

#ifndef PULSE_VECTORS_DIR
#error "PULSE_VECTORS_DIR names tests/vectors"
#endif

namespace {

using namespace pulse::sync;

const std::string kDir = PULSE_VECTORS_DIR;

std::vector<std::uint8_t> read_bytes(const std::string& file) {
  std::ifstream in(kDir + "/" + file, std::ios::binary);
  EXPECT_TRUE(in.good()) << file;
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

nlohmann::json manifest() { return nlohmann::json::parse(read_bytes("manifest.json")); }

Checkpoint load(const nlohmann::json& m, const std::string& state) {
  return load_checkpoint(kDir + "/" + m["states"][state]["file"].get<std::string>());
}

ChangeHistory history(const nlohmann::json& m, const Checkpoint& base) {
  return ChangeHistory(base.layout, read_bytes(m["history"]["file"]),
                       digest_from_hex(m["history"]["digest"].get<std::string>()));
}

TEST(Vectors, StatesHaveTheirManifestDigests) {
  const auto m = manifest();
  ASSERT_GE(m["states"].size(), 4u);
  for (const auto& [name, s] : m["states"].items()) {
    const Checkpoint c = load(m, name);
    EXPECT_EQ(to_hex(compute_digests(c.layout, c.metadata, 1).state), s["state_digest"]) << name;
  }
}

TEST(Vectors, EveryPatchAppliesToItsTarget) {
  const auto m = manifest();
  ASSERT_GE(m["vectors"].size(), 15u);
  std::set<std::string> codings, compressors;
  for (const auto& v : m["vectors"]) {
    const std::string name = v["name"];
    SCOPED_TRACE(name);
    const std::vector<std::uint8_t> bytes = read_bytes(v["patch"]);
    ASSERT_EQ(bytes.size(), v["patch_bytes"].get<std::size_t>());
    EXPECT_EQ(to_hex(digest_bytes(bytes.data(), bytes.size())), v["patch_xxh3"]);
    const ParsedPatch patch = parse_patch(bytes.data(), bytes.size());
    EXPECT_EQ(patch.parts.size(), v["parts"].get<std::size_t>());
    EXPECT_EQ(value_coding_name(patch.header.values), v["values"].get<std::string>());
    EXPECT_EQ(to_hex(patch.header.base_state), m["states"][v["base"].get<std::string>()]["state_digest"]);
    EXPECT_EQ(to_hex(patch.header.target_state), m["states"][v["target"].get<std::string>()]["state_digest"]);
    codings.insert(value_coding_name(patch.header.values) + std::string("/") + index_coding_name(patch.header.indices));
    compressors.insert(compressor_name(patch.header.compressor));

    Checkpoint state = load(m, v["base"]);
    const Checkpoint base = load(m, v["base"]);  // its own buffers (layout points into data)
    std::vector<MutableTensor> tensors = state.mutables();
    ChangeHistory h = history(m, base);
    StateChange change;
    apply_patch(patch, tensors, {}, nullptr, nullptr, state.metadata, &change, v["history"] ? &h : nullptr, 1);

    const Checkpoint target = load(m, v["target"]);
    std::map<std::string, std::vector<std::byte>> reached, expected;
    for (std::size_t i = 0; i < state.layout.size(); ++i) reached[state.layout[i].name] = state.data[i];
    for (const auto& r : change.removed) reached.erase(r);
    for (std::size_t i = 0; i < change.added.size(); ++i) reached[change.added[i].name] = change.added_bytes[i];
    for (std::size_t i = 0; i < target.layout.size(); ++i) expected[target.layout[i].name] = target.data[i];
    EXPECT_TRUE(reached == expected);
    EXPECT_EQ(change.metadata, target.metadata);

    if (v["compressor"] == "none") {  // the encoder of today writes the same bytes
      EncodeOptions o;
      o.values = patch.header.values;
      o.indices = patch.header.indices;
      o.compressor = patch.header.compressor;
      o.part_elements = v["part_elements"];
      o.base_version = patch.header.base_version;
      o.target_version = patch.header.target_version;
      const ChangeHistory sender = history(m, base);
      if (v["history"]) o.history = &sender;
      EXPECT_TRUE(encode_patch(base.layout, target.layout, o, nullptr, nullptr, base.metadata, target.metadata) ==
                  bytes);
    }
  }
  EXPECT_EQ(codings.size(), 6u);  // raw and keydiff with both gap codings, expclass, expclass-history
  EXPECT_EQ(compressors.size(), 3u);
}

// FORMAT.md "Accepted inputs": a non-minimal varint in the tables reads as its value. The first
// vector's entry count written as two bytes (with the table size and checksum fixed up) parses
// to the same patch.
TEST(Vectors, NonMinimalVarintInTheTableIsAccepted) {
  const auto m = manifest();
  std::vector<std::uint8_t> bytes = read_bytes(m["vectors"][0]["patch"]);
  const ParsedPatch original = parse_patch(bytes.data(), bytes.size());
  // The table starts at 136 with the dtype summary (no layout or metadata change): D, then
  // D x (string, 4 varints), then E. Walk to E.
  std::size_t pos = patch_fixed_header_bytes;
  auto varint = [&] {
    std::uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      const std::uint8_t b = bytes[pos++];
      v |= std::uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
  };
  const std::uint64_t dtypes = varint();
  for (std::uint64_t d = 0; d < dtypes; ++d) {
    pos += varint();
    for (int k = 0; k < 4; ++k) varint();
  }
  ASSERT_LT(bytes[pos], 0x80);
  bytes[pos] |= 0x80;
  bytes.insert(bytes.begin() + std::ptrdiff_t(pos) + 1, 0x00);
  std::uint64_t table = 0;
  for (int i = 0; i < 8; ++i) table |= std::uint64_t(bytes[128 + i]) << (8 * i);
  ++table;
  for (int i = 0; i < 8; ++i) bytes[128 + i] = std::uint8_t(table >> (8 * i));
  const Digest sum = digest_bytes(bytes.data(), bytes.size() - patch_checksum_bytes);
  std::copy(sum.begin(), sum.end(), bytes.end() - patch_checksum_bytes);
  const ParsedPatch p = parse_patch(bytes.data(), bytes.size());
  EXPECT_EQ(p.entries.size(), original.entries.size());
  EXPECT_EQ(p.table_bytes, original.table_bytes + 1);
}

}  // namespace
