// parse_patch on hand-made patches whose entry counts add up only modulo 2^64: the sums must
// be checked, not wrapped (issue 12, item 9). Patches are laid out per src/sync/FORMAT.md and
// carry a valid checksum, so only the count checks can reject them.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "sync/patch.hpp"

namespace {

using pulse::sync::Digest;

struct Bytes {
  std::vector<std::uint8_t> out;
  template <class T>
  void put(T v) {
    for (std::size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<std::uint8_t>(std::uint64_t(v) >> (8 * i)));
  }
  void put_text(const std::string& s) { out.insert(out.end(), s.begin(), s.end()); }
};

struct Entry {
  std::string name, dtype;
  std::vector<std::int64_t> shape;
  std::uint8_t kind;  // 0 sparse, 1 same, 2 whole
  std::uint64_t count;
};

// An unsigned patch, values raw, indices gap-varint, no compressor, with the given entries and
// total_changed, and a whole stream of whole_bytes zero bytes.
std::vector<std::uint8_t> make_patch(const std::vector<Entry>& entries, std::uint64_t total_changed,
                                     std::uint64_t whole_bytes) {
  Bytes table;
  for (const auto& e : entries) {
    table.put<std::uint16_t>(e.name.size());
    table.put_text(e.name);
    table.put<std::uint8_t>(e.dtype.size());
    table.put_text(e.dtype);
    table.put<std::uint8_t>(e.shape.size());
    for (auto d : e.shape) table.put<std::int64_t>(d);
    table.put<std::uint8_t>(e.kind);
    table.put<std::uint8_t>(0);
    table.put<std::uint64_t>(e.count);
    table.out.insert(table.out.end(), 32, 0);  // base and target digests
  }
  Bytes b;
  b.put_text("PULSEPCH");
  b.put<std::uint16_t>(1);
  b.put<std::uint16_t>(0);
  b.put<std::uint8_t>(0);  // values raw
  b.put<std::uint8_t>(1);  // gap-varint
  b.put<std::uint8_t>(0);  // no compressor
  b.put<std::uint8_t>(0);
  b.put<std::uint64_t>(0);
  b.put<std::uint64_t>(1);
  b.out.insert(b.out.end(), 32, 0);  // base and target state digests
  b.put<std::uint64_t>(total_changed);
  b.put<std::uint32_t>(entries.size());
  for (std::uint64_t raw : {std::uint64_t(0), std::uint64_t(0), whole_bytes}) {
    b.put<std::uint64_t>(raw);
    b.put<std::uint64_t>(raw);
  }
  b.put<std::uint64_t>(table.out.size());
  b.out.insert(b.out.end(), table.out.begin(), table.out.end());
  b.out.insert(b.out.end(), whole_bytes, 0);
  const Digest checksum = pulse::sync::digest_bytes(b.out.data(), b.out.size());
  b.out.insert(b.out.end(), checksum.begin(), checksum.end());
  return b.out;
}

TEST(PatchCounts, ConsistentHandMadePatchParses) {
  // The builder itself is right: a consistent patch of the same shape is accepted.
  const auto patch = make_patch({{"a", "F32", {1}, 2, 4}, {"b", "BF16", {8}, 0, 0}}, 0, 4);
  const auto parsed = pulse::sync::parse_patch(patch.data(), patch.size());
  EXPECT_EQ(parsed.entries.size(), 2u);
  EXPECT_EQ(parsed.header.whole_stream.raw, 4u);
}

TEST(PatchCounts, WholeByteCountsThatWrapAreRejected) {
  const std::uint64_t half = std::uint64_t(1) << 63;  // half + half + 1 == 1 modulo 2^64
  const auto patch = make_patch({{"a", "F32", {1}, 2, half}, {"b", "F32", {1}, 2, half}, {"c", "F32", {1}, 2, 1}}, 0, 1);
  EXPECT_THROW(pulse::sync::parse_patch(patch.data(), patch.size()), pulse::Error);
}

TEST(PatchCounts, SparseCountsThatWrapAreRejected) {
  const std::int64_t quarter = std::int64_t(1) << 62;  // four entries of 2^62 changes add up to 0
  std::vector<Entry> entries;
  for (const char* name : {"a", "b", "c", "d"}) entries.push_back({name, "BF16", {quarter}, 0, std::uint64_t(quarter)});
  const auto patch = make_patch(entries, 0, 0);
  EXPECT_THROW(pulse::sync::parse_patch(patch.data(), patch.size()), pulse::Error);
}

}  // namespace
