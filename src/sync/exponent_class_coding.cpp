#include "sync/exponent_class_coding.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "core/error.hpp"

namespace pulse::sync {

namespace {

constexpr unsigned kMaxClasses = 256;

template <class T>
T load(const std::byte* data, std::uint64_t i) {
  T v;
  std::memcpy(&v, data + sizeof(T) * i, sizeof(T));
  return v;
}

// Adds the class counts of elements [begin, end) to kLanes histograms (rows of kMaxClasses).
// Neighbours often share a class, and one histogram would make every increment wait for the
// previous one; eight rows, filled from 8-byte words read before any increment, run several
// times faster than one or two rows read element by element.
constexpr unsigned kLanes = 8;

template <class T>
void count_classes(const std::byte* data, std::uint64_t begin, std::uint64_t end, unsigned shift, unsigned class_mask,
                   std::uint64_t* histograms) {
  constexpr unsigned kPerWord = 8 / sizeof(T);
  constexpr unsigned kBits = 8 * sizeof(T);
  std::uint64_t i = begin;
  for (; i + 2 * kPerWord <= end; i += 2 * kPerWord) {
    std::uint64_t a, b;  // little-endian: element j of a word sits at bit kBits * j
    std::memcpy(&a, data + sizeof(T) * i, 8);
    std::memcpy(&b, data + sizeof(T) * (i + kPerWord), 8);
    for (unsigned j = 0; j < kPerWord; ++j) {
      ++histograms[(j % kLanes) * kMaxClasses + ((a >> (kBits * j + shift)) & class_mask)];
      ++histograms[((kPerWord + j) % kLanes) * kMaxClasses + ((b >> (kBits * j + shift)) & class_mask)];
    }
  }
  for (; i < end; ++i) ++histograms[(load<T>(data, i) >> shift) & class_mask];
}

void count_classes(const SparseFormat& f, const std::byte* data, std::uint64_t begin, std::uint64_t end,
                   std::uint64_t* histograms) {
  const unsigned mask = f.classes() - 1;
  if (f.bytes == 1) count_classes<std::uint8_t>(data, begin, end, f.mantissa_bits, mask, histograms);
  if (f.bytes == 2 && f.mantissa_bits == 7)  // BF16, with constants
    count_classes<std::uint16_t>(data, begin, end, 7, 0xFF, histograms);
  else if (f.bytes == 2)
    count_classes<std::uint16_t>(data, begin, end, f.mantissa_bits, mask, histograms);
  if (f.bytes == 4) count_classes<std::uint32_t>(data, begin, end, f.mantissa_bits, mask, histograms);
}

// The receiver's pass: walks the old elements, counting down each class's gap to its next
// change; where one reaches its change, that element's index and new value are known.
struct ClassChange {
  std::uint64_t gap;  // elements of the class skipped before it
  std::int64_t step;  // key difference
};
struct ClassChanges {
  std::vector<std::uint64_t> first;  // per class: its first change in the class-major list
  // Class-major, each class's changes followed by a gap of UINT64_MAX (no further change). The
  // pass reads a dozen classes' places at once, too many streams for the hardware prefetcher
  // once the list outgrows the caches: advance asks for each class's next lines itself.
  const ClassChange* changes;
  // History variant: steps are |differences|; the tensor's history bytes, and where the signs
  // are read (in index order, as the pass finds the changes).
  const std::uint8_t* history = nullptr;
  RangeDecoder* signs = nullptr;
  ExponentClassModel* models = nullptr;
};

// Where the pass stands in each class: elements of the class still to skip before its next
// change (UINT64_MAX once it has none: counted down, it does not reach zero) and that change's
// place in the class-major lists.
struct ClassCursor {
  std::uint64_t left[kMaxClasses];
  std::uint64_t next[kMaxClasses];

