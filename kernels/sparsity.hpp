#pragma once
// Sparsity of BF16 weight updates: which elements changed between two BF16 snapshots (bit
// patterns, so +0/-0 and NaN payload changes count), per tensor, compacted into sorted
// (index, new bits) lists, against the last k snapshots, and how many gradients are tiny.
// All counts are integer reductions, so results are identical on every backend.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.hpp"
#include "kernels/bf16.hpp"
#include "kernels/host_copy.hpp"
#include "kernels/segments.hpp"
#include "kernels/types.hpp"
#include "core/element_compare.hpp"

namespace pulse {

namespace detail {

// Sum of a runtime-length array of counts; body(i, counts) adds element i's contributions.
// Kokkos 3.4 takes runtime-length reductions only from a functor with value_count.
template <class Body>
struct CountArray {
  using value_type = index_t[];
  std::size_t value_count;
  Body body;

  KOKKOS_INLINE_FUNCTION void operator()(const index_t i, index_t* counts) const { body(i, counts); }
  KOKKOS_INLINE_FUNCTION void init(index_t* counts) const {
    for (std::size_t j = 0; j < value_count; ++j) counts[j] = 0;
  }
#if KOKKOS_VERSION < 40000
  KOKKOS_INLINE_FUNCTION void join(volatile index_t* dst, const volatile index_t* src) const {
    for (std::size_t j = 0; j < value_count; ++j) dst[j] += src[j];
  }
#else
  KOKKOS_INLINE_FUNCTION void join(index_t* dst, const index_t* src) const {
    for (std::size_t j = 0; j < value_count; ++j) dst[j] += src[j];
  }
#endif
};

template <class ExecSpace, class Body>
std::vector<index_t> count_array(const ExecSpace& space, const std::string& label, index_t n,
                                 std::size_t num_counts, const Body& body) {
  std::vector<index_t> counts(num_counts, 0);
  if (num_counts == 0) return counts;
  Kokkos::View<index_t*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> result(counts.data(), num_counts);
  Kokkos::parallel_reduce(label, FlatPolicy<ExecSpace>(space, 0, n), CountArray<Body>{num_counts, body},
                          result);
  space.fence();
  return counts;
}

// Host backends: the same sums a block of elements at a time. block(begin, end, counts) runs one
// plain loop per count over [begin, end), which the compiler vectorises while the block stays in
// cache (CountArray's loop over the counts for each element does not vectorise). A block's count
// fits 16 bits, the lane width of BF16 compares.
inline constexpr index_t count_block_length = 4096;
using BlockCount = std::uint16_t;
static_assert(count_block_length <= 65535);

template <class ExecSpace, class Block>
std::vector<index_t> count_blocks(const ExecSpace& space, const std::string& label, index_t n,
                                  std::size_t num_counts, const Block& block) {
  const index_t num_blocks = (n + count_block_length - 1) / count_block_length;
  return count_array(space, label, num_blocks, num_counts, [=](const index_t b, index_t* counts) {
    const index_t begin = b * count_block_length;
    block(begin, begin + count_block_length < n ? begin + count_block_length : n, counts);
  });
}

template <class OldView, class NewView>
void check_bf16_pair(const OldView& old_bits, const NewView& new_bits) {
  static_assert(std::is_same_v<typename OldView::non_const_value_type, bf16_bits>);
  static_assert(std::is_same_v<typename NewView::non_const_value_type, bf16_bits>);
  static_assert(OldView::rank == 1 && NewView::rank == 1);
  PULSE_CHECK(old_bits.extent(0) == new_bits.extent(0),
              "BF16 snapshots differ in length: " + std::to_string(old_bits.extent(0)) + " vs " +
                  std::to_string(new_bits.extent(0)));
}

}  // namespace detail

// ---- compaction ----

// Writes, in increasing order, every i in [0, n) with keep(i) to indices_out and value(i) to
// values_out, but at most capacity = indices_out.extent(0) of them, and returns how many i
// satisfy keep. The caller sizes the outputs from a guess (say the previous step's count): if
// the returned count exceeds the capacity, only the first `capacity` entries were written, so
// grow the outputs to the count and call again. One call reads [0, n) once.
//
// prefetch(begin, end), host backends on one thread only: a hint that elements [begin, end) are
// read next (one core's hardware prefetcher alone does not keep its read stream at the read
// bound); the results do not depend on it.
template <class ExecSpace, class Keep, class Value, class IndexView, class ValueView, class Prefetch>
index_t compact_if(const ExecSpace& space, const std::string& label, index_t n, const Keep& keep,
                   const Value& value, const IndexView& indices_out, const ValueView& values_out,
                   const Prefetch& prefetch) {
  static_assert(std::is_same_v<typename IndexView::value_type, index_t>);
  PULSE_CHECK(indices_out.extent(0) == values_out.extent(0),
              "compaction outputs differ in capacity: " + std::to_string(indices_out.extent(0)) + " indices vs " +
                  std::to_string(values_out.extent(0)) + " values");
  const index_t capacity = static_cast<index_t>(indices_out.extent(0));
  index_t count = 0;
  if constexpr (is_host_space<ExecSpace>) {
    if (takes_host_path(space)) {
      if (space.concurrency() == 1) {
        // One thread: one pass in blocks of 256 elements. The keep flags come from a loop the
        // compiler vectorises and are read eight bytes at a time: at the sparsity of weight updates
        // most words are 0, and a set word names its kept elements by its set bits (little-endian:
        // flag j + t is byte t), written while the block is still in cache.
        constexpr index_t block = 256, prefetch_distance = 4096;
        Kokkos::parallel_reduce(
            label, FlatPolicy<ExecSpace>(space, 0, 1),
            [=](index_t, index_t& kept) {
              // A local copy: the byte stores to flags below could otherwise alias the functor's
              // view pointers, and the compiler would reload them per element instead of vectorising.
              const Keep keep_local = keep;
              std::uint8_t flags[block];
              for (index_t begin = 0; begin < n; begin += block) {
                const index_t length = begin + block <= n ? block : n - begin;
                if (begin + prefetch_distance < n)
                  prefetch(begin + prefetch_distance, std::min(begin + prefetch_distance + block, n));
                if (length == block) {  // a fixed trip count unrolls into straight vector code
                  for (index_t j = 0; j < block; ++j) flags[j] = keep_local(begin + j) ? 1 : 0;
                } else {
                  std::memset(flags, 0, sizeof flags);
                  for (index_t j = 0; j < length; ++j) flags[j] = keep_local(begin + j) ? 1 : 0;
                }
                for (index_t j = 0; j < length; j += 8) {
                  std::uint64_t word;
                  std::memcpy(&word, flags + j, sizeof word);
                  for (; word != 0; word &= word - 1, ++kept) {
                    if (kept >= capacity) continue;
                    const index_t i = begin + j + (__builtin_ctzll(word) >> 3);
                    indices_out(kept) = i;
                    values_out(kept) = value(i);
                  }
                }
              }
            },
            count);
        return count;
      }
      // Threads: blocks of 64 elements, in two kernels. The first packs each block's keep flags
      // into a 64-bit mask: the flags come from a loop the compiler vectorises and are packed eight
      // at a time. The second scans the masks and writes the kept elements; at the sparsity of
      // weight updates most masks are 0. (One scan over the elements would read them twice on a
      // threaded backend, whose scan calls its body once to count and once to write.)
      constexpr int block = 64;
      const index_t num_blocks = (n + block - 1) / block;
      // Plain host memory rather than a Kokkos allocation per call: pulse-sync compacts in chunks
      // of 2^16 elements, where a View's allocation record would cost as much as the scan.
      const std::unique_ptr<std::uint64_t[]> mask_storage(new std::uint64_t[num_blocks]);
      const Kokkos::View<std::uint64_t*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> masks(mask_storage.get(),
                                                                                         num_blocks);
      Kokkos::parallel_for(
          label + "::masks", FlatPolicy<ExecSpace>(space, 0, num_blocks), [=](const index_t b) {
            // A local copy: the byte stores to flags below could otherwise alias the functor's
            // view pointers (the threaded backends call the functor through a pointer), and the
            // compiler would reload them per element instead of vectorising.
            const Keep keep_local = keep;
            const index_t begin = b * block;
            const int length = begin + block <= n ? block : static_cast<int>(n - begin);
            std::uint8_t flags[block] = {};
            if (length == block) {  // a fixed trip count unrolls into straight vector code
              for (int j = 0; j < block; ++j) flags[j] = keep_local(begin + j) ? 1 : 0;
            } else {
              for (int j = 0; j < length; ++j) flags[j] = keep_local(begin + j) ? 1 : 0;
            }
            std::uint64_t mask = 0;
            for (int k = 0; k < block / 8; ++k) {
              std::uint64_t eight;  // flags 8k..8k+7, one per byte (little-endian)
              std::memcpy(&eight, flags + 8 * k, 8);
              // The multiply moves byte j's bit to bit 56 + j without carries.
              mask |= ((eight * 0x0102040810204080ull) >> 56) << (8 * k);
            }
            masks(b) = mask;
          });
      Kokkos::parallel_scan(
          label, FlatPolicy<ExecSpace>(space, 0, num_blocks),
          [=](const index_t b, index_t& offset, const bool final) {
            std::uint64_t mask = masks(b);
            const int kept = __builtin_popcountll(mask);
            if (final) {
              for (index_t out = offset; mask != 0 && out < capacity; ++out, mask &= mask - 1) {
                const index_t i = b * block + __builtin_ctzll(mask);
                indices_out(out) = i;
                values_out(out) = value(i);
              }
            }
            offset += kept;
          },
          count);
      return count;
    }
  }
  Kokkos::parallel_scan(
      label, FlatPolicy<ExecSpace>(space, 0, n),
      KOKKOS_LAMBDA(const index_t i, index_t& offset, const bool final) {
        if (!keep(i)) return;
        if (final && offset < capacity) {
          indices_out(offset) = i;
          values_out(offset) = value(i);
        }
        ++offset;
      },
      count);
  return count;
}

template <class ExecSpace, class Keep, class Value, class IndexView, class ValueView>
index_t compact_if(const ExecSpace& space, const std::string& label, index_t n, const Keep& keep,
                   const Value& value, const IndexView& indices_out, const ValueView& values_out) {
  return compact_if(space, label, n, keep, value, indices_out, values_out, [](index_t, index_t) {});
}

// ---- changed elements between two BF16 snapshots ----

template <class ExecSpace, class OldView, class NewView>
index_t count_changed(const ExecSpace& space, const OldView& old_bits, const NewView& new_bits) {
  detail::check_bf16_pair(old_bits, new_bits);
  const index_t n = static_cast<index_t>(old_bits.extent(0));
  index_t count = 0;
  if constexpr (is_host_space<ExecSpace>) {
    if (takes_host_path(space)) {
      // Blocks of count_block_length: a block's count sums in 16-bit lanes, the compare's width
      // (a 64-bit count per element would widen every compare result four times).
      constexpr index_t length = detail::count_block_length;
      Kokkos::parallel_reduce(
          "pulse::sparsity::count", FlatPolicy<ExecSpace>(space, 0, (n + length - 1) / length),
          [=](const index_t b, index_t& c) {
            const index_t begin = b * length, end = begin + length < n ? begin + length : n;
            detail::BlockCount changed = 0;
            for (index_t i = begin; i < end; ++i) changed += old_bits(i) != new_bits(i);
            c += changed;
          },
          count);
      return count;
    }
  }
  Kokkos::parallel_reduce(
      "pulse::sparsity::count", FlatPolicy<ExecSpace>(space, 0, n),
      KOKKOS_LAMBDA(const index_t i, index_t& c) { c += old_bits(i) != new_bits(i); }, count);
  return count;
}

struct ChangeCounts {
  index_t total = 0;
  std::vector<index_t> per_tensor;  // indexed by tensor-table position; empty tensors count 0
};

// Per-tensor counts in one pass: one team per segment, one atomic add per segment.
template <class ExecSpace, class MemSpace, class OldView, class NewView>
ChangeCounts count_changed(const ExecSpace& space, const TensorSegments<MemSpace>& segments,
                           const OldView& old_bits, const NewView& new_bits) {
  detail::check_bf16_pair(old_bits, new_bits);
  PULSE_CHECK(segments.num_elements == static_cast<index_t>(old_bits.extent(0)),
              "tensor segments cover " + std::to_string(segments.num_elements) + " elements, snapshots hold " +
                  std::to_string(old_bits.extent(0)));
  Kokkos::View<index_t*, typename ExecSpace::memory_space> per_tensor("pulse::sparsity::per_tensor",
                                                                      segments.num_tensors);
  const auto segs = segments.segments;
  const bool host_path = takes_host_path(space);
  using Team = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  Kokkos::parallel_for(
      "pulse::sparsity::count_per_tensor", segment_policy(space, segments, host_path),
      KOKKOS_LAMBDA(const Team& team) {
        const Segment seg = segs(team.league_rank());
        const index_t count = segment_sum<ExecSpace>(
            team, seg, host_path, [&](const index_t i) -> index_t { return old_bits(i) != new_bits(i); });
        Kokkos::single(Kokkos::PerTeam(team), [&]() { Kokkos::atomic_add(&per_tensor(seg.tensor), count); });
      });
  ChangeCounts result;
  result.per_tensor.resize(segments.num_tensors);
  Kokkos::deep_copy(space, Kokkos::View<index_t*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                               result.per_tensor.data(), result.per_tensor.size()),
                    per_tensor);
  space.fence();
  for (const index_t c : result.per_tensor) result.total += c;
  return result;
}

