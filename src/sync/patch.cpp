#include "sync/patch.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <utility>

#include "core/error.hpp"
#include "kernels/bf16.hpp"
#include "kernels/sparsity.hpp"
#include "io/safetensors.hpp"
#include "sync/change_history.hpp"
#include "sync/exponent_class_coding.hpp"
#include "sync/sparse_format.hpp"
#include "sync/varint.hpp"

namespace pulse::sync {

namespace {

constexpr char kMagic[8] = {'P', 'U', 'L', 'S', 'E', 'P', 'C', 'H'};
constexpr std::uint16_t kFormatVersion = 2;
constexpr std::size_t kFixedHeaderBytes = patch_fixed_header_bytes;
constexpr std::size_t kChecksumBytes = patch_checksum_bytes;
constexpr std::size_t kSignatureBytes = patch_signature_bytes;

// ---- little-endian writing and bounded reading ----

struct Writer {
  std::vector<std::uint8_t> out;
  template <class T>
  void put(T v) {
    static_assert(std::is_integral_v<T>);
    for (std::size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<std::uint8_t>(std::uint64_t(v) >> (8 * i)));
  }
  void put_bytes(const void* data, std::size_t n) {
    const auto* p = static_cast<const std::uint8_t*>(data);
    out.insert(out.end(), p, p + n);
  }
};

struct Reader {
  const std::uint8_t* data;
  std::size_t size;
  std::size_t pos = 0;
  const char* what;
  void need(std::size_t n) const {
    PULSE_CHECK(n <= size - pos, std::string("patch is truncated inside the ") + what);
  }
  template <class T>
  T get() {
    need(sizeof(T));
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) v |= std::uint64_t(data[pos + i]) << (8 * i);
    pos += sizeof(T);
    return static_cast<T>(v);
  }
  void get_bytes(void* dst, std::size_t n) {
    need(n);
    std::memcpy(dst, data + pos, n);
    pos += n;
  }
};

std::uint64_t numel_of(const std::vector<std::int64_t>& shape) {
  std::uint64_t n = 1;
  for (std::int64_t d : shape) {
    PULSE_CHECK(d >= 0, "negative dimension in a tensor shape");
    PULSE_CHECK(d == 0 || n <= UINT64_MAX / std::uint64_t(d), "tensor shape overflows");
    n *= std::uint64_t(d);
  }
  return n;
}

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

// Bytes a tensor of this dtype and shape holds; throws for an unknown dtype or a sub-byte
// tensor that does not fill whole bytes.
std::uint64_t layout_bytes(const std::string& name, const std::string& dtype, const std::vector<std::int64_t>& shape) {
  std::size_t bytes = 0;
  PULSE_CHECK(io::tensor_bytes(io::parse_dtype(dtype), numel_of(shape), bytes),
              "tensor '" + name + "' of " + dtype + shape_string(shape) + " does not fill whole bytes");
  return bytes;
}

// A sparse-coded tensor's changes: sorted indices, the new and old bits of each, and for the
// expclass coding their ranks (ExponentClassRanker).
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

// One pass over a sparse-coded tensor in cache-sized chunks: finds the changes and feeds the
// chunk, still in cache, to the digests and (with `rank`) the ranker, so base and target are
// read from memory once. 16-bit tensors go through the compaction kernel.
void scan_changes(const SparseFormat& format, const std::byte* old_data, const std::byte* new_data, std::size_t n,
                  Digest* old_digest, Digest& new_digest, bool rank, Changes& changes) {
  using ConstView = Kokkos::View<const bf16_bits*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;
  constexpr std::size_t chunk = std::size_t(1) << 16;
  thread_local std::vector<index_t> chunk_indices(chunk);
  thread_local std::vector<bf16_bits> chunk_values(chunk), old_copy, new_copy;
  std::optional<DigestStream> old_stream;
  if (old_digest) old_stream.emplace();
  DigestStream new_stream;
  changes.clear();
  std::vector<index_t>& indices = changes.indices;
  std::vector<std::uint32_t>&values = changes.values, &old_values = changes.old_values;
  std::optional<ExponentClassRanker> ranker;
  if (rank) ranker.emplace(format, old_data, n);
  const unsigned w = format.bytes;
  const Kokkos::DefaultHostExecutionSpace space;
  for (std::size_t begin = 0; begin < n; begin += chunk) {
    const std::size_t chunk_first = indices.size();
    const std::size_t len = std::min(chunk, n - begin);
    const std::byte* o = old_data + w * begin;
    const std::byte* t = new_data + w * begin;
    if (w == 2) {
      // safetensors does not promise 2-byte alignment; copy the rare unaligned tensor's chunks.
      auto aligned = [len](const std::byte* p, std::vector<bf16_bits>& copy) -> const bf16_bits* {
        if (reinterpret_cast<std::uintptr_t>(p) % alignof(bf16_bits) == 0) return reinterpret_cast<const bf16_bits*>(p);
        copy.resize(len);
        std::memcpy(copy.data(), p, 2 * len);
        return copy.data();
      };
      const index_t count = compact_changed(
          space, ConstView(aligned(o, old_copy), len), ConstView(aligned(t, new_copy), len),
          Kokkos::View<index_t*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(chunk_indices.data(), len),
          Kokkos::View<bf16_bits*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(chunk_values.data(), len));
      space.fence();
      for (index_t k = 0; k < count; ++k) {
        indices.push_back(index_t(begin) + chunk_indices[k]);
        values.push_back(chunk_values[k]);
        old_values.push_back(std::uint32_t(load_value(o, chunk_indices[k], 2)));  // while the chunk is in cache
      }
    } else if (std::memcmp(o, t, w * len) != 0) {
      for (std::size_t i = 0; i < len; ++i)
        if (std::memcmp(o + w * i, t + w * i, w) != 0) {
          indices.push_back(index_t(begin + i));
          values.push_back(std::uint32_t(load_value(t, i, w)));
          old_values.push_back(std::uint32_t(load_value(o, i, w)));
        }
    }
    if (ranker)
      ranker->rank(indices.data() + chunk_first, old_values.data() + chunk_first, indices.size() - chunk_first, changes.ranks);
    if (old_stream) old_stream->update(o, w * len);
    new_stream.update(t, w * len);
  }
  if (old_stream) *old_digest = old_stream->finish();
  new_digest = new_stream.finish();
}

void put_string(std::vector<std::uint8_t>& out, const std::string& s) {
  put_varint(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

// The per-dtype totals of a target layout and its entries (in the same order).
std::vector<DtypeSummary> summarize(const std::vector<TensorLayout>& layout, const std::vector<std::uint64_t>& bytes,
                                    const std::vector<PatchEntry>& entries) {
  std::map<std::string, DtypeSummary> by_dtype;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    DtypeSummary& s = by_dtype[layout[i].dtype];
    s.dtype = layout[i].dtype;
    s.tensors += 1;
    s.elements += numel_of(layout[i].shape);
    if (entries[i].kind == EntryKind::sparse) s.changed += entries[i].count;
    if (entries[i].kind == EntryKind::whole) s.whole_bytes += bytes[i];
  }
  std::vector<DtypeSummary> out;
  for (auto& [dtype, s] : by_dtype) out.push_back(std::move(s));
  return out;
}

}  // namespace

bool operator==(const DtypeSummary& a, const DtypeSummary& b) {
  return a.dtype == b.dtype && a.tensors == b.tensors && a.elements == b.elements && a.changed == b.changed &&
         a.whole_bytes == b.whole_bytes;
}

bool is_sparse_dtype(const std::string& dtype) { return sparse_format(dtype).has_value(); }

const char* value_coding_name(ValueCoding v) {
  return v == ValueCoding::raw                    ? "raw"
         : v == ValueCoding::keydiff              ? "keydiff"
         : v == ValueCoding::exponent_class       ? "expclass"
                                                  : "expclass-history";
}
ValueCoding parse_value_coding(const std::string& name) {
  if (name == "raw") return ValueCoding::raw;
  if (name == "keydiff") return ValueCoding::keydiff;
  if (name == "expclass") return ValueCoding::exponent_class;
  if (name == "expclass-history") return ValueCoding::exponent_class_history;
  throw_error(__FILE__, __LINE__, "unknown value coding '" + name + "' (raw, keydiff, expclass, expclass-history)");
}
const char* index_coding_name(IndexCoding i) {
  return i == IndexCoding::gap_fixed                ? "gap-fixed"
         : i == IndexCoding::gap_varint             ? "gap-varint"
         : i == IndexCoding::exponent_class         ? "expclass"
                                                    : "expclass-history";
}
IndexCoding parse_index_coding(const std::string& name) {
  if (name == "gap-fixed") return IndexCoding::gap_fixed;
  if (name == "gap-varint") return IndexCoding::gap_varint;
  if (name == "expclass") return IndexCoding::exponent_class;
  if (name == "expclass-history") return IndexCoding::exponent_class_history;
  throw_error(__FILE__, __LINE__,
              "unknown index coding '" + name + "' (gap-fixed, gap-varint, expclass, expclass-history)");
}

EncodeOptions exponent_class_options() {
  EncodeOptions options;
  options.values = ValueCoding::exponent_class;
  options.indices = IndexCoding::exponent_class;
  options.compressor = Compressor::none;  // range-coded streams do not compress further
  return options;
}

EncodeOptions exponent_class_history_options(const ChangeHistory& history) {
  EncodeOptions options = exponent_class_options();
  options.values = ValueCoding::exponent_class_history;
  options.indices = IndexCoding::exponent_class_history;
  options.history = &history;
  return options;
}

StateDigests compute_digests(const std::vector<TensorRef>& state, const Metadata& metadata) {
  StateDigests out;
  std::vector<Digest> digests;
  for (const auto& t : state) {
    digests.push_back(tensor_digest(t));
    out.tensors[t.name] = digests.back();
  }
  out.state = state_digest(state, digests, metadata);
  return out;
}

namespace {

// The caller's digest of a tensor it holds; throws when the caller's record lacks it.
const Digest& known_digest(const StateDigests& known, const std::string& name) {
  const auto it = known.tensors.find(name);
  PULSE_CHECK(it != known.tensors.end(), "the digests given for the base do not cover tensor '" + name + "'");
  return it->second;
}

std::map<std::string, const TensorRef*> by_name(const std::vector<TensorRef>& state, const char* which) {
  std::map<std::string, const TensorRef*> out;
  for (const auto& t : state)
    PULSE_CHECK(out.emplace(t.name, &t).second, "duplicate tensor '" + t.name + "' in " + which);
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// encode

namespace {

void check_codings(const EncodeOptions& options) {
  const bool indices_expclass =
      options.indices == IndexCoding::exponent_class || options.indices == IndexCoding::exponent_class_history;
  PULSE_CHECK(!(is_exponent_class(options.values) || indices_expclass) ||
                  std::uint8_t(options.values) == std::uint8_t(options.indices),
              "the expclass codings code indices and values together: choose the same one for both");
  PULSE_CHECK((options.values == ValueCoding::exponent_class_history) == (options.history != nullptr),
              "the expclass-history coding needs the sender's change history, and only it takes one");
}

void check_sizes(const std::vector<TensorRef>& state) {
  for (const TensorRef& t : state)
    PULSE_CHECK(t.bytes == layout_bytes(t.name, t.dtype, t.shape),
                "tensor '" + t.name + "' holds " + std::to_string(t.bytes) + " bytes, not what its dtype and shape need");
}

// Codes the changes of the sparse entries into the index and value streams, as the options say.
class SparseCoder {
 public:
  explicit SparseCoder(const EncodeOptions& options) : options_(options) {}

  // Whether add() needs the changes' ranks.
  bool ranks() const { return is_exponent_class(options_.values); }

  // One tensor's changes.
  void add(const std::string& name, const SparseFormat& format, const Changes& changes, PatchEntry& e) {
    const std::vector<index_t>& indices = changes.indices;
    const std::vector<std::uint32_t>&values = changes.values, &old_values = changes.old_values;
    e.kind = EntryKind::sparse;
    e.count = indices.size();
    if (is_exponent_class(options_.values)) {
      const std::uint8_t* history = options_.history ? options_.history->of(name) : nullptr;
      PULSE_CHECK(!options_.history || history, "the change history does not track tensor '" + name + "'");
      class_encoder_.add(format, changes.ranks.data(), values.data(), old_values.data(), indices.size(),
                         indices.data(), history);
      return;
    }
    if (options_.indices == IndexCoding::gap_fixed)
      e.index_width = static_cast<std::uint8_t>(fixed_gap_width(indices.data(), indices.size(), 0));
    encode_gaps(options_.indices, e.index_width, indices.data(), indices.size(), 0, index_stream);
    if (options_.values == ValueCoding::raw) {
      for (unsigned plane = 0; plane < format.bytes; ++plane)  // byte planes compress better
        for (std::uint32_t v : values) value_stream.push_back(static_cast<std::uint8_t>(v >> (8 * plane)));
    } else {
      for (std::size_t k = 0; k < values.size(); ++k)
        put_varint(value_stream, zigzag(std::int64_t(format.key(values[k])) - std::int64_t(format.key(old_values[k]))));
    }
  }

  // Completes the streams once every tensor was added.
  void finish() {
    if (!is_exponent_class(options_.values)) return;
    index_stream = class_encoder_.finish_indices();
    value_stream = class_encoder_.finish_values();
  }

  std::vector<std::uint8_t> index_stream, value_stream;

 private:
  const EncodeOptions& options_;
  ExponentClassEncoder class_encoder_;
};

// Everything a patch states, before it is written.
struct PatchContent {
  std::vector<std::string> removed;
  std::vector<TensorLayout> added;
  const Metadata* target_metadata = nullptr;  // when the metadata changes
  std::vector<TensorLayout> target_layout;    // in name order, one per entry
  std::vector<std::uint64_t> target_bytes;
  std::vector<PatchEntry> entries;
  Digest base_layout{}, base_state{}, target_state{};
  std::vector<std::uint8_t> index_stream, value_stream, whole_stream;
};

// The entry table (FORMAT.md): layout change, metadata, per-dtype summary, entries.
std::vector<std::uint8_t> entry_table(const EncodeOptions& options, const PatchContent& c) {
  const bool changes_layout = !c.removed.empty() || !c.added.empty();
  const bool changes_metadata = c.target_metadata != nullptr;
  std::vector<std::uint8_t> table;
  if (options.history) table.insert(table.end(), options.history->digest().begin(), options.history->digest().end());
  if (changes_layout) {
    put_varint(table, c.removed.size());
    for (const auto& name : c.removed) put_string(table, name);
    put_varint(table, c.added.size());
    for (const auto& t : c.added) {
      put_string(table, t.name);
      put_string(table, t.dtype);
      put_varint(table, t.shape.size());
      for (std::int64_t d : t.shape) put_varint(table, std::uint64_t(d));
    }
  }
  if (changes_metadata) {
    put_varint(table, c.target_metadata->size());
    for (const auto& [key, value] : *c.target_metadata) {
      put_string(table, key);
      put_string(table, value);
    }
  }
  const auto summary = summarize(c.target_layout, c.target_bytes, c.entries);
  put_varint(table, summary.size());
  for (const auto& s : summary) {
    put_string(table, s.dtype);
    for (std::uint64_t v : {s.tensors, s.elements, s.changed, s.whole_bytes}) put_varint(table, v);
  }
  put_varint(table, c.entries.size());
  for (const auto& e : c.entries) {
    table.push_back(static_cast<std::uint8_t>(e.kind));
    if (e.kind != EntryKind::sparse) continue;
    put_varint(table, e.count);
    if (options.indices == IndexCoding::gap_fixed) table.push_back(e.index_width);
  }
  return table;
}

// What both encoders do last: the target's state digest from its tensors' digests (reported
// through target_digests when given), the coder's streams, and the base's layout digest.
void finish_content(PatchContent& c, SparseCoder& coder, const std::vector<TensorRef>& base,
                    const std::vector<TensorRef>& target, const std::map<std::string, Digest>& target_digest_of,
                    const Metadata& target_metadata, StateDigests* target_digests) {
  std::vector<Digest> in_target_order;
  for (const auto& t : target) in_target_order.push_back(target_digest_of.at(t.name));
  c.target_state = state_digest(target, in_target_order, target_metadata);
  if (target_digests) {
    target_digests->tensors = target_digest_of;
    target_digests->state = c.target_state;
  }
  coder.finish();
  c.index_stream = std::move(coder.index_stream);
  c.value_stream = std::move(coder.value_stream);
  c.base_layout = layout_digest(base);
}

// The patch's bytes (FORMAT.md): header, entry table, compressed streams, checksum, signature.
std::vector<std::uint8_t> write_patch(const EncodeOptions& options, const PatchContent& c) {
  const bool changes_layout = !c.removed.empty() || !c.added.empty();
  const bool changes_metadata = c.target_metadata != nullptr;
  const std::vector<std::uint8_t> table = entry_table(options, c);
  const auto coded_index = compress(options.compressor, options.level, c.index_stream);
  const auto coded_value = compress(options.compressor, options.level, c.value_stream);
  const auto coded_whole = compress(options.compressor, options.level, c.whole_stream);

  Writer w;
  w.put_bytes(kMagic, 8);
  w.put<std::uint16_t>(kFormatVersion);
  w.put<std::uint16_t>((options.signing_key ? 1 : 0) | (changes_layout ? 2 : 0) | (changes_metadata ? 4 : 0));
  w.put<std::uint8_t>(static_cast<std::uint8_t>(options.values));
  w.put<std::uint8_t>(static_cast<std::uint8_t>(options.indices));
  w.put<std::uint8_t>(static_cast<std::uint8_t>(options.compressor));
  w.put<std::uint8_t>(0);
  w.put<std::uint64_t>(options.base_version);
  w.put<std::uint64_t>(options.target_version);
  w.put_bytes(c.base_layout.data(), 16);
  w.put_bytes(c.base_state.data(), 16);
  w.put_bytes(c.target_state.data(), 16);
  for (const auto* s : {&c.index_stream, &c.value_stream, &c.whole_stream}) {
    const auto& coded = s == &c.index_stream ? coded_index : s == &c.value_stream ? coded_value : coded_whole;
    w.put<std::uint64_t>(coded.size());
    w.put<std::uint64_t>(s->size());
  }
  w.put<std::uint64_t>(table.size());
  w.put_bytes(table.data(), table.size());
  w.put_bytes(coded_index.data(), coded_index.size());
  w.put_bytes(coded_value.data(), coded_value.size());
  w.put_bytes(coded_whole.data(), coded_whole.size());
  const Digest checksum = digest_bytes(w.out.data(), w.out.size());
  w.put_bytes(checksum.data(), 16);
  if (options.signing_key) {
    const Signature sig = sign(*options.signing_key, w.out.data(), w.out.size());
    w.put_bytes(sig.data(), sig.size());
  }
  return std::move(w.out);
}

// The digest of a tensor's bytes with sorted changes written, fed in order as a pass reaches
// them: each cache-sized piece that holds a change is copied and the change written to the
// copy, so the tensor itself stays as it is (file_apply writes another file). In place instead
// (swap_in), the changes are written into the tensor itself and hashed there, no copy made.
class DigestWithChanges {
 public:
  // swap_in needs `writable`: data, writable.
  DigestWithChanges(const std::byte* data, unsigned width, std::byte* writable = nullptr)
      : data_(data), writable_(writable), width_(width) {}

  // Hashes the elements up to `end`, whose changes are among the first `found`: at indices[k],
  // the low `width` bytes at values + value_stride * k (little-endian hosts).
  template <class Index>
  void pass(std::uint64_t end, const Index* indices, const void* values, unsigned value_stride, std::uint64_t found) {
    constexpr std::uint64_t piece = std::uint64_t(1) << 16;
    thread_local std::vector<std::byte> copy;
    const auto* v = static_cast<const std::byte*>(values);
    while (done_ < end) {
      const std::uint64_t piece_end = std::min(end, done_ + piece);
      const std::byte* bytes = data_ + width_ * done_;
      if (next_ < found && std::uint64_t(indices[next_]) < piece_end) {
        copy.assign(bytes, data_ + width_ * piece_end);
        for (; next_ < found && std::uint64_t(indices[next_]) < piece_end; ++next_)
          std::memcpy(copy.data() + width_ * (std::uint64_t(indices[next_]) - done_), v + value_stride * next_, width_);
        bytes = copy.data();
      }
      stream_.update(bytes, width_ * (piece_end - done_));
      done_ = piece_end;
    }
  }

  // As pass, with the changes (values: `width` bytes each) written into the tensor: each is
  // swapped with the element's old value, so values[0, swapped()) then hold the old values.
  void swap_in(std::uint64_t end, const std::uint64_t* indices, std::uint8_t* values, std::uint64_t found) {
    if (end <= done_) return;
    if (width_ == 2) swap_changes<2>(end, indices, values, found);
    else if (width_ == 4) swap_changes<4>(end, indices, values, found);
    else swap_changes<1>(end, indices, values, found);
    stream_.update(data_ + width_ * done_, width_ * (end - done_));
    done_ = end;
  }
  std::uint64_t swapped() const { return next_; }

  Digest finish() const { return stream_.finish(); }

 private:
  template <unsigned kWidth>
  void swap_changes(std::uint64_t end, const std::uint64_t* indices, std::uint8_t* values, std::uint64_t found) {
    for (; next_ < found && indices[next_] < end; ++next_) {
      std::byte* element = writable_ + kWidth * indices[next_];
      std::uint8_t* value = values + kWidth * next_;
      std::uint8_t old[kWidth];
      std::memcpy(old, element, kWidth);
      std::memcpy(element, value, kWidth);
      std::memcpy(value, old, kWidth);
    }
  }

  const std::byte* data_;
  std::byte* writable_;
  unsigned width_;
  DigestStream stream_;
  std::uint64_t done_ = 0, next_ = 0;  // elements hashed, changes written
};

// A tensor's bytes: in memory, or read by the state's loader.
const std::byte* bytes_of(const std::vector<TensorRef>& state, const TensorRef& t, const TensorLoader& loader) {
  if (t.data || t.bytes == 0) return t.data;
  PULSE_CHECK(loader, "internal: tensor '" + t.name + "' is not in memory and its state has no loader");
  return loader(std::size_t(&t - state.data()));
}

// Digest of a tensor's bytes with the changes written; with `rank`, the chunks in cache also
// rank the changes.
Digest digest_with_changes(const TensorRef& t, const SparseFormat& format, bool rank, Changes& changes) {
  constexpr std::size_t chunk = std::size_t(1) << 16;
  const std::vector<index_t>& indices = changes.indices;
  const std::size_t n = t.bytes / format.bytes;
  std::optional<ExponentClassRanker> ranker;
  if (rank) ranker.emplace(format, t.data, n);
  changes.ranks.clear();
  DigestWithChanges digest(t.data, format.bytes);
  std::size_t k = 0;
  for (std::size_t begin = 0; begin < n; begin += chunk) {
    const std::size_t end = std::min(n, begin + chunk), chunk_first = k;
    while (k < indices.size() && std::size_t(indices[k]) < end) ++k;
    if (ranker) ranker->rank(indices.data() + chunk_first, changes.old_values.data() + chunk_first, k - chunk_first, changes.ranks);
    digest.pass(end, indices.data(), changes.values.data(), sizeof(std::uint32_t), k);
  }
  return digest.finish();
}

}  // namespace

std::vector<std::uint8_t> encode_patch(const std::vector<TensorRef>& base, const std::vector<TensorRef>& target,
                                       const EncodeOptions& options, const StateDigests* base_digests,
                                       StateDigests* target_digests, const Metadata& base_metadata,
                                       const Metadata& target_metadata, const TensorLoader& base_loader,
                                       const TensorLoader& target_loader) {
  check_codings(options);
  const auto base_by_name = by_name(base, "base"), target_by_name = by_name(target, "target");
  check_sizes(base);
  check_sizes(target);
  // The layout change: base tensors the target lacks or re-declares, target tensors the base
  // lacks or declares otherwise.
  PatchContent c;
  for (const auto& [name, b] : base_by_name) {
    const auto it = target_by_name.find(name);
    if (it == target_by_name.end() || it->second->dtype != b->dtype || it->second->shape != b->shape) c.removed.push_back(name);
  }
  for (const auto& [name, t] : target_by_name) {
    const auto it = base_by_name.find(name);
    if (it == base_by_name.end() || it->second->dtype != t->dtype || it->second->shape != t->shape)
      c.added.push_back({t->name, t->dtype, t->shape});
  }

  PULSE_CHECK(!options.history || (c.removed.empty() && c.added.empty()),
              "the expclass-history coding follows a fixed layout: this target adds or removes tensors");
  std::map<std::string, Digest> base_digest_of, target_digest_of;
  thread_local Changes tensor_changes;  // kept: a large tensor's lists would be allocated and faulted in again
  SparseCoder coder(options);
  for (const auto& [name, tp] : target_by_name) {
    const TensorRef& t = *tp;
    const auto it = base_by_name.find(name);
    const TensorRef* b = it != base_by_name.end() && it->second->dtype == t.dtype && it->second->shape == t.shape
                             ? it->second : nullptr;
    PatchEntry e;
    Digest base_digest{}, target_digest{};
    if (b && base_digests) base_digest = known_digest(*base_digests, name);
    const auto format = sparse_format(t.dtype);
    const std::byte* base_data = b ? bytes_of(base, *b, base_loader) : nullptr;
    const std::byte* target_data = bytes_of(target, t, target_loader);
    if (b && format) {
      scan_changes(*format, base_data, target_data, numel_of(t.shape), base_digests ? nullptr : &base_digest,
                   target_digest, coder.ranks(), tensor_changes);
      coder.add(name, *format, tensor_changes, e);
    } else {
      if (b && !base_digests) base_digest = digest_bytes(base_data, b->bytes);
      target_digest = digest_bytes(target_data, t.bytes);
      if (!b || std::memcmp(base_data, target_data, t.bytes) != 0) {
        e.kind = EntryKind::whole;
        const auto* p = reinterpret_cast<const std::uint8_t*>(target_data);
        c.whole_stream.insert(c.whole_stream.end(), p, p + t.bytes);
      }
    }
    if (b) base_digest_of[name] = base_digest;
    target_digest_of[name] = target_digest;
    c.target_layout.push_back({t.name, t.dtype, t.shape});
    c.target_bytes.push_back(t.bytes);
    c.entries.push_back(e);
  }

  if (base_digests) {
    c.base_state = base_digests->state;
  } else {
    std::vector<Digest> in_base_order;
    for (const auto& t : base)
      in_base_order.push_back(base_digest_of.count(t.name) ? base_digest_of[t.name]
                                                           : digest_bytes(bytes_of(base, t, base_loader), t.bytes));
    c.base_state = state_digest(base, in_base_order, base_metadata);
  }
  finish_content(c, coder, base, target, target_digest_of, target_metadata, target_digests);
  if (base_metadata != target_metadata) c.target_metadata = &target_metadata;
  return write_patch(options, c);
}

std::vector<std::uint8_t> encode_changes(const std::vector<TensorRef>& base, const std::vector<TensorChanges>& changes,
                                         const EncodeOptions& options, const StateDigests& base_digests,
                                         StateDigests* target_digests, const Metadata& metadata) {
  check_codings(options);
  const auto base_by_name = by_name(base, "base");
  check_sizes(base);
  std::map<std::string, const TensorChanges*> changes_by_name;
  for (const TensorChanges& ch : changes) {
    const auto it = base_by_name.find(ch.name);
    PULSE_CHECK(it != base_by_name.end(), "changes name tensor '" + ch.name + "', which the base does not hold");
    PULSE_CHECK(is_sparse_dtype(it->second->dtype) || ch.indices.empty(),
                "changes name tensor '" + ch.name + "' of " + it->second->dtype + ", which is not coded sparsely");
    PULSE_CHECK(ch.indices.size() == ch.new_bits.size(), "changes of tensor '" + ch.name + "' have " +
                                                             std::to_string(ch.indices.size()) + " indices and " +
                                                             std::to_string(ch.new_bits.size()) + " values");
    PULSE_CHECK(changes_by_name.emplace(ch.name, &ch).second, "changes name tensor '" + ch.name + "' twice");
  }

  PatchContent c;
  std::map<std::string, Digest> target_digest_of;
  thread_local Changes tensor_changes;  // kept, as in encode_patch
  SparseCoder coder(options);
  for (const auto& [name, b] : base_by_name) {
    PatchEntry e;
    Digest target_digest = known_digest(base_digests, name);
    if (const auto format = sparse_format(b->dtype)) {
      // The listed changes that change something, checked as the receiver would check them.
      tensor_changes.clear();
      const auto it = changes_by_name.find(name);
      const std::uint64_t n = b->bytes / format->bytes;
      if (it != changes_by_name.end()) {
        const TensorChanges& ch = *it->second;
        for (std::size_t k = 0; k < ch.indices.size(); ++k) {
          PULSE_CHECK(ch.indices[k] >= 0 && std::uint64_t(ch.indices[k]) < n && (k == 0 || ch.indices[k] > ch.indices[k - 1]),
                      "changes of tensor '" + name + "' are not sorted distinct indices below " + std::to_string(n));
          PULSE_CHECK(ch.new_bits[k] <= format->mask(), "changes of tensor '" + name + "' hold a value wider than " + b->dtype);
          const auto old_bits = std::uint32_t(load_value(b->data, std::uint64_t(ch.indices[k]), format->bytes));
          if (old_bits == ch.new_bits[k]) continue;
          tensor_changes.indices.push_back(ch.indices[k]);
          tensor_changes.values.push_back(ch.new_bits[k]);
          tensor_changes.old_values.push_back(old_bits);
        }
      }
      if (!tensor_changes.indices.empty()) target_digest = digest_with_changes(*b, *format, coder.ranks(), tensor_changes);
      coder.add(name, *format, tensor_changes, e);
    }
    target_digest_of[name] = target_digest;
    c.target_layout.push_back({b->name, b->dtype, b->shape});
    c.target_bytes.push_back(b->bytes);
    c.entries.push_back(e);
  }

  c.base_state = base_digests.state;
  finish_content(c, coder, base, base, target_digest_of, metadata, target_digests);  // the layout stays
  return write_patch(options, c);
}

std::uint64_t sparse_patch_bytes(const EncodeOptions& options, const std::vector<TensorLayout>& layout,
                                 const std::vector<std::uint64_t>& changed, const std::vector<std::uint8_t>& index_stream,
                                 const std::vector<std::uint8_t>& value_stream) {
  PULSE_CHECK(options.indices != IndexCoding::gap_fixed && !options.signing_key && changed.size() == layout.size(),
              "internal: sparse_patch_bytes takes unsigned, variable-width patches, one count per tensor");
  PatchContent c;
  c.target_layout = layout;
  c.target_bytes.assign(layout.size(), 0);  // only tensors carried whole use them
  for (const std::uint64_t count : changed) c.entries.push_back({EntryKind::sparse, 0, count});
  return kFixedHeaderBytes + entry_table(options, c).size() +
         compress(options.compressor, options.level, index_stream).size() +
         compress(options.compressor, options.level, value_stream).size() + kChecksumBytes;
}

// ---------------------------------------------------------------------------------------
// parse

namespace {

// Bounded reading of the entry table's varints and strings.
struct TableReader {
  Reader r;
  std::uint64_t varint() { return get_varint(r.data, r.size, r.pos); }
  // A count of items that each take at least one byte: bounded by the bytes left.
  std::uint64_t count(std::uint64_t limit, const char* what) {
    const std::uint64_t n = varint();
    PULSE_CHECK(n <= limit && n <= r.size - r.pos, std::string("patch declares too many ") + what);
    return n;
  }
  std::string string() {
    const std::uint64_t n = varint();
    r.need(n);
    std::string s(reinterpret_cast<const char*>(r.data + r.pos), n);
    r.pos += n;
    return s;
  }
};

constexpr std::uint64_t kMaxRank = 64;
constexpr std::uint64_t kMaxDtypes = 64;

}  // namespace

ParsedPatch parse_patch(const std::uint8_t* bytes, std::size_t size, const PatchLimits& limits,
                        const PublicKey* public_key) {
  PULSE_CHECK(size <= limits.max_patch_bytes, "patch is larger than the limit of " +
                                                  std::to_string(limits.max_patch_bytes) + " bytes");
  PULSE_CHECK(size >= 12 && std::memcmp(bytes, kMagic, 8) == 0, "not a PULSESync patch (bad magic)");
  Reader r{bytes, size, 8, "header"};
  ParsedPatch p;
  PatchHeader& h = p.header;
  h.format_version = r.get<std::uint16_t>();
  PULSE_CHECK(h.format_version != 1, "patch format version 1 is no longer read (this pulse reads version 2); "
                                     "encode the patch again from its base and target");
  PULSE_CHECK(h.format_version == kFormatVersion,
              "patch format version " + std::to_string(h.format_version) + " is not supported (expected 2)");
  PULSE_CHECK(size >= kFixedHeaderBytes + kChecksumBytes, "patch is truncated (" + std::to_string(size) + " bytes)");
  const auto flags = r.get<std::uint16_t>();
  PULSE_CHECK((flags & ~7u) == 0, "patch has unknown flags");
  h.is_signed = flags & 1;
  h.changes_layout = flags & 2;
  h.changes_metadata = flags & 4;
  const auto values = r.get<std::uint8_t>(), indices = r.get<std::uint8_t>(), compressor = r.get<std::uint8_t>();
  PULSE_CHECK(values != 2 && indices != 2, "patch uses the expclass coding of an earlier pulse (coding id 2), which is "
                                           "no longer decoded; encode the patch again from its base and target");
  constexpr auto expclass = std::uint8_t(ValueCoding::exponent_class);
  constexpr auto expclass_history = std::uint8_t(ValueCoding::exponent_class_history);
  static_assert(std::uint8_t(IndexCoding::exponent_class) == expclass &&
                    std::uint8_t(IndexCoding::exponent_class_history) == expclass_history,
                "one id for both halves of each expclass coding");
  PULSE_CHECK(values <= expclass_history && indices <= expclass_history && compressor <= 2 && r.get<std::uint8_t>() == 0,
              "patch names an unknown coding or compressor");
  PULSE_CHECK((values >= expclass || indices >= expclass) ? values == indices : true,
              "patch uses an expclass coding for only one of indices and values");
  h.values = static_cast<ValueCoding>(values);
  h.indices = static_cast<IndexCoding>(indices);
  h.compressor = static_cast<Compressor>(compressor);
  h.base_version = r.get<std::uint64_t>();
  h.target_version = r.get<std::uint64_t>();
  r.get_bytes(h.base_layout.data(), 16);
  r.get_bytes(h.base_state.data(), 16);
  r.get_bytes(h.target_state.data(), 16);
  for (StreamSize* s : {&h.index_stream, &h.value_stream, &h.whole_stream}) {
    s->coded = r.get<std::uint64_t>();
    s->raw = r.get<std::uint64_t>();
    PULSE_CHECK(s->coded <= limits.max_stream_bytes && s->raw <= limits.max_stream_bytes,
                "patch declares a stream beyond the size limit");
  }
  const auto table_bytes = r.get<std::uint64_t>();
  PULSE_CHECK(table_bytes <= limits.max_entry_table_bytes, "patch declares an entry table beyond the size limit");

  // The file must be exactly what the header declares.
  const std::uint64_t trailer = kChecksumBytes + (h.is_signed ? kSignatureBytes : 0);
  const std::uint64_t expected =
      kFixedHeaderBytes + table_bytes + h.index_stream.coded + h.value_stream.coded + h.whole_stream.coded + trailer;
  PULSE_CHECK(expected == size, "patch is " + std::to_string(size) + " bytes, its header declares " +
                                    std::to_string(expected) + " (truncated or corrupt)");
  const std::size_t signed_part = size - (h.is_signed ? kSignatureBytes : 0);
  const std::size_t checked_part = signed_part - kChecksumBytes;
  Digest stored;
  std::memcpy(stored.data(), bytes + checked_part, 16);
  PULSE_CHECK(digest_bytes(bytes, checked_part) == stored, "patch checksum mismatch (corrupt patch)");
  if (public_key) {
    PULSE_CHECK(h.is_signed, "patch is not signed but a public key was given");
    Signature sig;
    std::memcpy(sig.data(), bytes + signed_part, sig.size());
    PULSE_CHECK(verify_signature(*public_key, sig, bytes, signed_part), "patch signature does not verify with the given key");
  }

  TableReader t{Reader{bytes, kFixedHeaderBytes + table_bytes, kFixedHeaderBytes, "entry table"}};
  if (h.values == ValueCoding::exponent_class_history) {
    t.r.get_bytes(h.history.data(), 16);
    PULSE_CHECK(!h.changes_layout, "patch changes the layout, which its expclass-history coding cannot follow");
  }
  if (h.changes_layout) {
    const auto removed = t.count(limits.max_tensors, "removed tensors");
    for (std::uint64_t i = 0; i < removed; ++i) p.removed.push_back(t.string());
    const auto added = t.count(limits.max_tensors, "added tensors");
    for (std::uint64_t i = 0; i < added; ++i) {
      TensorLayout a{t.string(), t.string(), {}};
      const auto rank = t.count(kMaxRank, "dimensions");
      for (std::uint64_t d = 0; d < rank; ++d) {
        const std::uint64_t dim = t.varint();
        PULSE_CHECK(dim <= std::uint64_t(INT64_MAX), "patch adds tensor '" + a.name + "' with a dimension out of range");
        a.shape.push_back(std::int64_t(dim));
      }
      p.added.push_back(std::move(a));
    }
    PULSE_CHECK(removed + added > 0, "patch declares a layout change that changes nothing");
  }
  if (h.changes_metadata) {
    const auto n = t.count(limits.max_tensors, "metadata entries");
    for (std::uint64_t i = 0; i < n; ++i) {
      std::string key = t.string();
      PULSE_CHECK(p.metadata.emplace(std::move(key), t.string()).second, "patch names a metadata key twice");
    }
  }
  const auto dtypes = t.count(kMaxDtypes, "dtypes");
  std::uint64_t summary_changed = 0;
  for (std::uint64_t i = 0; i < dtypes; ++i) {
    DtypeSummary s{t.string()};
    for (std::uint64_t* v : {&s.tensors, &s.elements, &s.changed, &s.whole_bytes}) *v = t.varint();
    PULSE_CHECK(p.summary.empty() || p.summary.back().dtype < s.dtype, "patch dtype summary is not in order of dtype");
    PULSE_CHECK(s.changed <= limits.max_stream_bytes, "patch declares more changes than its streams can hold");
    summary_changed += s.changed;
    p.summary.push_back(std::move(s));
  }
  const auto num_entries = t.count(limits.max_tensors, "tensors");
  std::uint64_t fixed_index_bytes = 0;
  for (std::uint64_t i = 0; i < num_entries; ++i) {
    PatchEntry e;
    const auto kind = t.r.get<std::uint8_t>();
    PULSE_CHECK(kind <= 2, "patch entry " + std::to_string(i) + " has an unknown kind");
    e.kind = static_cast<EntryKind>(kind);
    if (e.kind == EntryKind::sparse) {
      e.count = t.varint();
      // Every change takes at least one byte of the index stream.
      PULSE_CHECK(e.count <= limits.max_stream_bytes, "patch entry " + std::to_string(i) + " declares too many changes");
      if (h.indices == IndexCoding::gap_fixed) {
        e.index_width = t.r.get<std::uint8_t>();
        PULSE_CHECK(e.index_width == 1 || e.index_width == 2 || e.index_width == 4 || e.index_width == 8,
                    "patch entry " + std::to_string(i) + " has an invalid index width");
        fixed_index_bytes += e.count * e.index_width;
      }
      h.total_changed += e.count;
      PULSE_CHECK(h.total_changed <= limits.max_stream_bytes, "patch declares more changes than its streams can hold");
    }
    p.entries.push_back(e);
  }
  PULSE_CHECK(t.r.pos == t.r.size, "patch entry table has trailing bytes");
  PULSE_CHECK(summary_changed == h.total_changed, "patch entries do not add up to its dtype summary");
  // Raw stream sizes follow from the entries (exactly once the receiver's layout gives the
  // element widths); anything else is corrupt (or a decompression bomb).
  const std::uint64_t changed = h.total_changed;
  if (is_exponent_class(h.values)) {
    // A range code: at most 14 bits per binary decision (the least probability is 3 * 2^-15), a
    // change takes fewer than 140 decisions (gap and value: 64-bit Elias-gamma each, sign) and a
    // tensor fewer than 256 + 130 besides (a flag per class, a count per changed class).
    const std::uint64_t bound = 16 + 256 * changed + 704 * num_entries;
    PULSE_CHECK((changed == 0) == (h.index_stream.raw == 0) && h.index_stream.raw <= bound &&
                    (changed == 0) == (h.value_stream.raw == 0) && h.value_stream.raw <= bound,
                "patch index or value stream size disagrees with its entries");
  } else {
    if (h.indices == IndexCoding::gap_fixed)
      PULSE_CHECK(h.index_stream.raw == fixed_index_bytes, "patch index stream size disagrees with its entries");
    else
      PULSE_CHECK(h.index_stream.raw >= changed && h.index_stream.raw <= 10 * changed,
                  "patch index stream size disagrees with its entries");
    PULSE_CHECK(h.value_stream.raw >= changed && h.value_stream.raw <= 5 * changed,
                "patch value stream size disagrees with its entries");
  }

  p.index_stream = bytes + kFixedHeaderBytes + table_bytes;
  p.value_stream = p.index_stream + h.index_stream.coded;
  p.whole_stream = p.value_stream + h.value_stream.coded;
  p.patch_bytes = size;
  p.table_bytes = table_bytes;
  return p;
}

// ---------------------------------------------------------------------------------------
// apply

namespace {

// Changes are scattered over tensors far larger than the caches; prefetching this many ahead
// keeps enough memory accesses in flight.
constexpr std::size_t kPrefetchAhead = 16;

// Writes a sparse entry's values at its indices.
void write_changes(std::byte* data, const DecodedEntry& w) {
  const std::size_t count = w.indices.size();
  for (std::size_t k = 0; k < count; ++k) {
    if (k + kPrefetchAhead < count) __builtin_prefetch(data + w.width * w.indices[k + kPrefetchAhead], 1);
    std::memcpy(data + w.width * w.indices[k], w.values.data() + w.width * k, w.width);
  }
}

}  // namespace

PatchDecoder::PatchDecoder(const ParsedPatch& patch, const std::vector<TensorRef>& base, bool hash_targets,
                           const ChangeHistory* history)
    : patch_(patch), base_(base), hash_targets_(hash_targets) {
  const PatchHeader& h = patch.header;
  if (h.values == ValueCoding::exponent_class_history) {
    PULSE_CHECK(history, "patch is coded against the change history of a receiver that follows every version "
                         "(expclass-history), which this receiver does not keep");
    PULSE_CHECK(history->digest() == h.history, "receiver's change history is not the one patch " +
                                                    std::to_string(h.base_version) + " -> " +
                                                    std::to_string(h.target_version) +
                                                    " was coded against (it followed other versions)");
    history_ = history;
  }
  // 1. The receiver holds the base's layout.
  std::map<std::string, Target> targets;
  base_layout_.reserve(base.size());
  for (std::size_t i = 0; i < base.size(); ++i) {
    const TensorRef& t = base[i];
    base_layout_.push_back({t.name, t.dtype, t.shape});
    PULSE_CHECK(targets.emplace(t.name, Target{&base_layout_.back(), false, i, t.bytes}).second,
                "receiver holds tensor '" + t.name + "' twice");
  }
  PULSE_CHECK(layout_digest(base) == h.base_layout,
              "receiver's tensors (names, dtypes, shapes) are not the layout of the patch's base version " +
                  std::to_string(h.base_version));

  // 2. The target layout: the base's tensors less the removed ones, plus the added ones.
  for (const auto& name : patch.removed)
    PULSE_CHECK(targets.erase(name) == 1, "patch removes tensor '" + name + "', which the receiver does not hold");
  for (std::size_t i = 0; i < patch.added.size(); ++i) {
    const TensorLayout& a = patch.added[i];
    PULSE_CHECK(targets.emplace(a.name, Target{&a, true, i, layout_bytes(a.name, a.dtype, a.shape)}).second,
                "patch adds tensor '" + a.name + "' twice or over a tensor it keeps");
  }
  PULSE_CHECK(targets.size() == patch.entries.size(), "patch has " + std::to_string(patch.entries.size()) +
                                                          " entries for a target of " + std::to_string(targets.size()) + " tensors");

  // 3. Every entry against its tensor before anything is decompressed: the raw stream sizes
  // follow from the entries and the layout, so they are bounded by the receiver's tensors.
  std::vector<TensorLayout> target_layout;
  std::vector<std::uint64_t> target_bytes;
  std::uint64_t sparse_changes = 0, value_bytes = 0, value_bytes_max = 0, whole_bytes = 0;
  std::size_t i = 0;
  for (auto& [name, target] : targets) {
    const PatchEntry& e = patch.entries[i++];
    const TensorLayout& l = *target.layout;
    if (!target.added)
      PULSE_CHECK(target.bytes == layout_bytes(name, l.dtype, l.shape),
                  "receiver's tensor '" + name + "' size does not match its dtype and shape");
    else
      PULSE_CHECK(e.kind == EntryKind::whole, "patch adds tensor '" + name + "' without its bytes");
    if (e.kind == EntryKind::sparse) {
      const auto format = sparse_format(l.dtype);
      PULSE_CHECK(format.has_value(), "patch codes tensor '" + name + "' of " + l.dtype + " sparsely");
      PULSE_CHECK(e.count <= numel_of(l.shape), "patch changes more elements than tensor '" + name + "' has");
      sparse_changes += e.count;
      value_bytes += e.count * format->bytes;
      value_bytes_max += e.count * format->max_varint_bytes();
    }
    if (e.kind == EntryKind::whole) whole_bytes += target.bytes;
    targets_.push_back(target);
    target_layout.push_back(l);
    target_bytes.push_back(target.bytes);
  }
  PULSE_CHECK(summarize(target_layout, target_bytes, patch.entries) == patch.summary,
              "patch dtype summary disagrees with its entries and the receiver's layout");
  if (h.values == ValueCoding::raw)
    PULSE_CHECK(h.value_stream.raw == value_bytes, "patch value stream size disagrees with its entries");
  else if (h.values == ValueCoding::keydiff)
    PULSE_CHECK(h.value_stream.raw <= value_bytes_max, "patch value stream size disagrees with its entries");
  PULSE_CHECK(h.whole_stream.raw == whole_bytes, "patch whole-tensor stream size disagrees with its entries");

  // 4. The streams, decoded entry by entry in next().
  index_raw_ = decompress(h.compressor, patch.index_stream, h.index_stream.coded, h.index_stream.raw);
  value_raw_ = decompress(h.compressor, patch.value_stream, h.value_stream.coded, h.value_stream.raw);
  whole_raw_ = decompress(h.compressor, patch.whole_stream, h.whole_stream.coded, h.whole_stream.raw);
  if (is_exponent_class(h.values))
    class_decoder_ = std::make_unique<ExponentClassDecoder>(index_raw_.data(), index_raw_.size(), value_raw_.data(),
                                                            value_raw_.size(), h.total_changed);
}

PatchDecoder::~PatchDecoder() = default;

DecodedEntry PatchDecoder::next() { return decode_next(nullptr); }

DecodedEntry PatchDecoder::next_in_place(std::vector<MutableTensor>& state) {
  PULSE_CHECK(next_ < targets_.size(), "PatchDecoder::next past the last entry");
  const Target& target = targets_[next_];
  if (target.added) return decode_next(nullptr);
  std::byte* data = state[target.tensor].data;
  PULSE_CHECK(data == base_[target.tensor].data, "PatchDecoder::next_in_place: state is not the decoder's base");
  return decode_next(data);
}

DecodedEntry PatchDecoder::decode_next(std::byte* writable) {
  PULSE_CHECK(next_ < targets_.size(), "PatchDecoder::next past the last entry");
  const PatchHeader& h = patch_.header;
  const PatchEntry& e = patch_.entries[next_];
  const Target& target = targets_[next_++];
  const std::string& name = target.layout->name;
  DecodedEntry w;
  w.kind = e.kind;
  w.added = target.added;
  w.tensor = target.tensor;
  w.bytes = target.bytes;
  if (e.kind == EntryKind::same || (e.kind == EntryKind::sparse && e.count == 0)) return w;
  if (e.kind == EntryKind::whole) {
    w.whole = whole_raw_.data() + whole_pos_;
    whole_pos_ += target.bytes;
    if (hash_targets_) w.digest = digest_bytes(w.whole, target.bytes);
    return w;
  }
  const TensorRef& t = base_[target.tensor];
  const SparseFormat format = *sparse_format(t.dtype);
  w.width = format.bytes;
  w.indices.resize(e.count);
  w.values.resize(e.count * format.bytes);
  DigestWithChanges digest(t.data, format.bytes, writable);
  // Hashes (and in place writes) the tensor up to element `end`, whose changes are the first `found`;
  // a receiver that hashes as it writes elsewhere (hash_targets false) needs neither.
  const bool passing = writable || hash_targets_;
  auto pass = [&](std::uint64_t end, std::uint64_t found) {
    if (writable)
      digest.swap_in(end, w.indices.data(), w.values.data(), found);
    else
      digest.pass(end, w.indices.data(), w.values.data(), format.bytes, found);
  };
  if (class_decoder_) {
    const std::uint8_t* history = history_ ? history_->of(name) : nullptr;
    PULSE_CHECK(!history_ || history, "receiver's change history does not track tensor '" + name + "'");
    // The pass that finds the changes hands each chunk of the tensor, in cache, to the digest.
    try {
      class_decoder_->decode(format, t.data, numel_of(t.shape), e.count, w.indices.data(), w.values.data(),
                             " in tensor '" + name + "'", passing ? ExponentClassDecoder::Passed(pass) : nullptr,
                             history);
    } catch (...) {
      // The values swapped in so far hold the old ones: write them back.
      w.indices.resize(digest.swapped());
      if (writable) write_changes(writable, w);
      throw;
    }
    if (passing) w.digest = digest.finish();
    return w;
  }
  decode_gaps(h.indices, e.index_width, index_raw_.data(), index_raw_.size(), index_pos_, e.count, 0, numel_of(t.shape),
              w.indices.data(), "patch", " in tensor '" + name + "'");
  if (h.values == ValueCoding::raw) {
    for (unsigned plane = 0; plane < format.bytes; ++plane)
      for (std::uint64_t c = 0; c < e.count; ++c) w.values[c * format.bytes + plane] = value_raw_[value_pos_++];
  } else {
    const std::int64_t limit = std::int64_t(format.mask());
    for (std::uint64_t c = 0; c < e.count; ++c) {
      // The old values are scattered: ask for them a few changes ahead.
      if (c + kPrefetchAhead < e.count) __builtin_prefetch(t.data + format.bytes * w.indices[c + kPrefetchAhead]);
      const std::int64_t d = unzigzag(get_varint(value_raw_.data(), value_raw_.size(), value_pos_));
      // Bound d first: a 64-bit difference would overflow the sum.
      PULSE_CHECK(d >= -limit && d <= limit, "patch value out of range in tensor '" + name + "'");
      const std::int64_t key = std::int64_t(format.key(load_value(t.data, w.indices[c], format.bytes))) + d;
      PULSE_CHECK(key >= 0 && key <= limit, "patch value out of range in tensor '" + name + "'");
      const std::uint64_t bits = format.from_key(std::uint64_t(key));
      std::memcpy(w.values.data() + c * format.bytes, &bits, format.bytes);
    }
  }
  if (passing) {
    // In pieces, so that each is hashed while its writes are in cache.
    const std::uint64_t n = numel_of(t.shape);
    for (std::uint64_t end = 0; end < n;) {
      end = std::min(n, end + ExponentClassDecoder::kPassChunk);
      pass(end, e.count);
    }
    w.digest = digest.finish();
  }
  return w;
}

void PatchDecoder::finish() const {
  PULSE_CHECK(next_ == targets_.size(), "PatchDecoder::finish before the last entry");
  if (class_decoder_) {
    class_decoder_->check_consumed();
    PULSE_CHECK(whole_pos_ == whole_raw_.size(), "patch streams hold bytes no entry uses (corrupt patch)");
    return;
  }
  PULSE_CHECK(index_pos_ == index_raw_.size() && value_pos_ == value_raw_.size() && whole_pos_ == whole_raw_.size(),
              "patch streams hold bytes no entry uses (corrupt patch)");
}

void PatchDecoder::check_base(const Digest& base_state) const {
  PULSE_CHECK(base_state == patch_.header.base_state, "receiver's weights are not the patch's base version " +
                                                         std::to_string(patch_.header.base_version) +
                                                         " (state digest mismatch)");
}

void PatchDecoder::check_target(const Digest& target_state) const {
  PULSE_CHECK(target_state == patch_.header.target_state,
              "weights do not match the patch's target state digest after apply");
}

std::uint64_t apply_patch(const ParsedPatch& patch, std::vector<MutableTensor>& state, const PatchLimits& limits,
                          const StateDigests* base_digests, StateDigests* target_digests, const Metadata& metadata,
                          StateChange* change, ChangeHistory* history) {
  (void)limits;  // sizes were bounded by parse_patch; the receiver's own tensors bound the rest
  const PatchHeader& h = patch.header;
  PULSE_CHECK(change || (!h.changes_layout && !h.changes_metadata),
              "patch adds or removes tensors or changes the metadata, which this receiver cannot take");
  PULSE_CHECK(!history || !h.changes_layout, "patch adds or removes tensors, which a change history cannot follow");
  // 1. The receiver holds the base: its layout (checked by the decoder), then its contents.
  std::vector<TensorRef> base_refs;
  for (auto& t : state) base_refs.push_back(t.view());
  PatchDecoder decoder(patch, base_refs, true, history);
  std::vector<Digest> base_tensor_digests;
  if (base_digests) {
    for (const auto& t : state) base_tensor_digests.push_back(known_digest(*base_digests, t.name));
    decoder.check_base(base_digests->state);
  } else {
    for (const auto& t : base_refs) base_tensor_digests.push_back(tensor_digest(t));
    decoder.check_base(state_digest(base_refs, base_tensor_digests, metadata));
  }

  // 2.-5. Decode every entry, writing sparse changes in place as the decoder's pass reaches
  // them (the digest then hashes the tensor where it lies); check every index and value, then the
  // target state digest. Untouched tensors keep their (verified) base digest. On any failure the
  // old values (what the entries written in place then hold) are written back, so a rejected
  // patch leaves the weights exactly as they were.
  std::vector<DecodedEntry> plan;
  std::vector<Digest> after;
  std::vector<TensorRef> target_refs;
  const Metadata& target_metadata = h.changes_metadata ? patch.metadata : metadata;
  // The history's bytes of each receiver tensor it tracks, found before anything is written.
  std::vector<std::uint8_t*> marks(state.size(), nullptr);
  if (history)
    for (std::size_t i = 0; i < state.size(); ++i)
      if (sparse_format(state[i].dtype)) marks[i] = history->marks(state[i].name);
  Digest target_state{};
  try {
    plan.reserve(decoder.size());
    for (std::size_t k = 0; k < decoder.size(); ++k) plan.push_back(decoder.next_in_place(state));
    decoder.finish();
    for (const DecodedEntry& w : plan) {
      if (!w.added) {
        target_refs.push_back(state[w.tensor].view());
        after.push_back(w.touched() ? w.digest : base_tensor_digests[w.tensor]);
      } else {
        const TensorLayout& l = patch.added[w.tensor];
        target_refs.push_back({l.name, l.dtype, l.shape, reinterpret_cast<const std::byte*>(w.whole), w.bytes});
        after.push_back(w.digest);
      }
    }
    target_state = state_digest(target_refs, after, target_metadata);
    PULSE_CHECK(target_state == h.target_state,
                "the patched weights would not match the patch's target state digest; nothing written");
  } catch (...) {
    // Last first: exact even where a receiver's tensors share bytes.
    for (auto w = plan.rbegin(); w != plan.rend(); ++w)
      if (w->kind == EntryKind::sparse) write_changes(state[w->tensor].data, *w);
    throw;
  }

  // 6. Write the tensors carried whole (the sparse changes are in place), and mark each change
  // in the history: the entries written in place now hold the old values.
  if (history) history->age();
  std::uint64_t written = 0;
  for (const DecodedEntry& w : plan) {
    if (w.added || !w.touched()) continue;
    MutableTensor& t = state[w.tensor];
    std::uint8_t* marked = marks[w.tensor];
    if (w.kind == EntryKind::whole) {
      if (marked) {
        const SparseFormat format = *sparse_format(t.dtype);
        ChangeHistory::mark_differences(marked, format, t.data, reinterpret_cast<const std::byte*>(w.whole),
                                        t.bytes / format.bytes);
      }
      if (t.bytes) std::memcpy(t.data, w.whole, t.bytes);
      written += t.bytes;
    } else {
      if (marked) {
        const SparseFormat format = *sparse_format(t.dtype);
        const auto* old_values = reinterpret_cast<const std::byte*>(w.values.data());
        for (std::size_t k = 0; k < w.indices.size(); ++k)
          marked[w.indices[k]] = ChangeHistory::changed(format.key(load_value(old_values, k, w.width)),
                                                        format.key(load_value(t.data, w.indices[k], w.width)));
      }
      written += w.indices.size();
    }
  }
  if (history) history->seal(target_state);
  if (change) {
    change->removed = patch.removed;
    change->added = patch.added;
    change->added_bytes.clear();
    change->added_bytes.resize(patch.added.size());
    for (const DecodedEntry& w : plan)
      if (w.added) {
        const auto* p = reinterpret_cast<const std::byte*>(w.whole);
        change->added_bytes[w.tensor].assign(p, p + w.bytes);
      }
    change->metadata = target_metadata;
  }
  if (target_digests) {
    target_digests->tensors.clear();
    for (std::size_t k = 0; k < target_refs.size(); ++k) target_digests->tensors[target_refs[k].name] = after[k];
    target_digests->state = target_state;
  }
  return written;
}

}  // namespace pulse::sync