  // Moves class k past its next change.
  void advance(const ClassChanges& c, unsigned k) {
    const ClassChange* change = c.changes + ++next[k];
    __builtin_prefetch(change + 8);  // two cache lines on: past the end is harmless for a prefetch
    left[k] = change->gap;
  }
};

#if defined(__AVX2__)
// 16-bit elements whose classes are concentrated, as trained weights' are: a handful of common
// ("hot") classes hold most elements. Per block of 64 elements, each hot class's elements form a
// 64-bit mask (one compare of the block's class bytes) whose popcount counts the class at once;
// only the other elements are counted one by one. The encoder's ranks and the decoder's
// count-down both pass over a tensor this way.
constexpr unsigned kBlock = 64;
constexpr unsigned kMaxHot = 8;

struct HotClasses {
  unsigned k[kMaxHot];
  unsigned count = 0;
};

// The classes that hold at least 1/128 of a sample of the tensor (an element in every other
// block), most common first; none when they cover less than 3/4 of it: the elements of other
// classes would cost more one by one than the blocks save. The decoder samples 4,096 elements;
// the encoder's ranker, made per tensor for every patch of a small model, 1,024 (its choice
// only decides the speed of its pass: the ranks are the same).
constexpr std::uint64_t kDecoderSamples = 4096, kRankerSamples = 1024;

HotClasses hot_classes(const std::byte* data, std::uint64_t n, unsigned shift, unsigned class_mask,
                       std::uint64_t most_samples) {
  HotClasses hot;
  if (n < kBlock) return hot;
  const std::uint64_t samples = std::min<std::uint64_t>(n, most_samples);
  std::uint32_t sampled[kMaxClasses] = {};
  for (std::uint64_t s = 0; s < samples; ++s) ++sampled[(load<std::uint16_t>(data, s * (n / samples)) >> shift) & class_mask];
  // The kMaxHot most common, by insertion (a partial sort of all classes cost as much as the sample).
  unsigned top[kMaxHot], num_top = 0;
  for (unsigned k = 0; k <= class_mask; ++k) {
    if (sampled[k] == 0 || (num_top == kMaxHot && sampled[k] <= sampled[top[kMaxHot - 1]])) continue;
    unsigned at = num_top < kMaxHot ? num_top++ : kMaxHot - 1;
    for (; at > 0 && sampled[top[at - 1]] < sampled[k]; --at) top[at] = top[at - 1];
    top[at] = k;
  }
  std::uint64_t covered = 0;
  for (; hot.count < num_top && 128 * sampled[top[hot.count]] >= samples; ++hot.count) {
    hot.k[hot.count] = top[hot.count];
    covered += sampled[hot.k[hot.count]];
  }
  if (4 * covered < 3 * samples) hot.count = 0;
  return hot;
}

// The classes of a block's 64 elements, one byte each in element order.
#if defined(__AVX512BW__)
// In one register: a class's members are one compare.
class BlockClasses {
 public:
  BlockClasses(unsigned shift, unsigned class_mask)
      : shift_(_mm_cvtsi32_si128(int(shift))), class_bits_(_mm512_set1_epi16(std::int16_t(class_mask))) {}

  void load(const std::byte* block) {
    const __m512i a = _mm512_and_si512(_mm512_srl_epi16(_mm512_loadu_si512(block), shift_), class_bits_);
    const __m512i b = _mm512_and_si512(_mm512_srl_epi16(_mm512_loadu_si512(block + 64), shift_), class_bits_);
    // packus interleaves 128-bit lanes: a's and b's 8-byte halves alternate. (The maskz form
    // with every lane kept: GCC 12 warns inside the plain one.)
    classes_ = _mm512_maskz_permutexvar_epi64(0xFF, _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), _mm512_packus_epi16(a, b));
  }
  // Bit j is set where element j of the block is of class k.
  std::uint64_t members(unsigned k) const { return _mm512_cmpeq_epi8_mask(classes_, _mm512_set1_epi8(char(k))); }

 private:
  __m128i shift_;
  __m512i class_bits_;
  __m512i classes_;
};
#else
class BlockClasses {
 public:
  BlockClasses(unsigned shift, unsigned class_mask)
      : shift_(_mm_cvtsi32_si128(int(shift))), class_bits_(_mm256_set1_epi16(std::int16_t(class_mask))) {}