// Sorted flat indices of changed elements and their new bit patterns (a PULSESync patch's
// content). Capacity contract as compact_if: returns the true count, writes at most the
// outputs' extent.
template <class ExecSpace, class OldView, class NewView, class IndexView, class ValueView>
index_t compact_changed(const ExecSpace& space, const OldView& old_bits, const NewView& new_bits,
                        const IndexView& indices_out, const ValueView& values_out) {
  detail::check_bf16_pair(old_bits, new_bits);
  static_assert(std::is_same_v<typename ValueView::value_type, bf16_bits>);
#if defined(__AVX512BW__) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
  // One host thread: the changed elements' positions from core's find_changes (a mask per 64
  // bytes from one compare), where compact_if's generic keep flags (a byte per element, then
  // read back) run at half the read bound on CPUs whose one core reads faster (Zen 4). Unequal
  // capacities: compact_if refuses them.
  if constexpr (is_host_space<ExecSpace>) {
    if (takes_host_path(space) && space.concurrency() == 1 && old_bits.span_is_contiguous() &&
        new_bits.span_is_contiguous() && indices_out.extent(0) == values_out.extent(0)) {
      const index_t n = static_cast<index_t>(old_bits.extent(0));
      const index_t capacity = static_cast<index_t>(indices_out.extent(0));
      const auto* o = reinterpret_cast<const std::byte*>(old_bits.data());
      const auto* t = reinterpret_cast<const std::byte*>(new_bits.data());
      constexpr index_t chunk = static_cast<index_t>(kMaxFindElements);
      index_t kept = 0;
      for (index_t first = 0; first < n; first += chunk) {
        const std::size_t length = static_cast<std::size_t>(std::min(chunk, n - first));
        const FoundChanges found = find_changes(t + 2 * first, o + 2 * first, length, 2);
        for (std::size_t k = 0; k < found.count; ++k, ++kept) {
          if (kept >= capacity) continue;
          const index_t i = first + found.positions[k];
          indices_out(kept) = i;
          values_out(kept) = new_bits.data()[i];
        }
      }
      return kept;
    }
  }
#endif
  return compact_if(
      space, "pulse::sparsity::compact", static_cast<index_t>(old_bits.extent(0)),
      KOKKOS_LAMBDA(const index_t i) { return old_bits(i) != new_bits(i); },
      KOKKOS_LAMBDA(const index_t i) { return new_bits(i); }, indices_out, values_out,
      [=](const index_t begin, const index_t end) {
        for (index_t i = begin; i < end; i += 32) {  // 32 BF16 values: a 64-byte cache line
          __builtin_prefetch(&old_bits(i));
          __builtin_prefetch(&new_bits(i));
        }
      });
}

