#pragma once
// PULSESync in the training loop: trainer 0 sends every new BF16 weight version to the
// inference ranks as a patch coded from the step's change set, over a transport chosen once
// (train/patch_transport.hpp): broadcast over MPI (the sync communicator: trainer 0 as its rank
// 0 plus every inference rank) or published to a relay directory that the inference ranks pull
// from. Every rank holds its version on the host and turns it into the next in place; receivers
// check each version against the patch's target digest. They never receive dense weights except
// once at start (or resume).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "core/tensor_table.hpp"
#include "kernels/types.hpp"
#include "sync/change_set.hpp"
#include "sync/patch.hpp"
#include "train/patch_transport.hpp"
#include "train/rank_checkpoint.hpp"

namespace pulse {

struct SyncStepStats {
  std::uint64_t patch_bytes = 0;      // coded patch as sent (sender) or received over MPI
  std::uint64_t patch_raw_bytes = 0;  // its index, value and whole-tensor streams before compression
  std::uint64_t changed = 0;          // elements the patch writes
  double encode_seconds = 0;          // sender: code the patch, write it into its copy, send it
  double apply_seconds = 0;           // receiver: apply it, the target digest checked
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
  void bootstrap(std::uint64_t version, std::vector<bf16_bits>& weights);
  // Collective: every rank's `weights` hold version - 1 and become `version` in place. The
  // sender passes the change set that makes them so (its new bits; the set then keeps the old
  // ones): the patch is coded from it (sync::encode_change_set) before it is written.
  SyncStepStats step(std::uint64_t version, sync::ChangeSet* changes, std::vector<bf16_bits>& weights);

  // What the transport keeps (the MPI change history) in a checkpoint, and back (before bootstrap).
  void save(RankCheckpoint& state) const { transport_->save(state); }
  void load(const RankCheckpoint& state) { transport_->load(state); }

 private:
  Communicator sync_;
  const TensorTable& table_;
  std::unique_ptr<PatchTransport> transport_;
  sync::StateDigests digests_;  // of the weights this rank holds
  bool have_digests_ = false;
};

}  // namespace pulse