  void load(const std::byte* block) {
    low_ = classes_of_32(block);
    high_ = classes_of_32(block + 64);
  }
  // Bit j is set where element j of the block is of class k.
  std::uint64_t members(unsigned k) const {
    const __m256i key = _mm256_set1_epi8(char(k));
    return std::uint64_t(std::uint32_t(_mm256_movemask_epi8(_mm256_cmpeq_epi8(low_, key)))) |
           std::uint64_t(std::uint32_t(_mm256_movemask_epi8(_mm256_cmpeq_epi8(high_, key)))) << 32;
  }

 private:
  __m256i classes_of_32(const std::byte* p) const {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
    const __m256i a = _mm256_and_si256(_mm256_srl_epi16(x, shift_), class_bits_);
    const __m256i b = _mm256_and_si256(_mm256_srl_epi16(y, shift_), class_bits_);
    return _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0xD8);  // packus interleaves 128-bit lanes
  }
  __m128i shift_;
  __m256i class_bits_;
  __m256i low_, high_;
};

#endif

// The encoder's pass in blocks from element `begin`: the rank of each change is its class's
// count before the block (`counts`, one row) plus its class's members in the block below it.
// Blocks end at the last change. Writes the ranks of changes [j, ...) to ranks[j] (one slot
// past the last change is written too) and returns the elements counted.
//
// A block holds 0.6 changes and 0.75 elements outside the hot classes on average at 99%
// sparsity, so loops over either ended in a mispredicted branch in most blocks: the first two
// of each are done without a branch (a result that does not count is added as 0 or
// overwritten), a loop only takes a third and more.
std::uint64_t rank_in_blocks(const SparseFormat& f, const std::byte* data, std::uint64_t begin,
                             const std::vector<unsigned>& hot, const index_t* indices, const std::uint32_t* old_bits,
                             std::size_t count, std::uint64_t* counts, std::size_t& ranked, std::uint64_t* ranks) {
  std::size_t j = ranked;  // in a register, not through the reference
  const std::uint64_t end = std::uint64_t(indices[count - 1]) + 1;
  const unsigned class_mask = f.classes() - 1;
  BlockClasses block(f.mantissa_bits, class_mask);
  // The rank of change c, if it lies in the block from i (anything if not).
  auto rank_of = [&](std::size_t c, std::uint64_t i) {
    const unsigned k = f.exponent_class(old_bits[c]);
    const std::uint64_t below = (std::uint64_t(1) << ((std::uint64_t(indices[c]) - i) & (kBlock - 1))) - 1;
    return counts[k] + std::uint64_t(__builtin_popcountll(block.members(k) & below));
  };
  std::uint64_t i = begin;
  for (; i + kBlock <= end; i += kBlock) {
    block.load(data + 2 * i);
    // j < count here: the last change lies in this block or a later one.
    const std::size_t next = std::min(j + 1, count - 1);
    const bool first_in = std::uint64_t(indices[j]) < i + kBlock;
    const bool second_in = j + 1 < count && std::uint64_t(indices[next]) < i + kBlock;  // implies first_in
    ranks[j] = rank_of(j, i);
    ranks[j + 1] = rank_of(next, i);
    j += std::size_t(first_in) + std::size_t(second_in);
    if (__builtin_expect(second_in, 0))
      for (; j < count && std::uint64_t(indices[j]) < i + kBlock; ++j) ranks[j] = rank_of(j, i);
    std::uint64_t in_hot = 0;
    for (unsigned k : hot) {
      const std::uint64_t members = block.members(k);
      in_hot |= members;
      counts[k] += std::uint64_t(__builtin_popcountll(members));
    }
    // The others: the bit at 63 makes each place lie in the block when there are fewer.
    std::uint64_t others = ~in_hot;
    auto class_at = [&](std::uint64_t bits) {
      return (load<std::uint16_t>(data, i + std::uint64_t(__builtin_ctzll(bits | std::uint64_t(1) << 63))) >>
              f.mantissa_bits) & class_mask;
    };
    const std::uint64_t second = others & (others - 1);
    counts[class_at(others)] += others != 0;
    counts[class_at(second)] += second != 0;
    if (__builtin_expect(second != 0, 0))
      for (others = second & (second - 1); others != 0; others &= others - 1) ++counts[class_at(others)];
  }
  ranked = j;
  return i;
}