// ---- k-step sparsity ----

namespace detail {

// For each row r in rows, the count of elements whose bits differ between history's row r and
// current (SnapshotRing::count_changed_k); then, when write_row >= 0, current is copied into that
// row in the same pass (each element compared before it is overwritten: write_row may be one of rows).
template <class ExecSpace, class History, class Rows, class View>
std::vector<index_t> count_changed_rows(const ExecSpace& space, const History& history, const Rows& rows,
                                        const View& current, int write_row = -1) {
  const index_t n = static_cast<index_t>(current.extent(0));
  const std::size_t num_rows = rows.extent(0);
  if constexpr (is_host_space<ExecSpace>) {
    if (takes_host_path(space)) {
      return count_blocks(space, "pulse::sparsity::count_k", n, num_rows,
                          [=](const index_t begin, const index_t end, index_t* c) {
                            for (std::size_t j = 0; j < num_rows; ++j) {
                              const int r = rows(j);
                              BlockCount changed = 0;
                              for (index_t i = begin; i < end; ++i) changed += history(r, i) != current(i);
                              c[j] += changed;
                            }
                            if (write_row >= 0)
                              for (index_t i = begin; i < end; ++i) history(write_row, i) = current(i);
                          });
    }
  }
  return count_array(space, "pulse::sparsity::count_k", n, num_rows, KOKKOS_LAMBDA(const index_t i, index_t* c) {
    const bf16_bits now = current(i);
    for (std::size_t j = 0; j < num_rows; ++j) c[j] += history(rows(j), i) != now;
    if (write_row >= 0) history(write_row, i) = now;
  });
}

}  // namespace detail

