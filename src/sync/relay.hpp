#pragma once
// The relay: a directory (shared filesystem or object-store mount) through which trainers
// publish weight versions to inference workers. It holds full anchors every K versions (each
// with a record of its digest), a patch from each version to the next, and a HEAD record naming
// the newest version, its state digest and the version it follows. Every file appears
// atomically and HEAD is written last, so a reader that follows HEAD never sees a partial
// version. File names follow an exact grammar (sync/relay_names.hpp); anything else in the
// folder is ignored and never deleted. Publishing a signed relay (a signing key in the encode
// options) signs HEAD, anchor records and patches; a reader given the public key accepts nothing
// unsigned. One publisher at a time: publish takes publish.lock (O_EXCL, naming its owner).
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "sync/checkpoint.hpp"
#include "sync/patch.hpp"
#include "sync/relay_record.hpp"

namespace pulse::sync {

struct PublishOptions {
  std::uint64_t anchor_every = 10;  // K: an anchor at every multiple of K (and the first version)
  std::uint64_t keep_anchors = 2;   // N: retention; patches older than the oldest kept anchor go
  bool compress_anchors = false;    // anchor-<v>.safetensors.zst (zstd) instead of plain safetensors
  int anchor_level = 3;
  EncodeOptions encode;             // versions are filled in by publish; signing_key signs everything
};

struct PullOptions {
  const PublicKey* public_key = nullptr;  // accept only HEAD, anchor records and patches it signed
  std::uint64_t min_version = 0;          // never move to an older version (rollback protection)
};

struct PullResult {
  Checkpoint state;
  std::uint64_t version = 0;
  bool fast_path = false;      // patches only, from the version the receiver had
  std::uint64_t patches_applied = 0;
  std::uint64_t anchor = 0;    // slow path: the anchor version it started from
  std::string fallback;        // why a faster way failed, when one did ("" otherwise)
  bool folder = false;         // pull_into: the state was written as a model folder
};

// The largest patch file a receiver holding `state` reads: per BF16 element at most a 10-byte
// index gap and 2 value bytes (12 bytes per 2), whole tensors once, plus the entry table's limit.
std::uint64_t patch_bytes_limit(const std::vector<TensorRef>& state);

class Relay {
 public:
  explicit Relay(std::string dir);

  // HEAD, nullopt when nothing is published; with a key, only a HEAD it signed.
  std::optional<RelayHead> head(const PublicKey* public_key = nullptr) const;

  // Publishes `state` as `version`. A patch is written when the relay's head is version - 1 and
  // `previous` holds that version's weights; an anchor (and its record) when version % K == 0,
  // when there is no patch, or when the relay has no anchor. Then HEAD, then retention. Holds
  // publish.lock throughout; a second publisher gets a one-line error naming the holder.
  void publish(std::uint64_t version, const std::vector<TensorRef>& state, const std::vector<TensorRef>* previous,
               const PublishOptions& options);
  // The same for a state with metadata (a checkpoint's __metadata__; a model folder in flat
  // form, whose anchor is one safetensors file holding its files as U8 tensors, see FORMAT.md).
  // Tensors whose data is null are read by their state's loader (sync/streamed_state.hpp), one
  // at a time: the patch is encoded and the anchor written (zstd streaming for .zst) holding a
  // tensor of each state and the patch, not the model; the anchor is refused unless the digest
  // of the bytes written is the state's.
  void publish(std::uint64_t version, const std::vector<TensorRef>& state, const Metadata& metadata,
               const std::vector<TensorRef>* previous, const Metadata* previous_metadata, const PublishOptions& options,
               const TensorLoader& state_loader = {}, const TensorLoader& previous_loader = {});

  // Publishes `state` as `version` with a patch from the head version that the caller encoded
  // (options.encode's coding, base and target versions version - 1 and version: the bytes the
  // publish above would write, e.g. encode_change_set's) between states of digests base_state
  // (which must be the head's) and target_state: the previous version is neither needed nor
  // hashed again. A relay whose head is not version - 1 gets an anchor only.
  void publish_encoded(std::uint64_t version, const std::vector<TensorRef>& state, const std::vector<std::uint8_t>& patch,
                       const Digest& base_state, const Digest& target_state, const PublishOptions& options);