// The place of the r-th (from 0) set bit of x, which has more than r: the byte that holds it
// from the bytes' running popcounts, then a table for the bit within the byte.
struct SelectInByte {
  std::uint8_t at[256][8] = {};
  constexpr SelectInByte() {
    for (unsigned b = 0; b < 256; ++b)
      for (unsigned bit = 0, r = 0; bit < 8; ++bit)
        if (b >> bit & 1) at[b][r++] = std::uint8_t(bit);
  }
};
constexpr SelectInByte kSelectInByte;

inline unsigned select_bit(std::uint64_t x, unsigned r) {
  constexpr std::uint64_t ones = 0x0101010101010101u, highs = 0x8080808080808080u;
  std::uint64_t b = x - ((x >> 1) & 0x5555555555555555u);
  b = (b & 0x3333333333333333u) + ((b >> 2) & 0x3333333333333333u);
  b = (b + (b >> 4)) & 0x0F0F0F0F0F0F0F0Fu;
  const std::uint64_t running = b * ones;  // byte j: set bits in bytes 0..j (at most 64)
  // Bytes whose running count is at most r lie below the r-th bit (bytewise r - count, no borrow).
  const unsigned byte = unsigned(__builtin_popcountll((((r * ones) | highs) - running) & highs));
  const unsigned before = unsigned((running << 8) >> (8 * byte)) & 0xFF;
  return 8 * byte + kSelectInByte.at[(x >> (8 * byte)) & 0xFF][r - before];
}

// The decoder's pass in blocks over elements [begin, end): each hot class's mask counts down its
// gap at once; the block's changes are emitted in element order. Returns the elements passed
// (whole blocks).
template <class Emit>
std::uint64_t locate_in_blocks(const std::byte* data, std::uint64_t begin, std::uint64_t end, const HotClasses& hot,
                               unsigned shift, unsigned class_mask, const ClassChanges& c, ClassCursor& cursor,
                               Emit&& emit) {
  BlockClasses block(shift, class_mask);
  struct Found {
    std::uint64_t i, at;
  };
  // The hot classes' counts to their next changes, by place in `hot`: kept here while the
  // blocks count them down.
  std::uint64_t left[kMaxHot];
  for (unsigned h = 0; h < hot.count; ++h) left[h] = cursor.left[hot.k[h]];
  std::uint64_t i = begin;
  for (; i + kBlock <= end; i += kBlock) {
    block.load(data + 2 * i);
    Found found[kBlock];
    unsigned num_found = 0;
    // Every hot class counted down at once, with a bit for each whose next change lies in the
    // block: one branch per block instead of one per class (most blocks hold no such change).
    // No array of the masks: GCC vectorised the popcounts over one, loading 32 bytes that four
    // 8-byte stores had just written (a store-forwarding stall per block); a hit class's mask
    // is one compare again.
    std::uint64_t in_hot = 0;
    unsigned hit = 0;
    for (unsigned h = 0; h < hot.count; ++h) {
      const std::uint64_t members = block.members(hot.k[h]);
      const std::uint64_t in_block = std::uint64_t(__builtin_popcountll(members));
      in_hot |= members;
      hit |= unsigned(left[h] < in_block) << h;
      left[h] -= in_block;  // wraps for a hit, undone below
    }
    for (; hit != 0; hit &= hit - 1) {
      const unsigned h = unsigned(__builtin_ctz(hit)), k = hot.k[h];
      std::uint64_t members = block.members(k);
      std::uint64_t in_block = std::uint64_t(__builtin_popcountll(members)), to_next = left[h] + in_block;
      while (to_next < in_block) {
        const unsigned at = select_bit(members, unsigned(to_next));
        found[num_found++] = {i + at, cursor.next[k]};
        members &= ~std::uint64_t(0) << at << 1;
        in_block -= to_next + 1;
        cursor.advance(c, k);
        to_next = cursor.left[k];
      }
      left[h] = to_next - in_block;
    }
    // The others count down one by one: the first two without a loop (a block holds 0.75 on
    // average; a loop's end was a mispredicted branch in most blocks), as in rank_in_blocks.
    auto count_down = [&](std::uint64_t bits) {
      const std::uint64_t e = i + std::uint64_t(__builtin_ctzll(bits | std::uint64_t(1) << 63));
      const unsigned k = (load<std::uint16_t>(data, e) >> shift) & class_mask;
      const bool counts = bits != 0;  // else e is a hot element and nothing changes
      const bool reached = counts && cursor.left[k] == 0;
      cursor.left[k] -= counts;
      if (__builtin_expect(reached, 0)) {
        found[num_found++] = {e, cursor.next[k]};
        cursor.advance(c, k);
      }
    };
    const std::uint64_t others = ~in_hot, second = others & (others - 1);
    count_down(others);
    count_down(second);
    if (__builtin_expect(second != 0, 0))
      for (std::uint64_t rest = second & (second - 1); rest != 0; rest &= rest - 1) count_down(rest);
    // In element order, by insertion: a block usually holds a change or two (at most 64, at
    // most 2,016 swaps, a bounded cost per element; a branch to std::sort for dense blocks cost
    // 5% at 99% sparsity).
    for (unsigned f = 1; f < num_found; ++f)
      for (unsigned g = f; g > 0 && found[g].i < found[g - 1].i; --g) std::swap(found[g], found[g - 1]);
    for (unsigned f = 0; f < num_found; ++f) emit(found[f].i, found[f].at);
  }
  for (unsigned h = 0; h < hot.count; ++h) cursor.left[hot.k[h]] = left[h];
  return i;
}
#endif

