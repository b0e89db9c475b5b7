#include "sync/patch.hpp"

#include <algorithm>
#include <cstring>
#include <map>

#include "core/error.hpp"
#include "kernels/bf16.hpp"
#include "kernels/sparsity.hpp"
#include "sync/varint.hpp"

// The header implementation, compiled for this CPU (AVX2 where -march=native has it), is
// several times faster than the generic build in the shared library.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace pulse::sync {

namespace {

constexpr char kMagic[8] = {'P', 'U', 'L', 'S', 'E', 'P', 'C', 'H'};
constexpr std::uint16_t kFormatVersion = 1;
constexpr std::size_t kFixedHeaderBytes = 8 + 2 + 2 + 4 + 8 + 8 + 16 + 16 + 8 + 4 + 3 * 16 + 8;
constexpr std::size_t kChecksumBytes = 16;
constexpr std::size_t kSignatureBytes = 64;

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

bf16_bits load_bf16(const std::byte* data, std::uint64_t i) {
  bf16_bits b;
  std::memcpy(&b, data + 2 * i, 2);
  return b;
}

// One pass over a BF16 tensor in cache-sized chunks: the compaction kernel finds the changed
// indices (sorted) and new bits, and the chunk, still in cache, feeds the digests, so base and
// target are read from memory once.
void scan_bf16(const std::byte* old_data, const std::byte* new_data, std::size_t n, Digest* old_digest,
               Digest& new_digest, std::vector<index_t>& indices, std::vector<bf16_bits>& values,
               std::vector<bf16_bits>& old_values) {
  using ConstView = Kokkos::View<const bf16_bits*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;
  constexpr std::size_t chunk = std::size_t(1) << 16;
  thread_local std::vector<index_t> chunk_indices(chunk);
  thread_local std::vector<bf16_bits> chunk_values(chunk), old_copy, new_copy;
  XXH3_state_t* old_state = old_digest ? XXH3_createState() : nullptr;
  XXH3_state_t* new_state = XXH3_createState();
  PULSE_CHECK(new_state && (!old_digest || old_state), "out of memory for a digest state");
  if (old_state) XXH3_128bits_reset(old_state);
  XXH3_128bits_reset(new_state);
  indices.clear();
  values.clear();
  old_values.clear();
  const Kokkos::DefaultHostExecutionSpace space;
  for (std::size_t begin = 0; begin < n; begin += chunk) {
    const std::size_t len = std::min(chunk, n - begin);
    const std::byte* o = old_data + 2 * begin;
    const std::byte* w = new_data + 2 * begin;
    // safetensors does not promise 2-byte alignment; copy the rare unaligned tensor's chunks.
    auto aligned = [len](const std::byte* p, std::vector<bf16_bits>& copy) -> const bf16_bits* {
      if (reinterpret_cast<std::uintptr_t>(p) % alignof(bf16_bits) == 0) return reinterpret_cast<const bf16_bits*>(p);
      copy.resize(len);
      std::memcpy(copy.data(), p, 2 * len);
      return copy.data();
    };
    const index_t count = compact_changed(
        space, ConstView(aligned(o, old_copy), len), ConstView(aligned(w, new_copy), len),
        Kokkos::View<index_t*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(chunk_indices.data(), len),
        Kokkos::View<bf16_bits*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(chunk_values.data(), len));
    space.fence();
    for (index_t k = 0; k < count; ++k) {
      indices.push_back(index_t(begin) + chunk_indices[k]);
      old_values.push_back(load_bf16(o, chunk_indices[k]));  // while the chunk is in cache
    }
    values.insert(values.end(), chunk_values.begin(), chunk_values.begin() + count);
    if (old_state) XXH3_128bits_update(old_state, o, 2 * len);
    XXH3_128bits_update(new_state, w, 2 * len);
  }
  auto finish = [](XXH3_state_t* state) {
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(state));
    XXH3_freeState(state);
    Digest d;
    std::memcpy(d.data(), canonical.digest, d.size());
    return d;
  };
  if (old_state) *old_digest = finish(old_state);
  new_digest = finish(new_state);
}

}  // namespace

