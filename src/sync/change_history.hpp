#pragma once
// What a receiver that followed every version since a common start (the origin) knows of each
// element's past: how many versions ago it last changed and which way. Training moves a weight
// the same way for many steps (AdamW's momentum), so the direction of its next change follows
// its last one (small default run: 90% the same way one version later, 57% after 17 or more): the coding
// `expclass-history` (exponent_class_coding.hpp) codes the sign of each change in the context
// of its element's history. Sender and receiver advance their histories with every version, and
// a digest names the versions a history followed, so a patch coded against one history is never
// decoded against another. Integer-only.
//
// One byte per element of each tensor of a sparse-coded dtype: 0 never changed since the origin;
// else bit 7 set when the last change lowered the element's key (its value), and bits 0-6 the
// versions since that change (1: the latest version; saturating at 127).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "coding/digest.hpp"
#include "sync/sparse_format.hpp"

namespace pulse::sync {

struct ChangeSet;
struct TensorChanges;

class ChangeHistory {
 public:
  static constexpr std::uint8_t kLowered = 0x80, kMaxAge = 127;
  static unsigned age(std::uint8_t h) { return h & kMaxAge; }  // 0: never changed
  static bool lowered(std::uint8_t h) { return h & kLowered; }
  // Age buckets: 1, 2, 3-4, 5-8, 9-16, 17 or more (and never, which has age 0: bucket 0 too).
  static constexpr unsigned kBuckets = 6;
  static unsigned bucket(unsigned age) {
    return age <= 2 ? (age == 0 ? 0 : age - 1) : age <= 4 ? 2 : age <= 8 ? 3 : age <= 16 ? 4 : 5;
  }
  // The context of an element's next sign: 0 never changed, else direction and age bucket.
  static constexpr unsigned kSignContexts = 1 + 2 * kBuckets;
  static unsigned sign_context(std::uint8_t h) {
    return h == 0 ? 0 : 1 + (lowered(h) ? kBuckets : 0) + bucket(age(h));
  }

  // Starts at a state (its tensors, and its state digest): every element never changed.
  ChangeHistory(const std::vector<TensorRef>& origin, const Digest& origin_state);
  // A history saved with bytes() and digest() over the same layout; throws pulse::Error when
  // the bytes do not fit the layout.
  ChangeHistory(const std::vector<TensorRef>& layout, const std::vector<std::uint8_t>& bytes, const Digest& digest);

  // Names the origin and every version followed since (a chain of their state digests).
  const Digest& digest() const { return digest_; }
  // One byte per element of a tracked tensor (a sparse-coded dtype), or nullptr.
  const std::uint8_t* of(const std::string& name) const;
  // The tracked tensors' bytes, in name order (what the layout constructor takes back).
  std::vector<std::uint8_t> bytes() const;

  // One version on: age() every element, then write changed() at each of the version's changes
  // (into marks()), then seal() with the new version's state digest.
  void age();
  // A tracked tensor's bytes to mark; throws pulse::Error when it is not tracked.
  std::uint8_t* marks(const std::string& name);
  // The byte of an element that changed in the latest version from key old_key to new_key
  // (sparse_format.hpp).
  static std::uint8_t changed(std::uint64_t old_key, std::uint64_t new_key) {
    return std::uint8_t((new_key < old_key ? kLowered : 0) | 1);
  }
  // Writes changed() at each of n elements whose value differs from `before` to `after`.
  static void mark_differences(std::uint8_t* marks, const SparseFormat& format, const std::byte* before,
                               const std::byte* after, std::uint64_t n);
  void seal(const Digest& target_state);

  // All three for a sender: `changes` (as encode_changes takes them) turn base into the state
  // of digest target_state...
  void advance(const std::vector<TensorRef>& base, const std::vector<TensorChanges>& changes, const Digest& target_state);
  // ...or a change set (as encode_change_set takes it, with the same base), unapplied...
  void advance(const std::vector<TensorRef>& base, const ChangeSet& changes, const Digest& target_state);
  // ...or base into target, the same layout, compared element by element.
  void advance(const std::vector<TensorRef>& base, const std::vector<TensorRef>& target, const Digest& target_state);

 private:
  std::map<std::string, std::vector<std::uint8_t>> tensors_;
  Digest digest_{};
};

}  // namespace pulse::sync