// History variant: a change's |key difference| with its sign, read from the value stream in the
// context of element i's history. Out of line: the pass's emit stays small for coding 3.
__attribute__((noinline)) std::int64_t with_sign(const ClassChanges& c, const SparseFormat& f, std::uint64_t i,
                                                 std::uint64_t old_bits, std::int64_t step) {
  const unsigned x = ChangeHistory::sign_context(c.history[i]);
  const bool lowered = x == 0 ? c.signs->decode_even(1) : c.signs->decode(c.models[f.exponent_class(old_bits)].sign[x]);
  return lowered ? -step : step;
}

// Shift and mask are constants for the common dtypes (kShift > 31: take them from the format).
template <class T, unsigned kShift = 32, unsigned kMask = 0>
std::uint64_t locate_changes(const SparseFormat& f, const std::byte* data, std::uint64_t n, const ClassChanges& c,
                             std::uint64_t total, std::uint64_t* indices, std::uint8_t* new_values,
                             const std::string& context, const ExponentClassDecoder::Passed& passed) {
  ClassCursor cursor;
  const unsigned classes = f.classes();
  for (unsigned k = 0; k < classes; ++k) {
    cursor.next[k] = c.first[k];
    cursor.left[k] = c.changes[c.first[k]].gap;
  }
  const unsigned shift = kShift < 32 ? kShift : f.mantissa_bits, mask = kShift < 32 ? kMask : classes - 1;
  const std::int64_t key_max = std::int64_t(f.mask());
  std::uint64_t found = 0;
  // Element i is the change at `at` of the class-major lists.
  auto emit = [&](std::uint64_t i, std::uint64_t at) {
    const T old_bits = load<T>(data, i);
    std::int64_t step = c.changes[at].step;
    if (__builtin_expect(c.history != nullptr, 0)) step = with_sign(c, f, i, old_bits, step);
    const std::int64_t key = std::int64_t(f.key(old_bits)) + step;
    PULSE_CHECK(key >= 0 && key <= key_max, "patch value out of range" + context);
    const T new_bits = static_cast<T>(f.from_key(std::uint64_t(key)));
    PULSE_CHECK(found < total, "patch index out of range" + context);
    indices[found] = i;
    std::memcpy(new_values + sizeof(T) * found, &new_bits, sizeof(T));
    ++found;
  };
  // Where class k's count runs out: element i changes; true once every change is found.
  auto reach = [&](std::uint64_t i, unsigned k) __attribute__((noinline)) {
    emit(i, cursor.next[k]);
    cursor.advance(c, k);
    return found == total;
  };
  // Counts down elements [i, end) one by one, two 8-byte words read before any count changes,
  // as in count_classes; true once every change is found.
  auto count_down = [&](std::uint64_t i, std::uint64_t end) {
    constexpr unsigned kPerWord = 8 / sizeof(T);
    for (; i + 2 * kPerWord <= end; i += 2 * kPerWord) {
      std::uint64_t a, b;
      std::memcpy(&a, data + sizeof(T) * i, 8);
      std::memcpy(&b, data + sizeof(T) * (i + kPerWord), 8);
      for (unsigned j = 0; j < 2 * kPerWord; ++j) {
        const T bits = static_cast<T>((j < kPerWord ? a : b) >> (8 * sizeof(T) * (j % kPerWord)));
        const unsigned k = (bits >> shift) & mask;
        if (__builtin_expect(cursor.left[k]-- != 0, 1)) continue;
        if (reach(i + j, k)) return true;
      }
    }
    for (; i < end; ++i) {
      const unsigned k = (load<T>(data, i) >> shift) & mask;
      if (__builtin_expect(cursor.left[k]-- != 0, 1)) continue;
      if (reach(i, k)) return true;
    }
    return false;
  };
#if defined(__AVX2__)
  HotClasses hot;
  if constexpr (sizeof(T) == 2) hot = hot_classes(data, n, shift, mask, kDecoderSamples);
#endif
  // In chunks, so that `passed` finds each chunk's elements in cache.
  for (std::uint64_t begin = 0; begin < n;) {
    const std::uint64_t end = std::min(n, begin + ExponentClassDecoder::kPassChunk);
    std::uint64_t i = begin;
#if defined(__AVX2__)
    if (hot.count > 0) i = locate_in_blocks(data, i, end, hot, shift, mask, c, cursor, emit);
#endif
    const bool done = found == total || count_down(i, end);
    if (passed) passed(done ? n : end, found);
    if (done) break;
    begin = end;
  }
  return found;
}

