// libFuzzer entry: the input drives a random base state and a random change of it (sparse
// changes of every sparse-coded dtype, a tensor carried whole, sometimes a layout or metadata
// change), which is encoded with a coding, compressor, part size and thread count the input
// picks, then parsed and applied. Every step must succeed, and the state reached must be the
// target byte for byte (and its metadata the target's); encoding at 1 and at 2 threads must
// give the same bytes. Anything else is a bug (__builtin_trap), as is any exception.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "patch_fuzz_state.hpp"
#include "sync/change_history.hpp"
#include "sync/patch.hpp"

namespace {

using namespace pulse::sync;
using pulse_fuzz::FuzzState;
using pulse_fuzz::FuzzTensor;

// The input as a stream of choices; past its end every choice is 0.
struct Choices {
  const std::uint8_t* data;
  std::size_t size, pos = 0;
  std::uint64_t byte() { return pos < size ? data[pos++] : 0; }
  std::uint64_t below(std::uint64_t n) {  // in [0, n), n <= 2^16
    const std::uint64_t v = byte() | byte() << 8;
    return n == 0 ? 0 : v % n;
  }
};

struct Dtype {
  const char* name;
  unsigned bytes;
};
constexpr Dtype kSparse[] = {{"BF16", 2}, {"F16", 2}, {"F32", 4},        {"F8_E5M2", 1},
                             {"F8_E4M3", 1}, {"F8_E8M0", 1}, {"F8_E4M3FNUZ", 1}, {"F8_E5M2FNUZ", 1}};

FuzzTensor random_tensor(Choices& in, const std::string& name, std::uint64_t seed) {
  const Dtype d = kSparse[in.below(8)];
  const std::uint64_t n = in.below(4) == 0 ? in.below(3) : in.below(700);
  FuzzTensor t{name, d.name, {std::int64_t(n)}, std::vector<std::byte>(n * d.bytes)};
  // Weights near one magnitude (as trained weights are), some anywhere.
  for (std::uint64_t i = 0; i < n; ++i) {
    std::uint64_t r = pulse_fuzz::mix(seed * 1000003 + i);
    if (r % 8 != 0 && d.bytes > 1) r = (r & ~(std::uint64_t(0x3F) << (8 * d.bytes - 8))) | (std::uint64_t(0x3C) << (8 * d.bytes - 8));
    std::memcpy(t.bytes.data() + i * d.bytes, &r, d.bytes);
  }
  return t;
}

// Changes about `rate`/256 of the elements (at least one when rate is 255), by small steps of
// the key or to any bits.
void change(Choices& in, FuzzTensor& t, std::uint64_t seed) {
  const unsigned w = sparse_format(t.dtype)->bytes;
  const std::uint64_t n = t.bytes.size() / w, rate = in.byte();
  const SparseFormat f = *sparse_format(t.dtype);
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t r = pulse_fuzz::mix(seed * 7919 + i);
    if (r % 256 >= rate) continue;
    std::uint64_t bits = 0;
    std::memcpy(&bits, t.bytes.data() + i * w, w);
    if ((r >> 8) % 4 == 0) {
      bits = (r >> 16) & f.mask();
    } else {
      const std::int64_t step = std::int64_t((r >> 16) % 7) - 3;
      const std::int64_t key = std::int64_t(f.key(bits)) + step;
      if (key < 0 || key > std::int64_t(f.mask())) continue;
      bits = f.from_key(std::uint64_t(key));
    }
    std::memcpy(t.bytes.data() + i * w, &bits, w);
  }
}

struct Coding {
  ValueCoding values;
  IndexCoding indices;
};
constexpr Coding kCodings[] = {
    {ValueCoding::raw, IndexCoding::gap_fixed},         {ValueCoding::raw, IndexCoding::gap_varint},
    {ValueCoding::keydiff, IndexCoding::gap_fixed},     {ValueCoding::keydiff, IndexCoding::gap_varint},
    {ValueCoding::exponent_class, IndexCoding::exponent_class},
    {ValueCoding::exponent_class_history, IndexCoding::exponent_class_history}};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Choices in{data, size};
  const std::uint64_t seed = in.byte() | in.byte() << 8 | in.byte() << 16;
  const Coding coding = kCodings[in.below(6)];
  const bool history_coding = coding.values == ValueCoding::exponent_class_history;

  // The base: up to 5 sparse tensors, an I32 tensor, and metadata.
  FuzzState base;
  const std::uint64_t tensors = 1 + in.below(5);
  for (std::uint64_t k = 0; k < tensors; ++k) base.push_back(random_tensor(in, "t" + std::to_string(k), seed + k));
  base.push_back({"ints", "I32", {3}, std::vector<std::byte>(12, std::byte(1))});
  Metadata base_metadata{{"format", "pt"}}, target_metadata = base_metadata;

  FuzzState target = base;
  for (std::uint64_t k = 0; k < tensors; ++k) change(in, target[k], seed + 100 + k);
  if (in.below(2)) target.back().bytes[0] = std::byte(7);  // carried whole
  if (!history_coding && in.below(4) == 0) {  // a layout change: one removed, one added
    target.erase(target.begin() + std::ptrdiff_t(in.below(std::uint64_t(target.size()))));
    target.push_back(random_tensor(in, "added", seed + 999));
  }
  if (in.below(4) == 0) target_metadata["step"] = std::to_string(seed);

  EncodeOptions options;
  options.values = coding.values;
  options.indices = coding.indices;
  options.compressor = static_cast<Compressor>(in.below(3));
  options.part_elements = 1 + in.below(1024);
  options.threads = 1 + unsigned(in.below(2));
  options.base_version = 5;
  options.target_version = 6;
  const ChangeHistory history = pulse_fuzz::base_history(base);
  if (history_coding) options.history = &history;

  std::vector<std::uint8_t> bytes;
  try {
    bytes = encode_patch(pulse_fuzz::refs(base), pulse_fuzz::refs(target), options, nullptr, nullptr, base_metadata,
                         target_metadata);
    EncodeOptions other = options;
    other.threads = 3 - options.threads;
    if (encode_patch(pulse_fuzz::refs(base), pulse_fuzz::refs(target), other, nullptr, nullptr, base_metadata,
                     target_metadata) != bytes)
      __builtin_trap();  // the bytes depend on the thread count
  } catch (const pulse::Error&) {
    __builtin_trap();  // a valid change must encode
  }

  FuzzState state = base;
  std::vector<MutableTensor> receiver = pulse_fuzz::mutables(state);
  ChangeHistory receiver_history = history;
  StateChange change;
  try {
    const ParsedPatch patch = parse_patch(bytes.data(), bytes.size());
    apply_patch(patch, receiver, {}, nullptr, nullptr, base_metadata, &change,
                history_coding ? &receiver_history : nullptr, options.threads);
  } catch (const pulse::Error&) {
    __builtin_trap();  // the patch of a valid change must apply
  }

  // The state reached: the receiver's tensors less the removed, plus the added, by name.
  std::map<std::string, std::vector<std::byte>> reached, expected;
  for (const auto& t : state) reached[t.name] = t.bytes;
  for (const auto& name : change.removed) reached.erase(name);
  for (std::size_t i = 0; i < change.added.size(); ++i) reached[change.added[i].name] = change.added_bytes[i];
  for (const auto& t : target) expected[t.name] = t.bytes;
  if (reached != expected) __builtin_trap();
  if (change.metadata != target_metadata) __builtin_trap();
  return 0;
}
