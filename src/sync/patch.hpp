#pragma once
// PULSESync patches: the lossless change from one version of a model state to the next.
// Floating-point tensors of BF16, F16, F32 and the FP8 dtypes carry sorted changed indices and
// their new values; other tensors are marked unchanged or carried whole; added and removed
// tensors and a changed `__metadata__` travel too. The byte format is src/sync/FORMAT.md.
//
// Receiving is transactional: parse_patch checks the structure, sizes, checksum and signature;
// apply_patch checks the receiver's layout and base digest, decodes everything (writing the
// sparse changes in place, their old values kept), verifies the target state digest, and on any
// failure writes the old values back.
#include <cstddef>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "coding/compress.hpp"
#include "coding/digest.hpp"
#include "coding/index_coding.hpp"
#include "sync/part_coding.hpp"
#include "coding/signing.hpp"

namespace pulse::sync {

// The patch file's fixed parts (FORMAT.md): the header before the entry table, the xxh3-128
// checksum, and the Ed25519 signature of a signed patch.
inline constexpr std::size_t patch_fixed_header_bytes = 8 + 2 + 2 + 4 + 8 + 8 + 3 * 16 + 3 * 16 + 8;  // 136
inline constexpr std::size_t patch_checksum_bytes = 16;
inline constexpr std::size_t patch_signature_bytes = 64;

enum class ValueCoding : std::uint8_t {
  raw = 0,      // new bit patterns, split into byte planes
  keydiff = 1,  // zig-zag varint of key(new) - key(old): exact, usually one byte
  // Positions and values coded in contexts of the receiver's old weights (exponent class of the
  // old value), with IndexCoding::exponent_class; exponent_class_coding.hpp. Id 2 was an
  // earlier version of it, which parse_patch refuses.
  exponent_class = 3,
  // The same with each sign coded in the context of its element's change history, which sender
  // and receiver keep from version to version (change_history.hpp): receivers that follow every
  // version (pulse-train's inference ranks), not relays or late joiners.
  exponent_class_history = 4,
};
inline constexpr NamedValue<ValueCoding> value_coding_names[] = {{ValueCoding::raw, "raw"},
                                                                 {ValueCoding::keydiff, "keydiff"},
                                                                 {ValueCoding::exponent_class, "expclass"},
                                                                 {ValueCoding::exponent_class_history, "expclass-history"}};
// Either expclass coding (3 or 4).
inline bool is_exponent_class(ValueCoding v) {
  return v == ValueCoding::exponent_class || v == ValueCoding::exponent_class_history;
}
enum class EntryKind : std::uint8_t {
  sparse = 0,  // a sparse-coded dtype: changed indices + values
  same = 1,    // bytes unchanged
  whole = 2,   // new bytes carried whole (any dtype; every added tensor)
};

// True for the dtypes coded sparsely (element-wise against the old value): BF16, F16, F32 and
// the FP8 dtypes. Every other dtype passes through, unchanged or whole.
bool is_sparse_dtype(const std::string& dtype);

// A model state's `__metadata__` (safetensors' string-to-string map): part of the state.
using Metadata = std::map<std::string, std::string>;

inline const char* value_coding_name(ValueCoding v) { return name_of(value_coding_names, v); }
ValueCoding parse_value_coding(const std::string& name);  // throws pulse::Error listing the names
inline const char* index_coding_name(IndexCoding i) { return name_of(index_coding_names, i); }
IndexCoding parse_index_coding(const std::string& name);  // throws pulse::Error listing the names

class ChangeHistory;
struct ChangeSet;

struct EncodeOptions {
  ValueCoding values = ValueCoding::keydiff;
  IndexCoding indices = IndexCoding::gap_varint;
  Compressor compressor = Compressor::zstd;
  int level = 3;
  std::uint64_t base_version = 0;
  std::uint64_t target_version = 1;
  const SecretKey* signing_key = nullptr;  // sign when set
  // expclass-history: the sender's history at the base version, which the receiver must hold.
  const ChangeHistory* history = nullptr;
  // Parts (FORMAT.md): segments of at most this many elements (rounded down to whole 128-byte
  // blocks), small consecutive ones grouped into one part up to it.
  std::uint64_t part_elements = std::uint64_t(1) << 24;
  unsigned threads = 0;  // parts coded at once; 0: the machine's cores. The bytes do not depend on it.
};

// The exponent-class coding with uncompressed streams: the smallest patches of training steps.
EncodeOptions exponent_class_options();
// Its history variant, coded against `history` (which must outlive the options).
EncodeOptions exponent_class_history_options(const ChangeHistory& history);

// Every size a patch declares is checked against these before anything is allocated.
struct PatchLimits {
  std::uint64_t max_patch_bytes = std::uint64_t(1) << 40;
  std::uint64_t max_tensors = std::uint64_t(1) << 20;
  std::uint64_t max_entry_table_bytes = std::uint64_t(1) << 28;
  std::uint64_t max_stream_bytes = std::uint64_t(1) << 36;
};

// A tensor's name, dtype and shape (a layout is a set of them).
struct TensorLayout {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
};

// One entry per tensor of the target layout, in name order; names, dtypes and shapes come
// from the receiver's layout and the patch's layout change.
struct PatchEntry {
  EntryKind kind = EntryKind::same;
  std::uint8_t index_width = 0;  // sparse, gap_fixed: bytes per gap (1, 2, 4, 8); 0 otherwise
  std::uint64_t count = 0;       // sparse: changed elements; 0 otherwise
};

// Totals of one dtype of the target, so a patch reports what it changes without the layout.
struct DtypeSummary {
  std::string dtype;
  std::uint64_t tensors = 0;
  std::uint64_t elements = 0;
  std::uint64_t changed = 0;      // elements of sparse entries
  std::uint64_t whole_bytes = 0;  // bytes of tensors carried whole
};
bool operator==(const DtypeSummary& a, const DtypeSummary& b);

struct StreamSize {
  std::uint64_t coded = 0;
  std::uint64_t raw = 0;
};

struct PatchHeader {
  std::uint16_t format_version = 3;
  bool is_signed = false;
  bool changes_layout = false;
  bool changes_metadata = false;
  ValueCoding values = ValueCoding::keydiff;
  IndexCoding indices = IndexCoding::gap_varint;
  Compressor compressor = Compressor::zstd;
  std::uint64_t base_version = 0;
  std::uint64_t target_version = 0;
  Digest base_layout{};
  Digest base_state{};
  Digest target_state{};
  std::uint64_t total_changed = 0;  // sum of the sparse entries' counts
  StreamSize index_stream, value_stream, whole_stream;
  Digest history{};  // expclass-history: ChangeHistory::digest() of the sender at the base
};

// A contiguous element range of a sparse entry (FORMAT.md "Part table"), and its changes. A
// segment that ends its entry is written without its size and count: parse_patch gives it
// ends_entry, its count from the entry's, and elements 0 (the reader, which holds the layout,
// takes the rest of the tensor).
struct PatchSegment {
  std::uint64_t elements = 0;
  std::uint64_t count = 0;
  bool ends_entry = false;
};

// A run of consecutive segments with its own index and value streams (and coder state).
struct PatchPart {
  std::vector<PatchSegment> segments;
  StreamSize index, value;
};

// A patch whose structure, sizes, checksum and (when a key was given) signature are valid.
// It refers to the bytes it was parsed from, which must outlive it.
struct ParsedPatch {
  PatchHeader header;
  std::vector<std::string> removed;    // base tensors the target drops (or re-declares)
  std::vector<TensorLayout> added;     // target tensors not in the base, carried whole
  Metadata metadata;                   // the target's, when changes_metadata
  std::vector<DtypeSummary> summary;   // per dtype of the target, by dtype name
  std::vector<PatchEntry> entries;
  std::vector<PatchPart> parts;  // their coded streams lie in order in the index and value streams
  const std::uint8_t* index_stream = nullptr;
  const std::uint8_t* value_stream = nullptr;
  const std::uint8_t* whole_stream = nullptr;
  std::uint64_t patch_bytes = 0;
  std::uint64_t table_bytes = 0;  // layout change, metadata, dtype summary, entries and parts
};

// A receiver's tensor, writable in place.
struct MutableTensor {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::byte* data = nullptr;
  std::size_t bytes = 0;
  TensorRef view() const { return {name, dtype, shape, data, bytes}; }
};

// Digests of a state that a sender or receiver keeps from one version to the next, so the next
// encode or apply need not hash the base again: pass the digests the previous call returned
// for exactly the bytes it now holds.
struct StateDigests {
  std::map<std::string, Digest> tensors;
  Digest state{};
};
// Hashed on `threads` threads (0: the machine's cores).
StateDigests compute_digests(const std::vector<TensorRef>& state, const Metadata& metadata = {}, unsigned threads = 0);

// Reads bytes [offset, offset + bytes) of a tensor that is not in memory (TensorRef::data
// null, bytes > 0), given its index in its state, into out. Called from several threads at once.
using TensorLoader = std::function<void(std::size_t index, std::uint64_t offset, std::size_t bytes, std::byte* out)>;

// Any two states: tensors present in both with equal dtype and shape are coded against the
// base; the others are removed or added (carried whole); a changed metadata travels whole.
// With base_digests the base is not hashed again; target_digests, when given, receives the
// target's. A state whose tensors are not in memory comes with its loader: encode then holds,
// per thread, one segment of each state (options.part_elements elements at most: 32 MiB of BF16
// by default) or an 8 MiB piece of a tensor not coded sparsely, and the patch
// (sync/streamed_state.hpp). The parts are coded on options.threads threads in any case.
std::vector<std::uint8_t> encode_patch(const std::vector<TensorRef>& base, const std::vector<TensorRef>& target,
                                       const EncodeOptions& options, const StateDigests* base_digests = nullptr,
                                       StateDigests* target_digests = nullptr, const Metadata& base_metadata = {},
                                       const Metadata& target_metadata = {}, const TensorLoader& base_loader = {},
                                       const TensorLoader& target_loader = {});

// One tensor's changes: sorted, distinct element indices and the new bits of each.
struct TensorChanges {
  std::string name;
  std::vector<index_t> indices;
  std::vector<std::uint32_t> new_bits;
};

// The patch encode_patch(base, target, options, &base_digests, target_digests, metadata,
// metadata) writes, where target is base with `changes` written (tensors of sparse-coded dtypes,
// each at most once; the layout and metadata stay), built from the changes without a copy of
// the target or a comparison of two states: only changed tensors are hashed (as base plus
// changes). A listed element whose new bits equal its old ones is no change.
std::vector<std::uint8_t> encode_changes(const std::vector<TensorRef>& base, const std::vector<TensorChanges>& changes,
                                         const EncodeOptions& options, const StateDigests& base_digests,
                                         StateDigests* target_digests = nullptr, const Metadata& metadata = {});

// What an encoder wrote, so that its caller need not parse the patch back.
struct EncodeSummary {
  std::uint64_t bytes = 0;       // the patch's
  std::uint64_t changed = 0;     // elements its sparse entries write
  std::uint64_t parts = 0;       // coded independently (FORMAT.md "Part table")
  StreamSize index_stream, value_stream;  // the parts' streams, compressed and raw
  std::uint64_t whole_raw = 0;   // bytes of the tensors carried whole, before compression
  std::uint64_t raw_bytes() const { return index_stream.raw + value_stream.raw + whole_raw; }
};

struct EncodedPatch {
  std::vector<std::uint8_t> bytes;
  EncodeSummary summary;
};

// The patch encode_changes writes, from a change set (sync/change_set.hpp) over `base`: the
// tensors, all of 16-bit sparse-coded dtypes, end to end in the given order make the flat state
// that the set indexes (one begin per tensor and one more), each tensor's changes taken from its
// slice of the set without searching. The same bytes as encode_changes of the same changes.
EncodedPatch encode_change_set(const std::vector<TensorRef>& base, const ChangeSet& changes, const EncodeOptions& options,
                               const StateDigests& base_digests, StateDigests* target_digests = nullptr,
                               const Metadata& metadata = {});

// The elements of each segment (but a tensor's last) of a sparse-coded tensor of `width`-byte
// elements, as encode_patch cuts them.
std::uint64_t patch_segment_elements(const EncodeOptions& options, unsigned width);

// One segment's changed count and raw index and value streams.
struct SegmentStreams {
  std::uint64_t count = 0;
  std::vector<std::uint8_t> index, value;
};

// The size of the unsigned patch encode_patch writes when every tensor of an unchanged layout
// (given in name order) is sparse-coded and its segments' raw streams are these (segments after
// the last given are empty): a patch's size without writing it (pulse-measure). Not for
// gap-fixed.
std::uint64_t sparse_patch_bytes(const EncodeOptions& options, const std::vector<TensorLayout>& layout,
                                 const std::vector<std::vector<SegmentStreams>>& segments);

// ---- Sharded senders: parts made where the tensors' slices lie, assembled into one patch ----

// The slice [begin, end) of a sparse-coded tensor that a sender holds in its base and target
// (data at element `begin`); begin and end (unless it is numel) lie on 128-byte boundaries.
struct TensorSlice {
  std::string name;
  std::string dtype;
  std::uint64_t numel = 0;  // of the whole tensor
  std::uint64_t begin = 0, end = 0;
  const std::byte* base = nullptr;
  const std::byte* target = nullptr;
  const std::uint8_t* history = nullptr;  // expclass-history: the history's bytes of the slice
};

// One part made on its own: its segments and its coded streams.
struct EncodedPart {
  PatchPart part;
  std::vector<std::uint8_t> index_coded, value_coded;
};

// A slice's parts (segments of one tensor only, so that parts of slices held elsewhere go
// between them) and the partial tensor digests of its base and target bytes (BlockDigest sums).
struct SliceParts {
  std::vector<EncodedPart> parts;
  BlockDigest base, target;
};

// Encodes each slice's parts (on options.threads threads). Not for gap-fixed, whose width is
// the whole entry's.
std::vector<SliceParts> encode_slice_parts(const std::vector<TensorSlice>& slices, const EncodeOptions& options);

// The patch of an unchanged layout (in name order) whose sparse-coded tensors change by the
// parts given in patch order (for each tensor, the parts of its slices by begin) and whose
// other tensors stay: the entries follow from the parts' segments. The state digests are the
// caller's (tensor digests combined by BlockDigest addition, then state_digest).
std::vector<std::uint8_t> assemble_patch(const EncodeOptions& options, const std::vector<TensorLayout>& layout,
                                         const Digest& base_state, const Digest& target_state,
                                         const std::vector<EncodedPart>& parts);

// Throws pulse::Error with a one-line reason. With a public key, an unsigned patch or a bad
// signature is rejected.
ParsedPatch parse_patch(const std::uint8_t* bytes, std::size_t size, const PatchLimits& limits = {},
                        const PublicKey* public_key = nullptr);

// One entry of a patch decoded against the receiver's tensor: what applying it writes.
struct DecodedEntry {
  EntryKind kind = EntryKind::same;
  bool added = false;                   // a tensor the patch adds (patch.added[tensor]), else the receiver's
  std::size_t tensor = 0;               // index in the receiver's tensors, or in patch.added
  std::uint64_t bytes = 0;              // the target tensor's size
  unsigned width = 0;                   // sparse: bytes per element
  std::vector<std::uint64_t> indices;   // sparse: the changed elements, sorted
  std::vector<std::uint8_t> values;     // sparse: their new values, width bytes each
  const std::uint8_t* whole = nullptr;  // whole: the new bytes (owned by the decoder)
  Digest digest{};                      // touched(): the target tensor's, hashed while decoding (hash_targets)
  // Whether the entry writes anything: carried whole, or sparse with changes.
  bool touched() const { return kind == EntryKind::whole || !indices.empty(); }
};

// A patch's entries decoded one at a time, in order (the target's tensors by name), against
// the receiver's tensors: apply_patch's checks and decoding, for receivers that write each
// tensor as soon as it is decoded (sync/file_apply.hpp). The base's contents are checked by
// the caller, with check_base once it has hashed them.
class PatchDecoder {
 public:
  // Checks the receiver's layout (names, dtypes, shapes) against the patch's base and every
  // entry against its tensor; decompresses the streams. Keeps references to the arguments.
  // Without hash_targets, next() leaves DecodedEntry::digest zero (for a caller that hashes the
  // patched bytes as it writes them). An expclass-history patch needs the receiver's change
  // history, at the patch's digest.
  // The parts are decompressed, and the segments of an entry decoded, on `threads` threads
  // (0: the machine's cores).
  PatchDecoder(const ParsedPatch& patch, const std::vector<TensorRef>& base, bool hash_targets = true,
               const ChangeHistory* history = nullptr, unsigned threads = 1);
  ~PatchDecoder();
  PatchDecoder(const PatchDecoder&) = delete;
  PatchDecoder& operator=(const PatchDecoder&) = delete;
  std::size_t size() const { return targets_.size(); }
  // Decodes the next entry, reading the old bytes of its tensor (base[tensor].data) and
  // writing none. Throws pulse::Error on a corrupt patch.
  DecodedEntry next();
  // As next(), and writes the entry's changes into the receiver's tensor (state[tensor], whose
  // view is base[tensor]) as the decoding pass reaches them, so that the digest hashes the tensor
  // in place, not copies of its pieces. Each change is swapped with the old value: the entry's
  // values are then the old ones, and writing them at its indices puts the tensor back. On an
  // exception nothing stays written. Entries carried whole are not written.
  DecodedEntry next_in_place(std::vector<MutableTensor>& state);
  // Decodes every entry, part by part on the threads, writing the changes in place as
  // next_in_place does; each entry's digest is `known` (the base tensor's digest, by receiver
  // tensor) updated over the blocks it touches. On an exception nothing stays written.
  std::vector<DecodedEntry> decode_all_in_place(std::vector<MutableTensor>& state, const std::vector<Digest>& known);
  // Part by part, for receivers that decode parts on threads of their own and write each entry
  // once all the parts it lies in are decoded (sync/file_apply.cpp). A part's segments lie in
  // the entries part_entries(p) (increasing); start(k) sets up entry k (once, before a part
  // decodes into it); decode_part(p, entries) decodes part p into entries[k] for each of its
  // entries k (entries: one per entry, indexed by entry). Distinct parts may be decoded at once,
  // each exactly once; decode_part reads the base's bytes of the part's tensors and writes none.
  std::size_t parts() const { return parts_.size(); }
  std::vector<std::size_t> part_entries(std::size_t p) const;
  DecodedEntry start(std::size_t k) const { return start_entry(k); }
  void decode_part(std::size_t p, std::vector<DecodedEntry>& entries);
  // A segment placed in its entry: elements [begin, begin + elements) of the entry's tensor (a
  // sparse entry's segments tile it), whose `count` changes go to the entry's lists from
  // `first_change` on.
  struct Segment {
    std::size_t entry, part;
    std::uint64_t begin, elements, count, first_change;
  };
  // The segments of part p, or of entry k, in decoding order.
  std::vector<Segment> part_segments(std::size_t p) const;
  std::vector<Segment> entry_segments(std::size_t k) const;
  // As decode_part, against old bytes the caller gives segment by segment: old(s) returns
  // segment s's elements (read only, until done(s) returns; nullptr: the base's), and done(s)
  // is called once its changes are in entries[s.entry].
  void decode_part(std::size_t p, std::vector<DecodedEntry>& entries,
                   const std::function<const std::byte*(const Segment&)>& old,
                   const std::function<void(const Segment&)>& done);
  // Throws unless every entry (or, with decode_part, every part) was decoded and the streams
  // hold no other bytes.
  void finish() const;
  // Throw the receiver's errors for a base state or target state digest that is not the patch's.
  void check_base(const Digest& base_state) const;
  void check_target(const Digest& target_state) const;