  // Brings a receiver to the head version: from `have` (at have_version) by patches (fast path),
  // and if that fails from the newest anchor at or before the head, then each older one (slow
  // path). The result's state digest is checked against HEAD. A receiver with `have` never moves
  // below have_version, nor below options.min_version.
  PullResult pull(const Checkpoint* have, std::uint64_t have_version, const PullOptions& options = {}) const;
  // The same pull, written to `out` (a .safetensors file or a model folder, as save_state names
  // it) instead of held in memory, from the receiver's checkpoint at the path `have` ("" for
  // none): patches go through the streamed apply (sync/file_apply.hpp), anchors and unpatched
  // states through the streamed writer (sync/streamed_save.hpp), .zst anchors are decompressed
  // in pieces. Memory: a patch and a few tensors, not the model. The versions between the
  // start and HEAD, and a decompressed anchor, go to a scratch folder next to out
  // (".<name>.pulse-pull.XXXXXX", removed after; a killed puller's is removed by the next pull).
  // out appears, or is replaced under `replace`, only with HEAD's digest verified; result.state
  // stays empty. A patch that changes the layout, the metadata or a folder's index, and a
  // compressed `have`, load that step's state whole.
  PullResult pull_into(const std::string& out, const std::string& have, std::uint64_t have_version,
                       const PullOptions& options, ReplaceFolder replace, unsigned threads) const;

  // The anchor file of version v that exists (plain or .zst), or the plain name if none does.
  std::string anchor_path(std::uint64_t v) const;
  std::string patch_path(std::uint64_t from, std::uint64_t to) const;

 private:
  struct MadePatch {
    std::vector<std::uint8_t> bytes;
    Digest target_state;
  };
  // publish's steps under the lock; make_patch, given the head when it is version - 1, makes the
  // patch from it (or nullopt: none).
  void publish_locked(std::uint64_t version, const std::vector<TensorRef>& state, const Metadata& metadata,
                      const PublishOptions& options, const TensorLoader& state_loader,
                      const std::function<std::optional<MadePatch>(const RelayHead& head)>& make_patch);
  void retain(std::uint64_t keep_anchors) const;
  // Publishing keeps the relay's signer: a signed relay only with its key, an unsigned one unsigned.
  void check_same_signer(const RelayHead& current, const SecretKey* key) const;
  // With a key: HEAD of format 2, and every anchor record signed by the key and naming HEAD's relay.
  void check_records(const RelayHead& head, const PublicKey& key) const;
  void remove_temporary_files() const;
  std::vector<std::uint64_t> anchor_versions() const;
  // HEAD (with its checks: key, floor, records), and the anchors at or before it, newest last.
  RelayHead checked_head(std::uint64_t floor, const PullOptions& options) const;
  std::vector<std::uint64_t> anchors_up_to(std::uint64_t version) const;
  // Anchor v's record (when there is one, or a key requires it), checked against HEAD, and the
  // bound on its state's bytes that a format-2 record gives (0: none).
  std::optional<AnchorRecord> checked_record(std::uint64_t v, const RelayHead& head, const PullOptions& options,
                                             std::uint64_t& max_state_bytes) const;
  // The walk of pull and pull_into, which differ only in where the state goes (its two sinks):
  // from the receiver's state (when have_layout is given) by from_have, then from each anchor at
  // or before HEAD, newest first, by from_anchor (given the anchor's checked record and the bound
  // on its state's bytes). Each failure is added to result.fallback; the first way that reaches
  // HEAD returns.
  using FromHave = std::function<void(PullResult&)>;
  using FromAnchor = std::function<void(std::uint64_t v, const std::optional<AnchorRecord>& record,
                                        std::uint64_t max_state_bytes, PullResult&)>;
  PullResult walk_to_head(const RelayHead& head, const PullOptions& options, const std::vector<TensorRef>* have_layout,
                          const FromHave& from_have, const FromAnchor& from_anchor) const;
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::string dir_;
};

}  // namespace pulse::sync
