#pragma once
// The relay: a directory (shared filesystem or object-store mount) through which trainers
// publish weight versions to inference workers. It holds full anchors every K versions, a
// patch from each version to the next, and a HEAD record naming the newest version and its
// state digest. Every file appears atomically and HEAD is written last, so a reader that
// follows HEAD never sees a partial version.
//   anchor-<v>.safetensors[.zst]   patch-<v-1>-<v>.pulse   HEAD
#include <cstdint>
#include <optional>
#include <string>

#include "sync/checkpoint.hpp"
#include "sync/patch.hpp"

namespace pulse::sync {

struct RelayHead {
  std::uint64_t version = 0;
  Digest state{};
};

struct PublishOptions {
  std::uint64_t anchor_every = 10;  // K: an anchor at every multiple of K (and the first version)
  std::uint64_t keep_anchors = 2;   // N: retention; patches older than the oldest kept anchor go
  bool compress_anchors = false;    // anchor-<v>.safetensors.zst (zstd) instead of plain safetensors
  int anchor_level = 3;
  EncodeOptions encode;             // versions are filled in by publish
};

struct PullResult {
  Checkpoint state;
  std::uint64_t version = 0;
  bool fast_path = false;      // patches only, from the version the receiver had
  std::uint64_t patches_applied = 0;
};

class Relay {
 public:
  explicit Relay(std::string dir);

  std::optional<RelayHead> head() const;

  // Publishes `state` as `version`. A patch is written when the relay's head is version - 1 and
  // `previous` holds that version's weights; an anchor when version % K == 0, when there is no
  // patch, or when the relay is empty. Then HEAD, then retention.
  void publish(std::uint64_t version, const std::vector<TensorRef>& state, const std::vector<TensorRef>* previous,
               const PublishOptions& options);

  // Brings a receiver to the head version: from `have` (at have_version) by patches when the
  // chain is complete (fast path), otherwise from the newest anchor at or before the head
  // (slow path). The result's state digest is checked against HEAD.
  PullResult pull(const Checkpoint* have, std::uint64_t have_version, const PublicKey* public_key = nullptr) const;

  // The anchor file of version v that exists (plain or .zst), or the plain name if none does.
  std::string anchor_path(std::uint64_t v) const;
  std::string patch_path(std::uint64_t from, std::uint64_t to) const;

 private:
  void retain(std::uint64_t newest, std::uint64_t keep_anchors) const;
  std::string dir_;
};

}  // namespace pulse::sync