// The last `depth` BF16 snapshots, one row each of a depth x n view. Compare first, then push:
// count_changed_k(current, {1}) against the previous push is the per-step change count.
template <class MemSpace = DefaultMem>
class SnapshotRing {
 public:
  SnapshotRing(int depth, index_t num_elements)
      : history_(Kokkos::view_alloc(Kokkos::WithoutInitializing, "pulse::sparsity::snapshots"),
                 check_depth(depth), num_elements) {}

  int depth() const { return static_cast<int>(history_.extent(0)); }
  int size() const { return size_; }
  index_t num_elements() const { return static_cast<index_t>(history_.extent(1)); }

  // The snapshot pushed k pushes ago (k = 1: the latest), 1 <= k <= size().
  Kokkos::View<const bf16_bits*, Kokkos::LayoutRight, MemSpace> snapshot(int k) const {
    PULSE_CHECK(k >= 1 && k <= size_, "snapshot " + std::to_string(k) + " steps back, ring holds " +
                                          std::to_string(size_));
    return Kokkos::subview(history_, row(k), Kokkos::ALL);
  }

  template <class ExecSpace, class View>
  void push(const ExecSpace& space, const View& current) {
    check_current(current);
    Kokkos::deep_copy(space, Kokkos::subview(history_, head_, Kokkos::ALL), current);
    advance();
  }

