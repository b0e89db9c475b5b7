// libFuzzer entry: the input is a whole PULSESync patch. parse_patch must accept it or throw
// pulse::Error; an accepted patch is applied to a fixed receiver state (patch_fuzz_state.hpp),
// which must also accept it or throw pulse::Error, with the receiver's change history for
// expclass-history patches (and for every third other input). A crash, a sanitizer report or any
// other exception escaping is a bug, and so is a broken receiving contract:
//  - after a rejected apply the state and the history are as before (transactional);
//  - after an accepted apply the state's digest is the patch's target state digest.
// Built twice: fuzz_patch_decoder takes the input as it is (mutations mostly end at the
// checksum), fuzz_patch_decoder_rechecksummed (PULSE_FUZZ_RECHECKSUM) first rewrites the
// xxh3-128 checksum over the mutated bytes, so mutations reach the stream decoders and apply.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/error.hpp"
#include "patch_fuzz_state.hpp"
#include "sync/change_history.hpp"
#include "coding/digest.hpp"
#include "sync/patch.hpp"

namespace {

using namespace pulse::sync;
using pulse_fuzz::FuzzState;

constexpr std::size_t kFixedHeaderBytes = patch_fixed_header_bytes, kChecksumBytes = patch_checksum_bytes,
                      kSignatureBytes = patch_signature_bytes;

bool same_bytes(const FuzzState& a, const FuzzState& b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].bytes != b[i].bytes) return false;
  return true;
}

#ifdef PULSE_FUZZ_RECHECKSUM
// The checksum sits before the signature when flag bit 0 says signed, else at the end.
void rechecksum(std::vector<std::uint8_t>& bytes) {
  if (bytes.size() < kFixedHeaderBytes + kChecksumBytes) return;
  const bool is_signed = bytes[10] & 1;
  if (is_signed && bytes.size() < kFixedHeaderBytes + kChecksumBytes + kSignatureBytes) return;
  const std::size_t at = bytes.size() - kChecksumBytes - (is_signed ? kSignatureBytes : 0);
  const Digest d = digest_bytes(bytes.data(), at);
  std::memcpy(bytes.data() + at, d.data(), d.size());
}
#endif

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static FuzzState state = pulse_fuzz::base_state();
  static const FuzzState pristine = state;
  static std::vector<MutableTensor> receiver = pulse_fuzz::mutables(state);  // points into state
  static const StateDigests base_digests = compute_digests(pulse_fuzz::refs(pristine));
  static const KeyPair keys = pulse_fuzz::signing_keys();
  static const ChangeHistory pristine_history = pulse_fuzz::base_history(pristine);

  std::vector<std::uint8_t> copy(data, data + size);  // an exact-size heap buffer for ASan
#ifdef PULSE_FUZZ_RECHECKSUM
  rechecksum(copy);
#endif
  ParsedPatch patch;
  try {
    patch = parse_patch(copy.data(), copy.size());
  } catch (const pulse::Error&) {
    return 0;
  }
  if (patch.header.is_signed) {  // the signature check runs too; only the seed's verifies
    try {
      parse_patch(copy.data(), copy.size(), {}, &keys.public_key);
    } catch (const pulse::Error&) {
    }
  }

  // Both receiver paths: hashing the base here, or the digests a previous apply returned.
  const bool cached = size % 2 == 1;
  const bool with_history = patch.header.values == ValueCoding::exponent_class_history || size % 3 == 0;
  ChangeHistory history = pristine_history;
  StateDigests after;
  bool applied = false;
  try {
    apply_patch(patch, receiver, {}, cached ? &base_digests : nullptr, &after, {}, nullptr,
                with_history ? &history : nullptr);
    applied = true;
  } catch (const pulse::Error&) {
  }
  if (!applied) {
    if (!same_bytes(state, pristine)) __builtin_trap();  // a rejected patch changed the weights
    if (history.bytes() != pristine_history.bytes() || history.digest() != pristine_history.digest())
      __builtin_trap();  // ... or the history
    return 0;
  }
  const Digest reached = state_digest(pulse_fuzz::refs(state));
  if (reached != patch.header.target_state || after.state != reached) __builtin_trap();
  for (std::size_t i = 0; i < state.size(); ++i) {
    const auto it = after.tensors.find(state[i].name);
    if (it == after.tensors.end() || it->second != tensor_digest(pulse_fuzz::refs(state)[i])) __builtin_trap();
    if (!state[i].bytes.empty())  // restore
      std::memcpy(state[i].bytes.data(), pristine[i].bytes.data(), state[i].bytes.size());
  }
  return 0;
}
