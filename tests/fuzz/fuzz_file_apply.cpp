// libFuzzer entry: the streamed file-to-file apply (sync/file_apply) of a patch to a base
// .safetensors file. The patches are made by pulse's own encoder (encode_patch), so the target
// follows the patch format as it changes; the input says what the patch changes and how it is
// then damaged:
//   byte 0      the coding (value x index coding) and compressor of the patch
//   byte 1      n, the number of changed elements (mod 64)
//   n x 4 bytes a change: tensor, element (2 bytes), a step of its bit pattern
//   the rest    damage, 4 bytes each: patch or base file, offset (2 bytes), xor mask; a damaged
//               patch gets its trailing checksum rewritten (an unsigned patch ends with it), so
//               the damage reaches the decoders and the apply
// apply_file must write the target exactly (an undamaged patch) or throw pulse::Error; after an
// error the output path does not exist and no temporary file is left, and after a success the
// output holds the patch's target state. A crash, a sanitizer report, any other exception or a
// broken contract is a bug.
#include <dirent.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "io/safetensors.hpp"
#include "patch_fuzz_state.hpp"
#include "coding/digest.hpp"
#include "sync/file_apply.hpp"
#include "sync/patch.hpp"

namespace {

using namespace pulse::sync;
using pulse_fuzz::FuzzState;

std::string work_folder() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/pulse-fuzz-apply-XXXXXX";
  if (!::mkdtemp(pattern.data())) std::abort();
  return pattern;
}

void write_state(const std::string& path, const FuzzState& state) {
  std::vector<pulse::io::TensorToWrite> tensors;
  for (const auto& t : state)
    tensors.push_back({t.name, pulse::io::parse_dtype(t.dtype), t.shape, t.bytes.data(), t.bytes.size()});
  pulse::io::write_safetensors(path, tensors);
}

std::vector<std::uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<std::uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_all(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  if (!out) std::abort();
}

// The entries of the folder other than the base file.
std::size_t others_in(const std::string& folder, const std::string& base_name) {
  std::size_t n = 0;
  DIR* dir = ::opendir(folder.c_str());
  if (!dir) std::abort();
  while (const dirent* e = ::readdir(dir)) {
    const std::string name = e->d_name;
    if (name != "." && name != ".." && name != base_name) ++n;
  }
  ::closedir(dir);
  return n;
}

// The state digest of the tensors in a safetensors file.
Digest digest_of_file(const std::string& path) {
  const auto file = pulse::io::SafetensorsFile::open(path);
  std::vector<TensorRef> refs;
  for (const auto& t : file.tensors())
    refs.push_back({t.name, pulse::io::dtype_name(t.dtype), t.shape, t.data, t.bytes});
  return state_digest(refs);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const FuzzState base = pulse_fuzz::base_state();
  static const std::string folder = work_folder();
  static const std::string base_path = folder + "/base.safetensors", out_path = folder + "/out.safetensors";
  static const std::vector<std::uint8_t> pristine_base = [] {
    write_state(base_path, base);
    return read_all(base_path);
  }();
  static bool base_is_pristine = true;
  if (size < 2) return 0;

  // The target: the base with the input's changes.
  FuzzState target = base;
  std::size_t at = 2;
  for (unsigned n = data[1] % 64; n > 0 && at + 4 <= size; --n, at += 4) {
    auto& t = target[data[at] % target.size()];
    if (t.bytes.empty() || !is_sparse_dtype(t.dtype)) continue;
    const std::size_t width = pulse::io::dtype_size(pulse::io::parse_dtype(t.dtype));
    const std::size_t element = (std::size_t(data[at + 1]) << 8 | data[at + 2]) % (t.bytes.size() / width);
    std::byte* p = t.bytes.data() + element * width;
    p[0] = std::byte(std::to_integer<unsigned>(p[0]) + data[at + 3]);  // the low byte (little-endian)
    if (data[at + 3] & 1) p[width - 1] ^= std::byte(0x80);              // and the sign, sometimes
  }
  static const std::pair<ValueCoding, IndexCoding> codings[] = {
      {ValueCoding::raw, IndexCoding::gap_fixed},     {ValueCoding::raw, IndexCoding::gap_varint},
      {ValueCoding::keydiff, IndexCoding::gap_fixed}, {ValueCoding::keydiff, IndexCoding::gap_varint},
      {ValueCoding::exponent_class, IndexCoding::exponent_class}};
  static const Compressor compressors[] = {Compressor::none, Compressor::zstd, Compressor::lz4};
  EncodeOptions options;
  options.values = codings[data[0] % 5].first;
  options.indices = codings[data[0] % 5].second;
  options.compressor = compressors[(data[0] / 5) % 3];
  const unsigned threads = 1 + (data[0] / 15) % 2;  // all on this thread, or with a worker
  std::vector<std::uint8_t> patch_bytes = encode_patch(pulse_fuzz::refs(base), pulse_fuzz::refs(target), options);

  // The damage, to the patch or to the base file.
  std::vector<std::uint8_t> base_bytes = pristine_base;
  bool patch_damaged = false, base_damaged = false;
  for (; at + 4 <= size; at += 4) {
    const bool to_patch = data[at] & 1;
    std::vector<std::uint8_t>& bytes = to_patch ? patch_bytes : base_bytes;
    if (data[at + 3] == 0) continue;
    bytes[(std::size_t(data[at + 1]) << 8 | data[at + 2]) % bytes.size()] ^= data[at + 3];
    (to_patch ? patch_damaged : base_damaged) = true;
  }
  if (patch_damaged && patch_bytes.size() > patch_checksum_bytes) {
    const std::size_t end = patch_bytes.size() - patch_checksum_bytes;
    const Digest d = digest_bytes(patch_bytes.data(), end);
    std::memcpy(patch_bytes.data() + end, d.data(), d.size());
  }
  if (base_damaged || !base_is_pristine) write_all(base_path, base_bytes);
  base_is_pristine = !base_damaged;

  ParsedPatch patch;
  try {
    patch = parse_patch(patch_bytes.data(), patch_bytes.size());
  } catch (const pulse::Error&) {
    if (!patch_damaged) __builtin_trap();  // the encoder's own patch refused
    return 0;
  }
  if (!file_apply_fits(base_path, out_path, pulse_fuzz::refs(base), patch)) {
    if (!patch_damaged) __builtin_trap();
    return 0;
  }
  bool applied = false;
  try {
    apply_file(base_path, patch, out_path, threads);
    applied = true;
  } catch (const pulse::Error&) {
  }
  if (!applied) {
    if (!patch_damaged && !base_damaged) __builtin_trap();  // a valid apply refused
    if (others_in(folder, "base.safetensors") != 0) __builtin_trap();  // an output or temporary file left
    return 0;
  }
  // The output holds the target the patch names (the input's target, when undamaged).
  const Digest reached = digest_of_file(out_path);
  if (reached != patch.header.target_state) __builtin_trap();
  if (!patch_damaged && reached != state_digest(pulse_fuzz::refs(target))) __builtin_trap();
  ::unlink(out_path.c_str());
  return 0;
}
