#include "coding/range_coder.hpp"

#include <string>

#include "core/error.hpp"

namespace pulse::sync {

std::uint64_t RangeEncoder::shift_low(std::uint64_t low) {
  // A byte can leave only once no carry can reach it: low below 0xFF000000 (no carry to come)
  // or a carry already in bit 32.
  if (std::uint32_t(low) < 0xFF000000u || (low >> 32) != 0) {
    const auto carry = static_cast<std::uint8_t>(low >> 32);
    std::uint8_t byte = cache_;
    do {
      out_.push_back(static_cast<std::uint8_t>(byte + carry));
      byte = 0xFF;
    } while (--pending_ != 0);
    cache_ = static_cast<std::uint8_t>(low >> 24);
  }
  ++pending_;
  return (low & 0x00FFFFFFu) << 8;
}

std::vector<std::uint8_t> RangeEncoder::finish() {
  for (int i = 0; i < 5; ++i) low_ = shift_low(low_);
  return std::move(out_);
}

RangeDecoder::RangeDecoder(const std::uint8_t* data, std::size_t size, const char* stream)
    : data_(data), size_(size), stream_(stream) {
  if (size_ == 0) ends_inside_code();
  PULSE_CHECK(data_[0] == 0, std::string(stream_) + " stream does not start a range code (corrupt patch)");
  if (size_ < 5) ends_inside_code();
  for (pos_ = 1; pos_ < 5; ++pos_) code_ = (code_ << 8) | data_[pos_];
}

void RangeDecoder::ends_inside_code() const {
  throw_error(__FILE__, __LINE__, std::string(stream_) + " stream ends inside its code (corrupt patch)");
}

void RangeDecoder::out_of_range() const {
  throw_error(__FILE__, __LINE__, std::string(stream_) + " stream codes a value out of range (corrupt patch)");
}

}  // namespace pulse::sync
