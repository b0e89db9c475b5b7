// Tensor table and segments: offsets, masks, and the cut of the flat buffer into segments.
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "core/tensor_table.hpp"
#include "kernels/segments.hpp"

TEST(TensorTable, OffsetsFollowInsertionOrder) {
  pulse::TensorTable table;
  table.add("wte.weight", {10, 4});
  table.add("ln.bias", {4}, false);
  table.add("empty", {0, 3});
  table.add("scalar", {});
  EXPECT_EQ(table.offsets(), (std::vector<pulse::index_t>{0, 40, 44, 44, 45}));
  EXPECT_EQ(table.num_elements(), 45);
  EXPECT_EQ(table.weight_decay_mask(), (std::vector<std::uint8_t>{1, 0, 1, 1}));
  EXPECT_EQ(table.index_of("ln.bias"), 1);
  EXPECT_THROW(table.index_of("nope"), pulse::Error);
  EXPECT_THROW(table.add("ln.bias", {1}), pulse::Error);
  EXPECT_THROW(table.add("neg", {-1}), pulse::Error);
}

TEST(TensorSegments, CoverEachTensorExactlyOnce) {
  const std::vector<pulse::index_t> offsets{0, 10, 10, 11, 40};
  auto segs = pulse::make_segments<Kokkos::HostSpace>(offsets, 8);
  EXPECT_EQ(segs.num_tensors, 4);
  EXPECT_EQ(segs.num_elements, 40);
  std::vector<int> owner(40, -1);
  for (std::size_t s = 0; s < segs.segments.extent(0); ++s) {
    const auto seg = segs.segments(s);
    EXPECT_LE(seg.end - seg.begin, 8);
    EXPECT_GT(seg.end, seg.begin);
    for (auto i = seg.begin; i < seg.end; ++i) {
      EXPECT_EQ(owner[i], -1);
      owner[i] = seg.tensor;
    }
  }
  for (int i = 0; i < 40; ++i) EXPECT_EQ(owner[i], i < 10 ? 0 : i < 11 ? 2 : 3) << i;
  EXPECT_THROW(pulse::make_segments<Kokkos::HostSpace>({0, 5, 3}), pulse::Error);
}
