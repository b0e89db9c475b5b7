#pragma once
// PULSESync in the training loop: trainer rank 0 sends every new BF16 weight version to the
// inference ranks as a patch, either broadcast over MPI (the sync communicator: trainer 0 as its
// rank 0 plus every inference rank) or published to a relay directory that the inference ranks
// pull from. Receivers apply the patch to their BF16 copy and verify the target digest; they
// never receive dense weights except once at start (or resume). Over MPI every receiver follows
// every version, so sender and receivers keep a change history (sync/change_history.hpp) from the
// start and code with expclass-history; checkpoints keep it, so a resumed run codes the same bytes.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "core/tensor_table.hpp"
#include "kernels/types.hpp"
#include "sync/change_history.hpp"
#include "sync/patch.hpp"
#include "sync/relay.hpp"
#include "train/rank_checkpoint.hpp"

namespace pulse {

struct ChangedList;

struct SyncStepStats {
  std::uint64_t patch_bytes = 0;      // coded patch as sent
  std::uint64_t patch_raw_bytes = 0;  // its index and value streams before compression
  std::uint64_t changed = 0;          // elements the patch writes
  double encode_seconds = 0, apply_seconds = 0, verify_seconds = 0;
  bool verified = true;               // receiver's state digest == the patch's target digest
  sync::Digest state{};               // digest of the weights this rank holds afterwards
};

// The BF16 weights as patch tensors, in table order, viewing `bits`.
std::vector<sync::TensorRef> bf16_tensor_refs(const TensorTable& table, const std::vector<bf16_bits>& bits);

class WeightSync {
 public:
  // sync: trainer 0 is rank 0 (the sender), the inference ranks are the others. relay empty:
  // MPI broadcast; else the relay directory, with an anchor every anchor_every versions.
  WeightSync(const Communicator& sync, const TensorTable& table, const std::string& relay, int anchor_every,
             int keep_anchors);

  bool is_sender() const { return sync_.rank() == 0; }
  // Collective: the sender's weights (version) reach every receiver densely (start, resume).
  // With a relay the sender publishes them, unless the relay already holds this version or a
  // newer one (a resumed run): then the relay must hold these weights at this version, and the
  // versions up to its head, which the run makes again bit for bit, go over MPI while the
  // sender checks that they arrive at the relay's head digest; publishing continues after it.
  // The replay's bytes are counted on a communicator of their own, not in the step statistics,
  // so those equal an uninterrupted run's.
  void bootstrap(std::uint64_t version, std::vector<bf16_bits>& weights);
  // Collective: the sender passes versions version-1 (previous) and version (weights); each
  // receiver turns its copy of version-1 into version in place and verifies it.
  SyncStepStats step(std::uint64_t version, const std::vector<bf16_bits>* previous, std::vector<bf16_bits>& weights);
  // As above, the sender also passing the change as AdamW listed it (train/changed_list.hpp:
  // previous with `changes` written is weights): patches that go over MPI are coded from the
  // list (sync::encode_changes, the same bytes) instead of comparing previous and weights.
  SyncStepStats step(std::uint64_t version, const std::vector<bf16_bits>* previous, const ChangedList* changes,
                     std::vector<bf16_bits>& weights);

  // The change history in a checkpoint, and back (before bootstrap, which then continues it).
  void save(RankCheckpoint& state) const;
  void load(const RankCheckpoint& state);

 private:
  Communicator sync_;
  const TensorTable& table_;
  std::string relay_dir_;
  int anchor_every_, keep_anchors_;
  sync::StateDigests digests_;  // of the weights this rank holds
  bool have_digests_ = false;
  // Resumed relay run: versions up to replay_until_ go over MPI; the relay's head digest.
  std::uint64_t replay_until_ = 0;
  sync::Digest relay_head_state_{};
  std::optional<Communicator> replay_;  // a duplicate of sync_ for the replayed patches (uncounted)
  // MPI transport: the history both ends follow since the run's start; one loaded from a
  // checkpoint waits in saved_history_ for bootstrap.
  std::optional<sync::ChangeHistory> history_;
  std::optional<std::pair<std::vector<std::uint8_t>, sync::Digest>> saved_history_;
};

}  // namespace pulse
