#pragma once
// How WeightSync's patches travel from trainer 0 (rank 0 of the sync communicator) to the
// inference ranks: broadcast over MPI (train/mpi_transport.hpp) or published to a relay folder
// that the inference ranks pull from (train/relay_transport.hpp). WeightSync chooses one at
// construction; the transport holds what only it needs (the change history, the relay).
#include <cstdint>
#include <vector>

#include "sync/change_set.hpp"
#include "sync/patch.hpp"
#include "train/rank_checkpoint.hpp"

namespace pulse {

// What a receiver did with a version's patch.
struct ReceivedPatch {
  std::uint64_t patch_bytes = 0;  // read (0 for a version the relay holds only as an anchor)
  std::uint64_t changed = 0;      // elements written
  double seconds = 0;             // to apply it, its digest checked against the target's
};

class PatchTransport {
 public:
  virtual ~PatchTransport() = default;

  // Collective, once the sender's weights of `version` (state, of digest `state_digest`) have
  // reached every receiver densely.
  virtual void start(std::uint64_t version, const std::vector<sync::TensorRef>& state, const sync::Digest& state_digest) = 0;
  // Sender: the coding of the patch to `version` (base and target versions set).
  virtual sync::EncodeOptions coding(std::uint64_t version) const = 0;
  // Sender: the patch to `version` is coded from base and changes (not yet written into base),
  // the target's digests are `target`; the transport follows the change (its history).
  virtual void encoded(const std::vector<sync::TensorRef>& base, const sync::ChangeSet& changes,
                       const sync::StateDigests& target) = 0;
  // Sender: `state` now holds `version`; the patch goes out (a relay publishes it). Errors here
  // reach every receiver: WeightSync agrees on them before deliver.
  virtual void send(std::uint64_t version, const sync::EncodedPatch& patch, const std::vector<sync::TensorRef>& state,
                    const sync::Digest& base_state, const sync::Digest& target_state) = 0;
  // Collective: the patch (the sender's; empty elsewhere) reaches the receivers, each turning its
  // `state` (version - 1, of digests `digests`) into `version` in place and updating `digests`.
  virtual ReceivedPatch deliver(std::uint64_t version, const std::vector<std::uint8_t>& patch,
                                std::vector<sync::MutableTensor>& state, sync::StateDigests& digests) = 0;

  // What the transport keeps across a restart, in a checkpoint, and back (before start).
  virtual void save(RankCheckpoint& state) const = 0;
  virtual void load(const RankCheckpoint& state) = 0;
};

}  // namespace pulse
