#include "coding/range_coder.hpp"

#include <string>

#include "core/error.hpp"

namespace pulse::sync {

namespace {
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

// The coding state in locals for a run of decisions (as the decoder's Cursor): the compiler
// keeps it in registers, written back only where a byte leaves (shift_low).
struct RangeEncoder::Run {
  RangeEncoder& e;
  std::uint64_t low;
  std::uint32_t range;
  explicit Run(RangeEncoder& coder) : e(coder), low(coder.low_), range(coder.range_) {}
  ~Run() {
    e.low_ = low;
    e.range_ = range;
  }
  void normalize() {
    while (range < kRangeTop) {
      range <<= 8;
      e.low_ = low;
      e.shift_low();
      low = e.low_;
    }
  }
  void bit(BitModel& model, int bit) {
    const std::uint32_t bound = (range >> BitModel::kProbBits) * model.p0;
    const std::uint32_t one = 0u - std::uint32_t(bit != 0);
    low += bound & one;
    range = (bound & ~one) | ((range - bound) & one);
    model.adapt(bit);
    normalize();
  }
  void even(std::uint64_t value, int bits) {
    // Up to 8 bits at a time: the range keeps at least 2^16 of precision.
    while (bits > 0) {
      const int take = std::min(bits, 8);
      bits -= take;
      range >>= take;
      low += std::uint64_t(range) * ((value >> bits) & ((1u << take) - 1));
      normalize();
    }
  }
};

void RangeEncoder::encode_even(std::uint64_t value, int bits) { Run(*this).even(value, bits); }

void RangeEncoder::encode_integer(IntegerModel& model, std::uint64_t value) {
  const std::uint64_t x = value + 1;
  const int length = bit_length(x) - 1;  // bits below the leading one
  Run run(*this);
  for (int j = 0; j < length; ++j) run.bit(model.length[std::min(j, IntegerModel::kContexts - 1)], 1);
  run.bit(model.length[std::min(length, IntegerModel::kContexts - 1)], 0);
  if (length == 0) return;
  run.bit(model.top[std::min(length, IntegerModel::kContexts - 1)], int((x >> (length - 1)) & 1));
  run.even(x, length - 1);
}

std::vector<std::uint8_t> RangeEncoder::finish() {
  for (int i = 0; i < 5; ++i) shift_low();
  return std::move(out_);
}

RangeDecoder::RangeDecoder(const std::uint8_t* data, std::size_t size, const char* stream)
    : data_(data), size_(size), stream_(stream) {
  Cursor c = cursor();
  PULSE_CHECK(next_byte(c) == 0, std::string(stream_) + " stream does not start a range code (corrupt patch)");
  for (int i = 0; i < 4; ++i) c.code = (c.code << 8) | next_byte(c);
  keep(c);
}

void RangeDecoder::ends_inside_code() const {
  throw_error(__FILE__, __LINE__, std::string(stream_) + " stream ends inside its code (corrupt patch)");
}

void RangeDecoder::out_of_range() const {
  throw_error(__FILE__, __LINE__, std::string(stream_) + " stream codes a value out of range (corrupt patch)");
}

}  // namespace pulse::sync