// The context of a class's count: the bit length of the count of the class coded before it in
// the tensor (0 when that class holds no change, and for the first class).
unsigned count_context(std::uint64_t previous_count) {
  return previous_count == 0 ? 0 : 64 - unsigned(__builtin_clzll(previous_count));
}

}  // namespace

ExponentClassRanker::ExponentClassRanker(const SparseFormat& format, const std::byte* old_data, std::uint64_t n)
    : format_(format), data_(old_data), counts_(kLanes * kMaxClasses, 0) {
#if defined(__AVX2__)
  if (format.bytes == 2) {
    const HotClasses hot = hot_classes(old_data, n, format.mantissa_bits, format.classes() - 1, kRankerSamples);
    hot_.assign(hot.k, hot.k + hot.count);
  }
#else
  (void)n;
#endif
}

void ExponentClassRanker::rank(const index_t* indices, const std::uint32_t* old_bits, std::size_t count,
                               std::vector<std::uint64_t>& ranks) {
  if (count == 0) return;
  const SparseFormat& f = format_;
  std::size_t j = 0;
  const std::size_t before = ranks.size();
  ranks.resize(before + count + 1);  // a slot of slack for rank_in_blocks
  std::uint64_t* out = ranks.data() + before;
#if defined(__AVX2__)
  if (!hot_.empty()) counted_ = rank_in_blocks(f, data_, counted_, hot_, indices, old_bits, count, counts_.data(), j, out);
#endif
  // Class counts of the elements between changes.
  for (; j < count; ++j) {
    count_classes(f, data_, counted_, std::uint64_t(indices[j]), counts_.data());
    const unsigned k = f.exponent_class(old_bits[j]);
    std::uint64_t r = 0;
    for (unsigned lane = 0; lane < kLanes; ++lane) r += counts_[lane * kMaxClasses + k];
    ++counts_[k];
    out[j] = r;
    counted_ = std::uint64_t(indices[j]) + 1;
  }
  ranks.resize(before + count);
  // The next block pass reads one row: fold the other lanes into it.
  if (!hot_.empty())
    for (unsigned lane = 1; lane < kLanes; ++lane)
      for (unsigned k = 0; k < kMaxClasses; ++k) counts_[k] += std::exchange(counts_[lane * kMaxClasses + k], 0);
}

