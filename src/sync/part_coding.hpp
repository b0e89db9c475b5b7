#pragma once
// The coding of one part of a format-3 patch (FORMAT.md "Part table"): the sparse changes of its
// segments into the part's own index and value streams, every coder and model starting afresh
// at the part. A segment is a contiguous element range of one tensor; its changes are coded as
// an entry of format 2 over a tensor of the segment's elements (indices from its begin).
// Internal to the patch code (patch_*.cpp).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/index.hpp"
#include "coding/compress.hpp"
#include "coding/index_coding.hpp"
#include "coding/varint.hpp"
#include "sync/sparse_format.hpp"

namespace pulse::sync {

enum class ValueCoding : std::uint8_t;
class ExponentClassEncoder;
class ExponentClassDecoder;

// A segment's changes: sorted indices (from the segment's begin), the new and old bits of each,
// and for the expclass codings their ranks in the segment (ExponentClassRanker).
struct Changes {
  std::vector<index_t> indices;
  std::vector<std::uint32_t> values, old_values;
  std::vector<std::uint64_t> ranks;
  void clear() {
    indices.clear();
    values.clear();
    old_values.clear();
    ranks.clear();
  }
};

// Room in a keydiff part's streams (gap-varint indices) for a known number of changes, which a
// scan fills as it finds them: put is inlined in its loop, and no list of changes is kept.
struct KeydiffBatch {
  std::uint8_t* index_at;
  std::uint8_t* value_at;
  std::uint64_t next;  // the smallest index the next change may take: its gap counts from it
  // A change at `index` (in index order, from the segment's begin), as the keys of its bits.
  void put(std::uint64_t index, std::uint64_t old_key, std::uint64_t new_key) {
    put_varint(index_at, index - next);
    put_varint(value_at, zigzag(std::int64_t(new_key) - std::int64_t(old_key)));
    next = index + 1;
  }
};

class PartEncoder {
 public:
  PartEncoder(ValueCoding values, IndexCoding indices);
  ~PartEncoder();
  // One segment's changes; index_width: the entry's gap width (gap-fixed); history: the
  // change history's bytes of the segment's elements (expclass-history), else null.
  void add(const SparseFormat& format, const Changes& changes, unsigned index_width, const std::uint8_t* history);
  // Keydiff values with gap-varint indices may be coded as found instead (the same bytes as
  // add): start_segment, then per batch of its changes open_batch, put each, close_batch.
  bool takes_batches() const;
  void start_segment() { next_index_ = 0; }
  // Room for `count` changes of indices below `end`.
  KeydiffBatch open_batch(const SparseFormat& format, std::size_t count, std::uint64_t end);
  void close_batch(KeydiffBatch batch);  // by value: the scan's copy stays in registers
  // The raw streams, once every segment was added.
  void finish(std::vector<std::uint8_t>& index_stream, std::vector<std::uint8_t>& value_stream);

 private:
  ValueCoding values_;
  IndexCoding indices_;
  std::vector<std::uint8_t> index_stream_, value_stream_;
  std::uint64_t next_index_ = 0;  // of the segment coded in batches
  std::unique_ptr<ExponentClassEncoder> class_encoder_;
};

class PartDecoder {
 public:
  // The part's raw streams (kept by reference) and its total changes.
  PartDecoder(ValueCoding values, IndexCoding indices, const std::vector<std::uint8_t>& index_stream,
              const std::vector<std::uint8_t>& value_stream, std::uint64_t changes);
  ~PartDecoder();
  PartDecoder(PartDecoder&&) noexcept;
  // Decodes one segment's `count` changes against its old elements (n from old_data): their
  // indices from the segment's begin and new values (format.bytes each). Throws pulse::Error
  // naming `context` on anything out of range.
  void decode(const SparseFormat& format, const std::byte* old_data, std::uint64_t n, std::uint64_t count,
              unsigned index_width, const std::uint8_t* history, std::uint64_t* indices, std::uint8_t* new_values,
              const std::string& context);
  // Keydiff only: a segment decoded in two steps, so that its values can be decoded a run of
  // changes at a time, each run when its old elements are in cache. First its `count` indices
  // (in [begin, begin + n): the segment's begin added), then its runs in order: new values
  // (format.bytes each) of `count` changes at indices, against the old elements at
  // old_data + index.
  bool keydiff() const;
  void decode_indices(std::uint64_t begin, std::uint64_t n, std::uint64_t count, unsigned index_width,
                      std::uint64_t* indices, const std::string& context);
  void decode_values(const SparseFormat& format, const std::byte* old_data, std::uint64_t count,
                     const std::uint64_t* indices, std::uint8_t* new_values, const std::string& context);
  // Throws unless the part's streams were read to their last byte.
  void check_consumed() const;

 private:
  template <unsigned W>
  void decode_keydiff(const SparseFormat& format, const std::byte* old_data, std::uint64_t count,
                      const std::uint64_t* indices, std::uint8_t* new_values, const std::string& context);
  ValueCoding values_;
  IndexCoding indices_;
  const std::vector<std::uint8_t>* index_stream_;
  const std::vector<std::uint8_t>* value_stream_;
  std::size_t index_pos_ = 0, value_pos_ = 0;
  std::unique_ptr<ExponentClassDecoder> class_decoder_;
};

}  // namespace pulse::sync
