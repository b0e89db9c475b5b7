#include "sync/part_coding.hpp"

#include <cstring>
#include <type_traits>

#include "core/error.hpp"
#include "sync/exponent_class_coding.hpp"
#include "sync/patch.hpp"
#include "coding/varint.hpp"

namespace pulse::sync {

namespace {

// Changes are scattered over tensors far larger than the caches; prefetching this many ahead
// keeps enough memory accesses in flight.
constexpr std::size_t kPrefetchAhead = 16;

}  // namespace

PartEncoder::PartEncoder(ValueCoding values, IndexCoding indices) : values_(values), indices_(indices) {
  if (is_exponent_class(values)) class_encoder_ = std::make_unique<ExponentClassEncoder>();
}

PartEncoder::~PartEncoder() = default;

void PartEncoder::add(const SparseFormat& format, const Changes& changes, unsigned index_width,
                      const std::uint8_t* history) {
  const std::vector<index_t>& indices = changes.indices;
  const std::vector<std::uint32_t>&values = changes.values, &old_values = changes.old_values;
  if (class_encoder_) {
    class_encoder_->add(format, changes.ranks.data(), values.data(), old_values.data(), indices.size(), indices.data(),
                        history);
    return;
  }
  encode_gaps(indices_, int(index_width), indices.data(), indices.size(), 0, index_stream_);
  if (values_ == ValueCoding::raw) {
    for (unsigned plane = 0; plane < format.bytes; ++plane)  // byte planes compress better
      for (std::uint32_t v : values) value_stream_.push_back(static_cast<std::uint8_t>(v >> (8 * plane)));
  } else {
    const std::size_t first = value_stream_.size();
    value_stream_.resize(first + format.max_varint_bytes() * values.size() + kVarintSlack);
    std::uint8_t* at = value_stream_.data() + first;
    for (std::size_t k = 0; k < values.size(); ++k)
      put_varint(at, zigzag(std::int64_t(format.key(values[k])) - std::int64_t(format.key(old_values[k]))));
    value_stream_.resize(std::size_t(at - value_stream_.data()));
  }
}

bool PartEncoder::takes_batches() const {
  return values_ == ValueCoding::keydiff && indices_ == IndexCoding::gap_varint;
}

KeydiffBatch PartEncoder::open_batch(const SparseFormat& format, std::size_t count, std::uint64_t end) {
  const std::size_t index_first = index_stream_.size(), value_first = value_stream_.size();
  index_stream_.resize(index_first + varint_bytes(end) * count + kVarintSlack);
  value_stream_.resize(value_first + format.max_varint_bytes() * count + kVarintSlack);
  return {index_stream_.data() + index_first, value_stream_.data() + value_first, next_index_};
}

void PartEncoder::close_batch(KeydiffBatch batch) {
  index_stream_.resize(std::size_t(batch.index_at - index_stream_.data()));
  value_stream_.resize(std::size_t(batch.value_at - value_stream_.data()));
  next_index_ = batch.next;
}

void PartEncoder::finish(std::vector<std::uint8_t>& index_stream, std::vector<std::uint8_t>& value_stream) {
  if (class_encoder_) {
    index_stream = class_encoder_->finish_indices();
    value_stream = class_encoder_->finish_values();
    return;
  }
  index_stream = std::move(index_stream_);
  value_stream = std::move(value_stream_);
}

PartDecoder::PartDecoder(ValueCoding values, IndexCoding indices, const std::vector<std::uint8_t>& index_stream,
                         const std::vector<std::uint8_t>& value_stream, std::uint64_t changes)
    : values_(values), indices_(indices), index_stream_(&index_stream), value_stream_(&value_stream) {
  if (is_exponent_class(values))
    class_decoder_ = std::make_unique<ExponentClassDecoder>(index_stream.data(), index_stream.size(),
                                                            value_stream.data(), value_stream.size(), changes);
}

PartDecoder::~PartDecoder() = default;
PartDecoder::PartDecoder(PartDecoder&&) noexcept = default;

void PartDecoder::decode(const SparseFormat& format, const std::byte* old_data, std::uint64_t n, std::uint64_t count,
                         unsigned index_width, const std::uint8_t* history, std::uint64_t* indices,
                         std::uint8_t* new_values, const std::string& context) {
  if (count == 0) return;
  if (class_decoder_) {
    class_decoder_->decode(format, old_data, n, count, indices, new_values, context, nullptr, history);
    return;
  }
  decode_indices(0, n, count, index_width, indices, context);
  if (values_ == ValueCoding::raw) {
    const std::uint8_t* value_raw = value_stream_->data();
    PULSE_CHECK(value_stream_->size() - value_pos_ >= count * format.bytes, "patch value stream is short" + context);
    for (unsigned plane = 0; plane < format.bytes; ++plane)
      for (std::uint64_t c = 0; c < count; ++c) new_values[c * format.bytes + plane] = value_raw[value_pos_++];
    return;
  }
  decode_values(format, old_data, count, indices, new_values, context);
}

bool PartDecoder::keydiff() const { return values_ == ValueCoding::keydiff; }

void PartDecoder::decode_indices(std::uint64_t begin, std::uint64_t n, std::uint64_t count, unsigned index_width,
                                 std::uint64_t* indices, const std::string& context) {
  decode_gaps(indices_, int(index_width), index_stream_->data(), index_stream_->size(), index_pos_, count, begin,
              begin + n, indices, "patch", context);
}

void PartDecoder::decode_values(const SparseFormat& format, const std::byte* old_data, std::uint64_t count,
                                const std::uint64_t* indices, std::uint8_t* new_values, const std::string& context) {
  if (format.bytes == 1) decode_keydiff<1>(format, old_data, count, indices, new_values, context);
  if (format.bytes == 2) decode_keydiff<2>(format, old_data, count, indices, new_values, context);
  if (format.bytes == 4) decode_keydiff<4>(format, old_data, count, indices, new_values, context);
}

// Width W known: the loads and stores of a value are moves, not calls.
template <unsigned W>
void PartDecoder::decode_keydiff(const SparseFormat& format, const std::byte* old_data, std::uint64_t count,
                                 const std::uint64_t* indices, std::uint8_t* new_values, const std::string& context) {
  using T = std::conditional_t<W == 1, std::uint8_t, std::conditional_t<W == 2, std::uint16_t, std::uint32_t>>;
  const std::uint8_t* value_raw = value_stream_->data();
  const std::int64_t limit = std::int64_t(format.mask());
  for (std::uint64_t c = 0; c < count; ++c) {
    // The old values are scattered: ask for them a few changes ahead.
    if (c + kPrefetchAhead < count) __builtin_prefetch(old_data + W * indices[c + kPrefetchAhead]);
    const std::int64_t d = unzigzag(get_varint(value_raw, value_stream_->size(), value_pos_));
    // Bound d first: a 64-bit difference would overflow the sum.
    PULSE_CHECK(d >= -limit && d <= limit, "patch value out of range" + context);
    T old;
    std::memcpy(&old, old_data + W * indices[c], W);
    const std::int64_t key = std::int64_t(format.key(old)) + d;
    PULSE_CHECK(key >= 0 && key <= limit, "patch value out of range" + context);
    const auto bits = static_cast<T>(format.from_key(std::uint64_t(key)));
    std::memcpy(new_values + c * W, &bits, W);
  }
}

void PartDecoder::check_consumed() const {
  if (class_decoder_) return class_decoder_->check_consumed();
  PULSE_CHECK(index_pos_ == index_stream_->size() && value_pos_ == value_stream_->size(),
              "patch streams hold bytes no entry uses (corrupt patch)");
}

}  // namespace pulse::sync
