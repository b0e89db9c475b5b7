#include "sync/range_coder.hpp"

#include <string>

#include "core/error.hpp"

namespace pulse::sync {

namespace {
constexpr int kProbBits = 12;
constexpr std::uint8_t kSettled = 24;

// The model after coding `bit`.
void adapt(BitModel& model, int bit) {
  const int shift = 2 + model.seen / 8;
  const std::uint32_t p0 = model.p0;
  model.p0 = static_cast<std::uint16_t>(bit ? p0 - (p0 >> shift) : p0 + (((1u << kProbBits) - p0) >> shift));
  model.seen += model.seen < kSettled;
}
constexpr std::uint32_t kTop = 1u << 24;  // renormalise below this range

int bit_length(std::uint64_t x) { return 64 - __builtin_clzll(x); }
}  // namespace

void RangeEncoder::shift_low() {
  // A byte can leave only once no carry can reach it: low below 0xFF000000 (no carry to come)
  // or a carry already in bit 32.
  if (std::uint32_t(low_) < 0xFF000000u || (low_ >> 32) != 0) {
    const auto carry = static_cast<std::uint8_t>(low_ >> 32);
    std::uint8_t byte = cache_;
    do {
      out_.push_back(static_cast<std::uint8_t>(byte + carry));
      byte = 0xFF;
    } while (--pending_ != 0);
    cache_ = static_cast<std::uint8_t>(low_ >> 24);
  }
  ++pending_;
  low_ = (low_ & 0x00FFFFFFu) << 8;
}

// Both coders select with arithmetic instead of branches: the bits of a good model are the ones
// a branch predictor cannot guess.
void RangeEncoder::encode(BitModel& model, int bit) {
  const std::uint32_t bound = (range_ >> kProbBits) * model.p0;
  const std::uint32_t one = 0u - std::uint32_t(bit != 0);  // all ones for bit 1
  low_ += bound & one;
  range_ = (bound & ~one) | ((range_ - bound) & one);
  adapt(model, bit);
  while (range_ < kTop) {
    range_ <<= 8;
    shift_low();
  }
}

void RangeEncoder::encode_even(std::uint64_t value, int bits) {
  // Up to 8 bits at a time: the range keeps at least 2^16 of precision.
  while (bits > 0) {
    const int take = std::min(bits, 8);
    bits -= take;
    range_ >>= take;
    low_ += std::uint64_t(range_) * ((value >> bits) & ((1u << take) - 1));
    while (range_ < kTop) {
      range_ <<= 8;
      shift_low();
    }
  }
}

void RangeEncoder::encode_integer(IntegerModel& model, std::uint64_t value) {
  const std::uint64_t x = value + 1;
  const int length = bit_length(x) - 1;  // bits below the leading one
  for (int j = 0; j < length; ++j) encode(model.length[std::min(j, IntegerModel::kContexts - 1)], 1);
  encode(model.length[std::min(length, IntegerModel::kContexts - 1)], 0);
  if (length == 0) return;
  encode(model.top[std::min(length, IntegerModel::kContexts - 1)], int((x >> (length - 1)) & 1));
  encode_even(x, length - 1);
}

std::vector<std::uint8_t> RangeEncoder::finish() {
  for (int i = 0; i < 5; ++i) shift_low();
  return std::move(out_);
}

RangeDecoder::RangeDecoder(const std::uint8_t* data, std::size_t size, const char* stream)
    : data_(data), size_(size), stream_(stream) {
  PULSE_CHECK(next_byte() == 0, std::string(stream_) + " stream does not start a range code (corrupt patch)");
  for (int i = 0; i < 4; ++i) code_ = (code_ << 8) | next_byte();
}

std::uint8_t RangeDecoder::next_byte() {
  PULSE_CHECK(pos_ < size_, std::string(stream_) + " stream ends inside its code (corrupt patch)");
  return data_[pos_++];
}

int RangeDecoder::decode(BitModel& model) {
  const std::uint32_t bound = (range_ >> kProbBits) * model.p0;
  const int bit = code_ >= bound;
  const std::uint32_t one = 0u - std::uint32_t(bit);
  code_ -= bound & one;
  range_ = (bound & ~one) | ((range_ - bound) & one);
  adapt(model, bit);
  while (range_ < kTop) {
    range_ <<= 8;
    code_ = (code_ << 8) | next_byte();
  }
  return bit;
}

std::uint64_t RangeDecoder::decode_even(int bits) {
  std::uint64_t value = 0;
  while (bits > 0) {
    const int take = std::min(bits, 8);
    bits -= take;
    range_ >>= take;
    // code < range << take always holds, so the quotient fits in take bits; a corrupt stream
    // gives some value, which later checks bound.
    const std::uint32_t digit = std::min<std::uint32_t>(code_ / range_, (1u << take) - 1);
    code_ -= digit * range_;
    value = (value << take) | digit;
    while (range_ < kTop) {
      range_ <<= 8;
      code_ = (code_ << 8) | next_byte();
    }
  }
  return value;
}

std::uint64_t RangeDecoder::decode_integer(IntegerModel& model, std::uint64_t max) {
  const int max_length = bit_length(max + 1) - 1;  // max < 2^63, so max + 1 does not wrap
  int length = 0;
  while (decode(model.length[std::min(length, IntegerModel::kContexts - 1)])) {
    PULSE_CHECK(++length <= max_length, std::string(stream_) + " stream codes a value out of range (corrupt patch)");
  }
  if (length == 0) return 0;
  std::uint64_t x = 2 | std::uint64_t(decode(model.top[std::min(length, IntegerModel::kContexts - 1)]));
  x = (x << (length - 1)) | decode_even(length - 1);
  PULSE_CHECK(x - 1 <= max, std::string(stream_) + " stream codes a value out of range (corrupt patch)");
  return x - 1;
}

}  // namespace pulse::sync