  // For each k in ks, the count of elements whose bits differ between current and the snapshot
  // from k pushes ago, or -1 where the ring does not reach back k pushes. One pass over current.
  template <class ExecSpace, class View>
  std::vector<index_t> count_changed_k(const ExecSpace& space, const View& current,
                                       const std::vector<int>& ks) const {
    return count_rows(space, current, ks, -1);
  }

  // count_changed_k, then push(current), in one pass over current and the ring.
  template <class ExecSpace, class View>
  std::vector<index_t> count_changed_k_and_push(const ExecSpace& space, const View& current,
                                                const std::vector<int>& ks) {
    const std::vector<index_t> counts = count_rows(space, current, ks, head_);
    advance();
    return counts;
  }

 private:
  static int check_depth(int depth) {
    PULSE_CHECK(depth >= 1, "snapshot ring depth must be at least 1, got " + std::to_string(depth));
    return depth;
  }

  int row(int k) const { return ((head_ - k) % depth() + depth()) % depth(); }

  // The row just written becomes the newest snapshot.
  void advance() {
    head_ = (head_ + 1) % depth();
    if (size_ < depth()) ++size_;
  }

  // count_changed_k's counts; write_row >= 0: current is copied into that row in the same pass
  // (const as count_changed_k is; only count_changed_k_and_push passes a row).
  template <class ExecSpace, class View>
  std::vector<index_t> count_rows(const ExecSpace& space, const View& current, const std::vector<int>& ks,
                                  int write_row) const {
    check_current(current);
    std::vector<int> rows;  // ring rows of the ks that the history reaches
    for (const int k : ks) {
      PULSE_CHECK(k >= 1, "k-step distance must be at least 1, got " + std::to_string(k));
      if (k <= size_) rows.push_back(row(k));
    }
    // The pass runs only when there is a row to compare: a push before the history reaches any k copies.
    if (rows.empty() && write_row >= 0)
      Kokkos::deep_copy(space, Kokkos::subview(history_, write_row, Kokkos::ALL), current);
    const auto rows_d = to_device<typename ExecSpace::memory_space>(rows, "pulse::sparsity::kstep_rows");
    const std::vector<index_t> counts = detail::count_changed_rows(space, history_, rows_d, current, write_row);
    std::vector<index_t> result;
    std::size_t next = 0;
    for (const int k : ks) result.push_back(k <= size_ ? counts[next++] : -1);
    return result;
  }

