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
  class Run;
  void encode(BitModel& model, int bit);
  void encode_even(std::uint64_t value, int bits);  // the low `bits` bits, each at odds 1:1
  void encode_integer(IntegerModel& model, std::uint64_t value);  // value < 2^63
  // Flushes and returns the stream; the coder is spent.
  std::vector<std::uint8_t> finish();

 private:
  // Moves the top byte of `low` out (or holds it back for a carry) and returns the low after it.
  std::uint64_t shift_low(std::uint64_t low);
  std::uint64_t low_ = 0;
  std::uint32_t range_ = 0xFFFFFFFFu;
  std::uint8_t cache_ = 0;
  std::uint64_t pending_ = 1;  // bytes held back for a carry: cache_ and pending_ - 1 times 0xFF
  std::vector<std::uint8_t> out_;
};

// Both coders select with arithmetic instead of branches: the bits of a good model are the ones
// a branch predictor cannot guess.
constexpr std::uint32_t kRangeTop = 1u << 24;  // renormalise below this range

// A run of decisions with the coder's state in locals: the compiler keeps it in registers
// across a loop of many integers (written back when the run ends), and the decisions of two
// coders' runs, which do not depend on each other, overlap. Use one coder through one run at a
// time.
class RangeEncoder::Run {
 public:
  explicit Run(RangeEncoder& coder) : e_(coder), low_(coder.low_), range_(coder.range_) {}
  ~Run() {
    e_.low_ = low_;
    e_.range_ = range_;
  }
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  void bit(BitModel& model, int bit) {
    const std::uint32_t bound = (range_ >> BitModel::kProbBits) * model.p0;
    const std::uint32_t one = 0u - std::uint32_t(bit != 0);  // all ones for bit 1
    low_ += bound & one;
    range_ = (bound & ~one) | ((range_ - bound) & one);
    model.adapt(bit);
    normalize();
  }
  void even(std::uint64_t value, int bits) {
    // Up to 8 bits at a time: the range keeps at least 2^16 of precision.
    while (bits > 0) {
      const int take = std::min(bits, 8);
      bits -= take;
      range_ >>= take;
      low_ += std::uint64_t(range_) * ((value >> bits) & ((1u << take) - 1));
      normalize();
    }
  }
  // Adaptive Elias-gamma of value + 1 (IntegerModel).
  void integer(IntegerModel& model, std::uint64_t value) {
    const std::uint64_t x = value + 1;
    const int length = 63 - __builtin_clzll(x);  // bits below the leading one
    for (int j = 0; j < length; ++j) bit(model.length[std::min(j, IntegerModel::kContexts - 1)], 1);
    bit(model.length[std::min(length, IntegerModel::kContexts - 1)], 0);
    if (length == 0) return;
    bit(model.top[std::min(length, IntegerModel::kContexts - 1)], int((x >> (length - 1)) & 1));
    even(x, length - 1);
  }

 private:
  void normalize() {
    while (range_ < kRangeTop) {
      range_ <<= 8;
      low_ = e_.shift_low(low_);
    }
  }
  RangeEncoder& e_;
  std::uint64_t low_;
  std::uint32_t range_;
};

inline void RangeEncoder::encode(BitModel& model, int bit) { Run(*this).bit(model, bit); }
inline void RangeEncoder::encode_even(std::uint64_t value, int bits) { Run(*this).even(value, bits); }
inline void RangeEncoder::encode_integer(IntegerModel& model, std::uint64_t value) { Run(*this).integer(model, value); }

// Reads a stream of RangeEncoder; throws pulse::Error (naming `stream`) when it runs past the
// end or a value exceeds its bound.
class RangeDecoder {
 public:
  class Run;
  RangeDecoder(const std::uint8_t* data, std::size_t size, const char* stream);
  int decode(BitModel& model);
  std::uint64_t decode_even(int bits);
  std::uint64_t decode_integer(IntegerModel& model, std::uint64_t max);  // throws above max
  // True when every byte of the stream was read (a stream with bytes beyond its code is corrupt).
  bool at_end() const { return pos_ == size_; }

 private:
  [[noreturn]] void ends_inside_code() const;
  [[noreturn]] void out_of_range() const;
  const std::uint8_t* data_;
  std::size_t size_, pos_ = 0;
  const char* stream_;
  std::uint32_t range_ = 0xFFFFFFFFu, code_ = 0;
};

// The decoder's state in locals for a run of decisions, as RangeEncoder::Run: the compiler keeps
// it in registers instead of storing it after each model update, and the decisions of the index
// and value streams overlap.
class RangeDecoder::Run {
 public:
  explicit Run(RangeDecoder& coder)
      : d_(coder), data_(coder.data_), size_(coder.size_), pos_(coder.pos_), range_(coder.range_), code_(coder.code_) {}
  ~Run() {
    d_.pos_ = pos_;
    d_.range_ = range_;
    d_.code_ = code_;
  }
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  int bit(BitModel& model) {
    const std::uint32_t bound = (range_ >> BitModel::kProbBits) * model.p0;
    const int bit = code_ >= bound;
    const std::uint32_t one = 0u - std::uint32_t(bit);
    code_ -= bound & one;
    range_ = (bound & ~one) | ((range_ - bound) & one);
    model.adapt(bit);
    normalize();
    return bit;
  }
  std::uint64_t even(int bits) {
    std::uint64_t value = 0;
    while (bits > 0) {
      const int take = std::min(bits, 8);
      bits -= take;
      range_ >>= take;
      // code < range << take always holds, so the quotient fits in take bits; a corrupt stream
      // gives some value, which later checks bound. One bit (a sign) needs no division.
      const std::uint32_t digit = take == 1 ? std::uint32_t(code_ >= range_)
                                            : std::min<std::uint32_t>(code_ / range_, (1u << take) - 1);
      code_ -= digit * range_;
      value = (value << take) | digit;
      normalize();
    }
    return value;
  }
  // The value of an IntegerModel coding; throws above max (max < 2^63).
  std::uint64_t integer(IntegerModel& model, std::uint64_t max) {
    const int max_length = (64 - __builtin_clzll(max + 1)) - 1;  // max + 1 does not wrap
    int length = 0;
    while (bit(model.length[std::min(length, IntegerModel::kContexts - 1)])) {
      if (++length > max_length) d_.out_of_range();
    }
    std::uint64_t x = 1;
    if (length > 0) {
      x = 2 | std::uint64_t(bit(model.top[std::min(length, IntegerModel::kContexts - 1)]));
      x = (x << (length - 1)) | even(length - 1);
    }
    if (x - 1 > max) d_.out_of_range();
    return x - 1;
  }

 private:
  void normalize() {
    while (range_ < kRangeTop) {
      range_ <<= 8;
      if (pos_ == size_) d_.ends_inside_code();
      code_ = (code_ << 8) | data_[pos_++];
    }
  }
  RangeDecoder& d_;
  const std::uint8_t* data_;
  std::size_t size_, pos_;
  std::uint32_t range_, code_;
};

inline int RangeDecoder::decode(BitModel& model) { return Run(*this).bit(model); }
inline std::uint64_t RangeDecoder::decode_even(int bits) { return Run(*this).even(bits); }
inline std::uint64_t RangeDecoder::decode_integer(IntegerModel& model, std::uint64_t max) {
  return Run(*this).integer(model, max);
}

}  // namespace pulse::sync