 private:
  struct Target {
    const TensorLayout* layout;
    bool added;
    std::size_t tensor;  // in base, or in patch.added
    std::uint64_t bytes;
  };
  DecodedEntry start_entry(std::size_t k) const;
  // Decodes a segment's changes into the entry's lists, against old, the segment's old
  // elements (by default the base's).
  void decode_segment(const Segment& s, DecodedEntry& w, const std::byte* old = nullptr);
  // What a decode error in segment s names: " in tensor 'NAME'".
  std::string error_context(const Segment& s) const;
  std::vector<std::size_t> part_first_;  // per part: its first segment (parts + 1)
  std::atomic<std::size_t> parts_decoded_{0};
  const ParsedPatch& patch_;
  const std::vector<TensorRef>& base_;
  std::vector<TensorLayout> base_layout_;
  std::vector<Target> targets_;
  std::vector<Segment> segments_;
  std::vector<std::size_t> entry_segments_;  // per entry: its first segment (entries + 1)
  std::vector<std::uint64_t> whole_offsets_;  // per entry: its bytes in the whole stream
  std::vector<std::vector<std::uint8_t>> index_raw_, value_raw_;  // per part
  std::vector<std::uint8_t> whole_raw_;
  std::vector<PartDecoder> parts_;
  std::size_t next_ = 0;
  bool decoded_all_ = false;
  bool hash_targets_;
  const ChangeHistory* history_ = nullptr;  // expclass-history patches only
  unsigned threads_;
};

// What a patch changes beyond the bytes of the tensors the receiver keeps; apply_patch fills it
// once the target is verified and the caller commits it (it cannot fail then).
struct StateChange {
  std::vector<std::string> removed;
  std::vector<TensorLayout> added;
  std::vector<std::vector<std::byte>> added_bytes;  // one per added tensor
  Metadata metadata;                                // the target's
};

// Applies a parsed patch to the receiver's state (its tensors in place, and its metadata). On
// any failure the state is left exactly as it was and pulse::Error says why. Returns the
// number of elements (sparse) and bytes (whole) written. With base_digests (what the previous
// apply returned) the base is not hashed again; only the tensors the patch touches are hashed,
// as they are written. target_digests receives the new digests. A patch that adds or removes
// tensors or changes the metadata needs `change`, which then receives them. A receiver that
// keeps a change history passes it with every patch (of any coding): it decodes
// expclass-history patches, and advances by the version once the target is verified.
std::uint64_t apply_patch(const ParsedPatch& patch, std::vector<MutableTensor>& state, const PatchLimits& limits = {},
                          const StateDigests* base_digests = nullptr, StateDigests* target_digests = nullptr,
                          const Metadata& metadata = {}, StateChange* change = nullptr,
                          ChangeHistory* history = nullptr, unsigned threads = 0);

}  // namespace pulse::sync