  template <class View>
  void check_current(const View& current) const {
    static_assert(std::is_same_v<typename View::non_const_value_type, bf16_bits>);
    static_assert(View::rank == 1);
    PULSE_CHECK(static_cast<index_t>(current.extent(0)) == num_elements(),
                "snapshot of " + std::to_string(current.extent(0)) + " elements, ring holds " +
                    std::to_string(num_elements()));
  }

  Kokkos::View<bf16_bits**, Kokkos::LayoutRight, MemSpace> history_;
  int head_ = 0;  // row the next push writes
  int size_ = 0;  // snapshots held, at most depth
};

// ---- gradient sparsity ----

// |x| by clearing the sign bit, without libm (host and device).
KOKKOS_INLINE_FUNCTION float abs_bits(const float x) { return bits_to_float(float_to_bits(x) & 0x7FFFFFFFu); }

// For each tau, the count of |g| <= tau, compared in FP32 as PyTorch compares a float tensor
// with a Python scalar. NaN never counts. One pass over grad.
template <class ExecSpace, class GradView>
std::vector<index_t> count_small(const ExecSpace& space, const GradView& grad, const std::vector<float>& taus) {
  static_assert(std::is_same_v<typename GradView::non_const_value_type, float>);
  static_assert(GradView::rank == 1);
  for (const float tau : taus) PULSE_CHECK(!std::isnan(tau), "gradient threshold is NaN");
  const auto taus_d = to_device<typename ExecSpace::memory_space>(taus, "pulse::sparsity::taus");
  const std::size_t num_taus = taus.size();
  const index_t n = static_cast<index_t>(grad.extent(0));
  if constexpr (is_host_space<ExecSpace>) {
    if (takes_host_path(space)) {
      return detail::count_blocks(space, "pulse::sparsity::count_small", n, num_taus,
                                  [=](const index_t begin, const index_t end, index_t* c) {
                                    for (std::size_t j = 0; j < num_taus; ++j) {
                                      const float tau = taus_d(j);
                                      detail::BlockCount small = 0;
                                      for (index_t i = begin; i < end; ++i) small += abs_bits(grad(i)) <= tau;
                                      c[j] += small;
                                    }
                                  });
    }
  }
  return detail::count_array(
      space, "pulse::sparsity::count_small", n, num_taus, KOKKOS_LAMBDA(const index_t i, index_t* c) {
        const float a = abs_bits(grad(i));
        for (std::size_t j = 0; j < num_taus; ++j) c[j] += a <= taus_d(j);
      });
}

}  // namespace pulse