const char* value_coding_name(ValueCoding v) { return v == ValueCoding::raw ? "raw" : "keydiff"; }
ValueCoding parse_value_coding(const std::string& name) {
  if (name == "raw") return ValueCoding::raw;
  if (name == "keydiff") return ValueCoding::keydiff;
  throw_error(__FILE__, __LINE__, "unknown value coding '" + name + "' (raw, keydiff)");
}
const char* index_coding_name(IndexCoding i) { return i == IndexCoding::gap_fixed ? "gap-fixed" : "gap-varint"; }
IndexCoding parse_index_coding(const std::string& name) {
  if (name == "gap-fixed") return IndexCoding::gap_fixed;
  if (name == "gap-varint") return IndexCoding::gap_varint;
  throw_error(__FILE__, __LINE__, "unknown index coding '" + name + "' (gap-fixed, gap-varint)");
}

StateDigests compute_digests(const std::vector<TensorRef>& state) {
  StateDigests out;
  std::vector<Digest> digests;
  for (const auto& t : state) {
    digests.push_back(tensor_digest(t));
    out.tensors[t.name] = digests.back();
  }
  out.state = state_digest(state, digests);
  return out;
}

namespace {

// The caller's digest of a tensor it holds; throws when the caller's record lacks it.
const Digest& known_digest(const StateDigests& known, const std::string& name) {
  const auto it = known.tensors.find(name);
  PULSE_CHECK(it != known.tensors.end(), "the digests given for the base do not cover tensor '" + name + "'");
  return it->second;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// encode

std::vector<std::uint8_t> encode_patch(const std::vector<TensorRef>& base, const std::vector<TensorRef>& target,
                                       const EncodeOptions& options, const StateDigests* base_digests,
                                       StateDigests* target_digests) {
  std::map<std::string, const TensorRef*> base_by_name;
  for (const auto& t : base) PULSE_CHECK(base_by_name.emplace(t.name, &t).second, "duplicate tensor '" + t.name + "' in base");
  PULSE_CHECK(base.size() == target.size(), "base has " + std::to_string(base.size()) + " tensors, target " +
                                                std::to_string(target.size()));
  std::vector<PatchEntry> entries;
  std::vector<std::uint8_t> index_stream, value_stream, whole_stream;
  std::vector<std::uint8_t> value_high;  // raw coding: high bytes, appended after the low bytes
  std::map<std::string, Digest> base_digest_of;
  std::vector<Digest> target_list;  // in target order
  std::vector<index_t> indices;
  std::vector<bf16_bits> values, old_values;
  std::uint64_t total_changed = 0;

  for (const TensorRef& t : target) {
    const auto it = base_by_name.find(t.name);
    PULSE_CHECK(it != base_by_name.end(), "tensor '" + t.name + "' is in the target but not in the base");
    const TensorRef& b = *it->second;
    PULSE_CHECK(b.dtype == t.dtype && b.shape == t.shape,
                "tensor '" + t.name + "' changes from " + b.dtype + shape_string(b.shape) + " to " + t.dtype +
                    shape_string(t.shape));
    PULSE_CHECK(b.bytes == t.bytes, "tensor '" + t.name + "' differs in byte size");
    PatchEntry e{t.name, t.dtype, t.shape, EntryKind::same, 0, 0, {}, {}};
    if (base_digests) e.base_digest = known_digest(*base_digests, t.name);
    if (t.dtype == "BF16") {
      const std::uint64_t n = numel_of(t.shape);
      PULSE_CHECK(t.bytes == 2 * n, "tensor '" + t.name + "' size does not match its shape");
      e.kind = EntryKind::sparse;
      scan_bf16(b.data, t.data, n, base_digests ? nullptr : &e.base_digest, e.target_digest, indices, values,
                old_values);
      e.count = indices.size();
      total_changed += e.count;
      if (options.indices == IndexCoding::gap_fixed)
        e.index_width = static_cast<std::uint8_t>(fixed_gap_width(indices.data(), indices.size(), 0));
      encode_gaps(options.indices, e.index_width, indices.data(), indices.size(), 0, index_stream);
      for (std::size_t k = 0; k < indices.size(); ++k) {
        if (options.values == ValueCoding::raw) {
          value_stream.push_back(static_cast<std::uint8_t>(values[k] & 0xFF));
          value_high.push_back(static_cast<std::uint8_t>(values[k] >> 8));
        } else {
          const std::int64_t d = std::int64_t(bf16_key(values[k])) - std::int64_t(bf16_key(old_values[k]));
          put_varint(value_stream, zigzag(d));
        }
      }
    } else {
      if (!base_digests) e.base_digest = tensor_digest(b);
      e.target_digest = tensor_digest(t);
    }
    if (e.kind != EntryKind::sparse && std::memcmp(b.data, t.data, t.bytes) != 0) {
      e.kind = EntryKind::whole;
      e.count = t.bytes;
      const auto* p = reinterpret_cast<const std::uint8_t*>(t.data);
      whole_stream.insert(whole_stream.end(), p, p + t.bytes);
    }
    base_digest_of[t.name] = e.base_digest;
    target_list.push_back(e.target_digest);
    entries.push_back(std::move(e));
  }
  value_stream.insert(value_stream.end(), value_high.begin(), value_high.end());

  Writer entry_table;
  for (const PatchEntry& e : entries) {
    PULSE_CHECK(e.name.size() <= 0xFFFF && e.dtype.size() <= 0xFF && e.shape.size() <= 0xFF,
                "tensor '" + e.name + "' has a name, dtype or rank too long for a patch");
    entry_table.put<std::uint16_t>(e.name.size());
    entry_table.put_bytes(e.name.data(), e.name.size());
    entry_table.put<std::uint8_t>(e.dtype.size());
    entry_table.put_bytes(e.dtype.data(), e.dtype.size());
    entry_table.put<std::uint8_t>(e.shape.size());
    for (std::int64_t d : e.shape) entry_table.put<std::int64_t>(d);
    entry_table.put<std::uint8_t>(static_cast<std::uint8_t>(e.kind));
    entry_table.put<std::uint8_t>(e.index_width);
    entry_table.put<std::uint64_t>(e.count);
    entry_table.put_bytes(e.base_digest.data(), 16);
    entry_table.put_bytes(e.target_digest.data(), 16);
  }

  const auto coded_index = compress(options.compressor, options.level, index_stream);
  const auto coded_value = compress(options.compressor, options.level, value_stream);
  const auto coded_whole = compress(options.compressor, options.level, whole_stream);

  Writer w;
  w.put_bytes(kMagic, 8);
  w.put<std::uint16_t>(kFormatVersion);
  w.put<std::uint16_t>(options.signing_key ? 1 : 0);
  w.put<std::uint8_t>(static_cast<std::uint8_t>(options.values));
  w.put<std::uint8_t>(static_cast<std::uint8_t>(options.indices));
  w.put<std::uint8_t>(static_cast<std::uint8_t>(options.compressor));
  w.put<std::uint8_t>(0);
  w.put<std::uint64_t>(options.base_version);
  w.put<std::uint64_t>(options.target_version);
  Digest base_state;
  if (base_digests) {
    base_state = base_digests->state;
  } else {
    std::vector<Digest> in_base_order;
    for (const auto& t : base) in_base_order.push_back(base_digest_of.at(t.name));
    base_state = state_digest(base, in_base_order);
  }
  const Digest target_state = state_digest(target, target_list);
  if (target_digests) {
    target_digests->tensors.clear();
    for (std::size_t i = 0; i < target.size(); ++i) target_digests->tensors[target[i].name] = target_list[i];
    target_digests->state = target_state;
  }
  w.put_bytes(base_state.data(), 16);
  w.put_bytes(target_state.data(), 16);
  w.put<std::uint64_t>(total_changed);
  w.put<std::uint32_t>(static_cast<std::uint32_t>(entries.size()));
  for (const auto* s : {&index_stream, &value_stream, &whole_stream}) {
    const auto& coded = s == &index_stream ? coded_index : s == &value_stream ? coded_value : coded_whole;
    w.put<std::uint64_t>(coded.size());
    w.put<std::uint64_t>(s->size());
  }
  w.put<std::uint64_t>(entry_table.out.size());
  w.put_bytes(entry_table.out.data(), entry_table.out.size());
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

// ---------------------------------------------------------------------------------------
// parse

ParsedPatch parse_patch(const std::uint8_t* bytes, std::size_t size, const PatchLimits& limits,
                        const PublicKey* public_key) {
  PULSE_CHECK(size <= limits.max_patch_bytes, "patch is larger than the limit of " +
                                                  std::to_string(limits.max_patch_bytes) + " bytes");
  PULSE_CHECK(size >= kFixedHeaderBytes + kChecksumBytes, "patch is truncated (" + std::to_string(size) + " bytes)");
  PULSE_CHECK(std::memcmp(bytes, kMagic, 8) == 0, "not a PULSESync patch (bad magic)");
  Reader r{bytes, size, 8, "header"};
  ParsedPatch p;
  PatchHeader& h = p.header;
  h.format_version = r.get<std::uint16_t>();
  PULSE_CHECK(h.format_version == kFormatVersion,
              "patch format version " + std::to_string(h.format_version) + " is not supported (expected 1)");
  const auto flags = r.get<std::uint16_t>();
  PULSE_CHECK((flags & ~1u) == 0, "patch has unknown flags");
  h.is_signed = flags & 1;
  const auto values = r.get<std::uint8_t>(), indices = r.get<std::uint8_t>(), compressor = r.get<std::uint8_t>();
  PULSE_CHECK(values <= 1 && indices <= 1 && compressor <= 2 && r.get<std::uint8_t>() == 0,
              "patch names an unknown coding or compressor");
  h.values = static_cast<ValueCoding>(values);
  h.indices = static_cast<IndexCoding>(indices);
  h.compressor = static_cast<Compressor>(compressor);
  h.base_version = r.get<std::uint64_t>();
  h.target_version = r.get<std::uint64_t>();
  r.get_bytes(h.base_state.data(), 16);
  r.get_bytes(h.target_state.data(), 16);
  h.total_changed = r.get<std::uint64_t>();
  const std::uint32_t num_entries = r.get<std::uint32_t>();
  PULSE_CHECK(num_entries <= limits.max_tensors, "patch declares " + std::to_string(num_entries) + " tensors, limit " +
                                                     std::to_string(limits.max_tensors));
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

  Reader t{bytes, kFixedHeaderBytes + table_bytes, kFixedHeaderBytes, "entry table"};
  std::uint64_t changed = 0, whole_bytes = 0;
  std::map<std::string, int> seen;
  for (std::uint32_t i = 0; i < num_entries; ++i) {
    PatchEntry e;
    e.name.resize(t.get<std::uint16_t>());
    t.get_bytes(e.name.data(), e.name.size());
    e.dtype.resize(t.get<std::uint8_t>());
    t.get_bytes(e.dtype.data(), e.dtype.size());
    e.shape.resize(t.get<std::uint8_t>());
    for (auto& d : e.shape) d = t.get<std::int64_t>();
    const auto kind = t.get<std::uint8_t>();
    PULSE_CHECK(kind <= 2, "patch entry '" + e.name + "' has an unknown kind");
    e.kind = static_cast<EntryKind>(kind);
    e.index_width = t.get<std::uint8_t>();
    e.count = t.get<std::uint64_t>();
    t.get_bytes(e.base_digest.data(), 16);
    t.get_bytes(e.target_digest.data(), 16);
    PULSE_CHECK(seen.emplace(e.name, i).second, "patch names tensor '" + e.name + "' twice");
    const std::uint64_t n = numel_of(e.shape);
    if (e.kind == EntryKind::sparse) {
      PULSE_CHECK(e.dtype == "BF16", "patch entry '" + e.name + "' is sparse but not BF16");
      PULSE_CHECK(e.count <= n, "patch entry '" + e.name + "' changes more elements than it has");
      const bool width_ok = h.indices == IndexCoding::gap_varint
                                ? e.index_width == 0
                                : (e.index_width == 1 || e.index_width == 2 || e.index_width == 4 || e.index_width == 8);
      PULSE_CHECK(width_ok, "patch entry '" + e.name + "' has an invalid index width");
      PULSE_CHECK(e.count <= UINT64_MAX - changed, "patch entries' change counts overflow");
      changed += e.count;
    } else if (e.kind == EntryKind::whole) {
      // An unchanged tensor is `same`; a whole entry carries at least one new byte.
      PULSE_CHECK(e.count > 0, "patch entry '" + e.name + "' carries an empty tensor whole");
      PULSE_CHECK(e.count <= UINT64_MAX - whole_bytes, "patch entries' whole-tensor sizes overflow");
      whole_bytes += e.count;
    } else {
      PULSE_CHECK(e.count == 0 && e.base_digest == e.target_digest, "patch entry '" + e.name + "' is inconsistent");
    }
    p.entries.push_back(std::move(e));
  }
  PULSE_CHECK(t.pos == t.size, "patch entry table has trailing bytes");
  PULSE_CHECK(changed == h.total_changed, "patch entries do not add up to the declared change count");
  // Each change takes at least one raw index byte, so this holds for every valid patch; it also
  // keeps the stream-size products below far from overflowing.
  PULSE_CHECK(changed <= limits.max_stream_bytes, "patch declares more changes than a stream can hold");
  // Raw stream sizes follow from the entries; anything else is corrupt (or a decompression bomb).
  std::uint64_t fixed_index_bytes = 0;
  for (const auto& e : p.entries)
    if (e.kind == EntryKind::sparse) fixed_index_bytes += e.count * e.index_width;
  if (h.indices == IndexCoding::gap_fixed)
    PULSE_CHECK(h.index_stream.raw == fixed_index_bytes, "patch index stream size disagrees with its entries");
  else
    PULSE_CHECK(h.index_stream.raw >= changed && h.index_stream.raw <= 10 * changed,
                "patch index stream size disagrees with its entries");
  if (h.values == ValueCoding::raw)
    PULSE_CHECK(h.value_stream.raw == 2 * changed, "patch value stream size disagrees with its entries");
  else
    PULSE_CHECK(h.value_stream.raw >= changed && h.value_stream.raw <= 3 * changed,
                "patch value stream size disagrees with its entries");
  PULSE_CHECK(h.whole_stream.raw == whole_bytes, "patch whole-tensor stream size disagrees with its entries");

  p.index_stream = bytes + kFixedHeaderBytes + table_bytes;
  p.value_stream = p.index_stream + h.index_stream.coded;
  p.whole_stream = p.value_stream + h.value_stream.coded;
  p.patch_bytes = size;
  return p;
}

// ---------------------------------------------------------------------------------------
// apply

namespace {

// Changes are scattered over tensors far larger than the caches; prefetching this many ahead
// keeps enough memory accesses in flight.
constexpr std::size_t kPrefetchAhead = 16;

// What one entry will write, fully decoded and checked before the first write.
struct PlannedWrite {
  MutableTensor* tensor;
  std::vector<std::uint64_t> indices;  // sparse
  std::vector<bf16_bits> values;       // sparse: new bits
  const std::uint8_t* whole = nullptr; // whole: new bytes
};

}  // namespace

std::uint64_t apply_patch(const ParsedPatch& patch, std::vector<MutableTensor>& state, const PatchLimits& limits,
                          const StateDigests* base_digests, StateDigests* target_digests) {
  (void)limits;  // sizes were bounded by parse_patch; the receiver's own tensors bound the rest
  const PatchHeader& h = patch.header;
  // 1. The receiver holds exactly the patch's tensors, with the base contents.
  PULSE_CHECK(state.size() == patch.entries.size(), "patch covers " + std::to_string(patch.entries.size()) +
                                                        " tensors, the receiver holds " + std::to_string(state.size()));
  std::map<std::string, MutableTensor*> by_name;
  for (auto& t : state) by_name[t.name] = &t;
  std::map<std::string, Digest> digest_by_name;
  Digest base_state;
  if (base_digests) {
    for (const auto& t : state) digest_by_name[t.name] = known_digest(*base_digests, t.name);
    base_state = base_digests->state;
  } else {
    std::vector<TensorRef> refs;
    std::vector<Digest> digests;
    for (auto& t : state) {
      refs.push_back(t.view());
      digests.push_back(tensor_digest(refs.back()));
      digest_by_name[t.name] = digests.back();
    }
    base_state = state_digest(refs, digests);
  }
  PULSE_CHECK(base_state == h.base_state, "receiver's weights are not the patch's base version " +
                                              std::to_string(h.base_version) + " (state digest mismatch)");

  // 2. Every entry against the receiver's tensor before anything is decompressed: the raw
  // stream sizes follow from the entries, so they are then bounded by the receiver's tensors.
  for (const PatchEntry& e : patch.entries) {
    const auto it = by_name.find(e.name);
    PULSE_CHECK(it != by_name.end(), "receiver has no tensor '" + e.name + "'");
    const MutableTensor& t = *it->second;
    PULSE_CHECK(t.dtype == e.dtype && t.shape == e.shape, "receiver's tensor '" + e.name + "' is " + t.dtype +
                                                              shape_string(t.shape) + ", the patch expects " + e.dtype +
                                                              shape_string(e.shape));
    PULSE_CHECK(digest_by_name[e.name] == e.base_digest, "receiver's tensor '" + e.name + "' is not the base version");
    if (e.kind == EntryKind::whole)
      PULSE_CHECK(e.count == t.bytes, "patch carries " + std::to_string(e.count) + " bytes for tensor '" + e.name +
                                          "' of " + std::to_string(t.bytes));
    if (e.kind == EntryKind::sparse)
      PULSE_CHECK(t.bytes == 2 * numel_of(t.shape), "receiver's tensor '" + e.name + "' size does not match its shape");
  }

  // 3. Decompress and decode everything; check every index against the receiver's tensor.
  const auto index_raw = decompress(h.compressor, patch.index_stream, h.index_stream.coded, h.index_stream.raw);
  const auto value_raw = decompress(h.compressor, patch.value_stream, h.value_stream.coded, h.value_stream.raw);
  const auto whole_raw = decompress(h.compressor, patch.whole_stream, h.whole_stream.coded, h.whole_stream.raw);
  std::size_t index_pos = 0, value_pos = 0, whole_pos = 0, high_pos = h.total_changed;
  std::vector<PlannedWrite> plan;
  for (const PatchEntry& e : patch.entries) {
    if (e.kind == EntryKind::same) continue;
    MutableTensor& t = *by_name[e.name];
    PlannedWrite w{&t, {}, {}, nullptr};
    if (e.kind == EntryKind::whole) {
      w.whole = whole_raw.data() + whole_pos;
      whole_pos += e.count;
    } else {
      const std::uint64_t n = numel_of(t.shape);
      w.indices.resize(e.count);
      w.values.resize(e.count);
      decode_gaps(h.indices, e.index_width, index_raw.data(), index_raw.size(), index_pos, e.count, 0, n,
                  w.indices.data(), "patch", " in tensor '" + e.name + "'");
      if (h.values == ValueCoding::raw) {
        for (std::uint64_t k = 0; k < e.count; ++k)
          w.values[k] = static_cast<bf16_bits>(value_raw[value_pos++] | (value_raw[high_pos++] << 8));
      } else {
        for (std::uint64_t k = 0; k < e.count; ++k) {
          // The old values are scattered: ask for them a few changes ahead.
          if (k + kPrefetchAhead < e.count) __builtin_prefetch(t.data + 2 * w.indices[k + kPrefetchAhead]);
          const std::int64_t d = unzigzag(get_varint(value_raw.data(), value_raw.size(), value_pos));
          // Bound d first: a 64-bit difference would overflow the sum.
          PULSE_CHECK(d >= -0xFFFF && d <= 0xFFFF, "patch value out of range in tensor '" + e.name + "'");
          const std::int64_t key = std::int64_t(bf16_key(load_bf16(t.data, w.indices[k]))) + d;
          PULSE_CHECK(key >= 0 && key <= 0xFFFF, "patch value out of range in tensor '" + e.name + "'");
          w.values[k] = bf16_from_key(static_cast<std::uint16_t>(key));
        }
      }
    }
    plan.push_back(std::move(w));
  }
  const std::size_t value_end = h.values == ValueCoding::raw ? h.total_changed : value_raw.size();
  PULSE_CHECK(index_pos == index_raw.size() && value_pos == value_end && whole_pos == whole_raw.size(),
              "patch streams hold bytes no entry uses (corrupt patch)");

  // 4. Write, keeping what was there; 5. verify the target; restore on any mismatch.
  std::vector<std::vector<std::uint8_t>> undo(plan.size());
  std::uint64_t written = 0;
  for (std::size_t p = 0; p < plan.size(); ++p) {
    PlannedWrite& w = plan[p];
    if (w.whole) {
      undo[p].assign(reinterpret_cast<std::uint8_t*>(w.tensor->data),
                     reinterpret_cast<std::uint8_t*>(w.tensor->data) + w.tensor->bytes);
      std::memcpy(w.tensor->data, w.whole, w.tensor->bytes);
      written += w.tensor->bytes;
    } else {
      undo[p].resize(2 * w.indices.size());
      for (std::size_t k = 0; k < w.indices.size(); ++k) {
        if (k + kPrefetchAhead < w.indices.size()) __builtin_prefetch(w.tensor->data + 2 * w.indices[k + kPrefetchAhead], 1);
        std::memcpy(undo[p].data() + 2 * k, w.tensor->data + 2 * w.indices[k], 2);
        std::memcpy(w.tensor->data + 2 * w.indices[k], &w.values[k], 2);
      }
      written += w.indices.size();
    }
  }
  auto restore = [&] {
    for (std::size_t p = 0; p < plan.size(); ++p) {
      PlannedWrite& w = plan[p];
      if (w.whole)
        std::memcpy(w.tensor->data, undo[p].data(), w.tensor->bytes);
      else
        for (std::size_t k = 0; k < w.indices.size(); ++k)
          std::memcpy(w.tensor->data + 2 * w.indices[k], undo[p].data() + 2 * k, 2);
    }
  };
  // Untouched tensors keep their (verified) base digest; touched ones are hashed again.
  std::vector<Digest> after;
  std::vector<TensorRef> entry_refs;
  for (const auto& e : patch.entries) {
    const MutableTensor& t = *by_name[e.name];
    entry_refs.push_back(t.view());
    const bool touched = e.kind == EntryKind::whole || (e.kind == EntryKind::sparse && e.count > 0);
    after.push_back(touched ? tensor_digest(entry_refs.back()) : digest_by_name[e.name]);
    if (after.back() != e.target_digest) {
      restore();
      throw_error(__FILE__, __LINE__, "tensor '" + e.name + "' does not match the patch's target digest after apply; weights restored");
    }
  }
  const Digest target_state = state_digest(entry_refs, after);
  if (target_state != h.target_state) {
    restore();
    throw_error(__FILE__, __LINE__, "weights do not match the patch's target state digest after apply; weights restored");
  }
  if (target_digests) {
    target_digests->tensors.clear();
    for (std::size_t i = 0; i < entry_refs.size(); ++i) target_digests->tensors[entry_refs[i].name] = after[i];
    target_digests->state = target_state;
  }
  return written;
}

}  // namespace pulse::sync