ExponentClassModels::ExponentClassModels() : classes(kMaxClasses), counts(kCountContexts) {}

ExponentClassEncoder::ExponentClassEncoder() = default;

void ExponentClassEncoder::add(const SparseFormat& f, const std::uint64_t* ranks, const std::uint32_t* new_bits,
                               const std::uint32_t* old_bits, std::size_t count, const index_t* indices,
                               const std::uint8_t* history) {
  if (count == 0) return;
  coded_ = true;
  const unsigned classes = f.classes();
  // The changes in class-major order, as the streams code them; within a class in index order.
  std::uint64_t per_class[kMaxClasses] = {}, first[kMaxClasses] = {};  // on the stack: one tensor's call each
  for (std::size_t j = 0; j < count; ++j) ++per_class[f.exponent_class(old_bits[j])];
  for (unsigned k = 1; k < classes; ++k) first[k] = first[k - 1] + per_class[k - 1];
  // Each change's gap after its class's previous change and its key difference go straight to
  // their class-major places, so the coding below reads them in order.
  thread_local std::vector<std::uint64_t> gaps;
  thread_local std::vector<std::int64_t> steps;
  gaps.resize(count);
  steps.resize(count);
  std::uint64_t at[kMaxClasses], next_rank[kMaxClasses] = {};
  std::copy(first, first + classes, at);
  for (std::size_t j = 0; j < count; ++j) {
    const unsigned k = f.exponent_class(old_bits[j]);
    gaps[at[k]] = ranks[j] - next_rank[k];
    steps[at[k]++] = std::int64_t(f.key(new_bits[j])) - std::int64_t(f.key(old_bits[j]));
    next_rank[k] = ranks[j] + 1;
  }
  {
    // Both coders' states in registers for the whole loop; their decisions interleave.
    RangeEncoder::Run ix(indices_), vx(values_);
    std::uint64_t remaining = count, previous = 0;
    for (unsigned k = 0; k < classes && remaining > 0; ++k) {
      ExponentClassModel& m = models_.classes[k];
      ix.bit(m.any[previous > 0], per_class[k] > 0);
      if (per_class[k] > 0) ix.integer(models_.counts[count_context(previous)], per_class[k] - 1);
      previous = per_class[k];
      for (std::uint64_t c = first[k]; c < first[k] + per_class[k]; ++c) {
        ix.integer(m.gap, gaps[c]);
        const std::int64_t d = steps[c];
        if (!history) vx.even(d < 0, 1);
        vx.integer(m.step, std::uint64_t(d < 0 ? -d : d) - 1);
      }
      remaining -= per_class[k];
    }
  }
  // History variant: the signs follow, in index order (as the receiver's pass finds the changes).
  if (history)
    for (std::size_t j = 0; j < count; ++j)
    {
      const unsigned x = ChangeHistory::sign_context(history[indices[j]]);
      const bool lowered = f.key(new_bits[j]) < f.key(old_bits[j]);
      if (x == 0)
        values_.encode_even(lowered, 1);
      else
        values_.encode(models_.classes[f.exponent_class(old_bits[j])].sign[x], lowered);
    }
}

