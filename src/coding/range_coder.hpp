#pragma once
// An adaptive binary range coder (carry-propagating, 32-bit range, 15-bit probabilities) and an
// adaptive Elias-gamma coding of integers on top of it: the entropy coder of the patch format's
// exponent-class coding (FORMAT.md). Integer arithmetic only, so every platform codes the same
// bytes. A coder's models start from "even odds" and learn as they code, so a stream needs
// nothing but itself to decode.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace pulse::sync {

// Probability that the next bit is 0, in units of 2^-15. It moves by 1/4 of the error per bit
// at first and by less as it sees more (1/8, 1/16, ..., then 1/128 after 40 bits): small
// patches need models that learn fast, large ones models that settle close to the source's
// odds (15 bits and 1/128: 0.3-0.5% smaller GRPO patches than 12 bits and 1/32, FORMAT.md).
struct BitModel {
  static constexpr int kProbBits = 15;
  static constexpr int kSettled = 40;  // bits after which the step stays 1/128
  std::uint16_t p0 = 1u << (kProbBits - 1);
  // Bits coded, up to kSettled. Not a byte type: a store through one may alias anything, which
  // made the coders write their state back to memory after every decision.
  std::uint16_t seen = 0;

  // The model after coding `bit`.
  void adapt(int bit) {
    const int shift = 2 + seen / 8;
    const std::uint32_t p = p0;
    p0 = static_cast<std::uint16_t>(bit ? p - (p >> shift) : p + (((1u << kProbBits) - p) >> shift));
    seen += seen < kSettled;
  }
};

// Adaptive Elias-gamma of v + 1: the bit length of v + 1 in unary (one model per position),
// the bit below the leading one with a model per length, the rest as even-odds bits.
struct IntegerModel {
  static constexpr int kContexts = 40;  // lengths beyond share the last model
  BitModel length[kContexts];
  BitModel top[kContexts];
};

// The hot calls (one binary decision) are defined below, inline: a patch codes dozens of them
// per change.
class RangeEncoder {
 public:
  void encode(BitModel& model, int bit);
  void encode_even(std::uint64_t value, int bits);  // the low `bits` bits, each at odds 1:1
  void encode_integer(IntegerModel& model, std::uint64_t value);  // value < 2^63
  // Flushes and returns the stream; the coder is spent.
  std::vector<std::uint8_t> finish();

 private:
  struct Run;
  void shift_low();
  std::uint64_t low_ = 0;
  std::uint32_t range_ = 0xFFFFFFFFu;
  std::uint8_t cache_ = 0;
  std::uint64_t pending_ = 1;  // bytes held back for a carry: cache_ and pending_ - 1 times 0xFF
  std::vector<std::uint8_t> out_;
};

// Reads a stream of RangeEncoder; throws pulse::Error (naming `stream`) when it runs past the
// end or a value exceeds its bound.
class RangeDecoder {
 public:
  RangeDecoder(const std::uint8_t* data, std::size_t size, const char* stream);
  int decode(BitModel& model);
  std::uint64_t decode_even(int bits);
  std::uint64_t decode_integer(IntegerModel& model, std::uint64_t max);  // throws above max
  // True when every byte of the stream was read (a stream with bytes beyond its code is corrupt).
  bool at_end() const { return pos_ == size_; }

 private:
  // The state a decision changes, copied into locals for a run of decisions: the compiler then
  // keeps it in registers instead of storing it after each model update.
  struct Cursor {
    std::uint32_t range, code;
    std::size_t pos;
  };
  Cursor cursor() const { return {range_, code_, pos_}; }
  void keep(const Cursor& c) { range_ = c.range, code_ = c.code, pos_ = c.pos; }
  int decide(Cursor& c, BitModel& model) const;
  std::uint64_t even(Cursor& c, int bits) const;
  std::uint8_t next_byte(Cursor& c) const {
    if (c.pos == size_) ends_inside_code();
    return data_[c.pos++];
  }
  [[noreturn]] void ends_inside_code() const;
  [[noreturn]] void out_of_range() const;
  const std::uint8_t* data_;
  std::size_t size_, pos_ = 0;
  const char* stream_;
  std::uint32_t range_ = 0xFFFFFFFFu, code_ = 0;
};

// Both coders select with arithmetic instead of branches: the bits of a good model are the ones
// a branch predictor cannot guess.
constexpr std::uint32_t kRangeTop = 1u << 24;  // renormalise below this range

inline void RangeEncoder::encode(BitModel& model, int bit) {
  const std::uint32_t bound = (range_ >> BitModel::kProbBits) * model.p0;
  const std::uint32_t one = 0u - std::uint32_t(bit != 0);  // all ones for bit 1
  low_ += bound & one;
  range_ = (bound & ~one) | ((range_ - bound) & one);
  model.adapt(bit);
  while (range_ < kRangeTop) {
    range_ <<= 8;
    shift_low();
  }
}

inline int RangeDecoder::decide(Cursor& c, BitModel& model) const {
  const std::uint32_t bound = (c.range >> BitModel::kProbBits) * model.p0;
  const int bit = c.code >= bound;
  const std::uint32_t one = 0u - std::uint32_t(bit);
  c.code -= bound & one;
  c.range = (bound & ~one) | ((c.range - bound) & one);
  model.adapt(bit);
  while (c.range < kRangeTop) {
    c.range <<= 8;
    c.code = (c.code << 8) | next_byte(c);
  }
  return bit;
}

inline int RangeDecoder::decode(BitModel& model) {
  Cursor c = cursor();
  const int bit = decide(c, model);
  keep(c);
  return bit;
}

// Inline, as decide: decode_integer keeps its cursor in registers, and a one-bit call (a sign)
// compiles to one comparison.
[[gnu::always_inline]] inline std::uint64_t RangeDecoder::even(Cursor& c, int bits) const {
  std::uint64_t value = 0;
  while (bits > 0) {
    const int take = std::min(bits, 8);
    bits -= take;
    c.range >>= take;
    // code < range << take always holds, so the quotient fits in take bits; a corrupt stream
    // gives some value, which later checks bound. One bit (a sign) needs no division.
    const std::uint32_t digit = take == 1 ? std::uint32_t(c.code >= c.range)
                                          : std::min<std::uint32_t>(c.code / c.range, (1u << take) - 1);
    c.code -= digit * c.range;
    value = (value << take) | digit;
    while (c.range < kRangeTop) {
      c.range <<= 8;
      c.code = (c.code << 8) | next_byte(c);
    }
  }
  return value;
}

inline std::uint64_t RangeDecoder::decode_even(int bits) {
  Cursor c = cursor();
  const std::uint64_t value = even(c, bits);
  keep(c);
  return value;
}

// Inline too: the decoder of a patch's changes then keeps the cursor in registers from one
// integer to the next.
inline std::uint64_t RangeDecoder::decode_integer(IntegerModel& model, std::uint64_t max) {
  const int max_length = (64 - __builtin_clzll(max + 1)) - 1;  // max < 2^63, so max + 1 does not wrap
  Cursor c = cursor();
  int length = 0;
  while (decide(c, model.length[std::min(length, IntegerModel::kContexts - 1)])) {
    if (++length > max_length) out_of_range();
  }
  std::uint64_t x = 1;
  if (length > 0) {
    x = 2 | std::uint64_t(decide(c, model.top[std::min(length, IntegerModel::kContexts - 1)]));
    x = (x << (length - 1)) | even(c, length - 1);
  }
  keep(c);
  if (x - 1 > max) out_of_range();
  return x - 1;
}

}  // namespace pulse::sync