std::vector<std::uint8_t> ExponentClassEncoder::finish_indices() { return coded_ ? indices_.finish() : std::vector<std::uint8_t>{}; }
std::vector<std::uint8_t> ExponentClassEncoder::finish_values() { return coded_ ? values_.finish() : std::vector<std::uint8_t>{}; }

ExponentClassDecoder::ExponentClassDecoder(const std::uint8_t* index_stream, std::size_t index_size,
                                           const std::uint8_t* value_stream, std::size_t value_size,
                                           std::uint64_t changes) {
  if (changes == 0) {
    PULSE_CHECK(index_size == 0 && value_size == 0, "patch streams hold bytes no entry uses (corrupt patch)");
    return;
  }
  indices_.emplace_back(index_stream, index_size, "patch index");
  values_.emplace_back(value_stream, value_size, "patch value");
}

void ExponentClassDecoder::decode(const SparseFormat& f, const std::byte* old_data, std::uint64_t n,
                                  std::uint64_t count, std::uint64_t* indices, std::uint8_t* new_values,
                                  const std::string& context, const Passed& passed, const std::uint8_t* history) {
  if (count == 0) return;
  PULSE_CHECK(!indices_.empty() && count <= n, "patch changes more elements than it declares" + context);
  RangeDecoder& ix = indices_.front();
  RangeDecoder& vx = values_.front();
  const unsigned classes = f.classes();
  ClassChanges c{std::vector<std::uint64_t>(classes, 0), nullptr};
  thread_local std::vector<ClassChange> changes;
  changes.resize(count + classes);
  std::uint64_t coded = 0, previous = 0, at = 0;
  {
    // Both decoders' states in registers for the whole loop; their decisions interleave.
    RangeDecoder::Run ir(ix), vr(vx);
    for (unsigned k = 0; k < classes; ++k) {
      c.first[k] = at;
      if (coded < count) {
        ExponentClassModel& m = models_.classes[k];
        const bool any = ir.bit(m.any[previous > 0]);
        previous = any ? ir.integer(models_.counts[count_context(previous)], count - coded - 1) + 1 : 0;
        coded += previous;
        std::uint64_t next_rank = 0;  // ranks are below n
        for (const std::uint64_t end = at + previous; at < end; ++at) {
          PULSE_CHECK(next_rank < n, "patch index out of range" + context);
          const std::uint64_t gap = ir.integer(m.gap, n - 1 - next_rank);
          next_rank += gap + 1;
          const bool negative = !history && vr.even(1);  // history variant: signs come later
          const std::uint64_t step = vr.integer(m.step, f.mask() - 1) + 1;
          changes[at] = {gap, negative ? -std::int64_t(step) : std::int64_t(step)};
        }
      }
      changes[at++].gap = UINT64_MAX;
    }
  }
  PULSE_CHECK(coded == count, "patch codes fewer changes than its entry declares" + context);
  c.changes = changes.data();
  if (history) {
    c.history = history;
    c.signs = &vx;
    c.models = models_.classes.data();
  }
  std::uint64_t found = 0;
  if (f.bytes == 1) found = locate_changes<std::uint8_t>(f, old_data, n, c, count, indices, new_values, context, passed);
  if (f.bytes == 2 && f.mantissa_bits == 7)  // BF16
    found = locate_changes<std::uint16_t, 7, 0xFF>(f, old_data, n, c, count, indices, new_values, context, passed);
  else if (f.bytes == 2)
    found = locate_changes<std::uint16_t>(f, old_data, n, c, count, indices, new_values, context, passed);
  if (f.bytes == 4) found = locate_changes<std::uint32_t>(f, old_data, n, c, count, indices, new_values, context, passed);
  PULSE_CHECK(found == count, "patch index out of range" + context);
}

void ExponentClassDecoder::check_consumed() const {
  PULSE_CHECK(indices_.empty() || (indices_.front().at_end() && values_.front().at_end()),
              "patch streams hold bytes no entry uses (corrupt patch)");
}

}  // namespace pulse::sync
