#pragma once
// PULSESync patches published to a relay folder (sync/relay.hpp) that the inference ranks pull
// from: the sender publishes each version (an anchor every anchor_every versions) and tells the
// receivers over MPI only that it is there. Patches use the relay's own coding (what pulse-sync
// publish writes and pulse-measure sizes). A resumed run whose relay already holds newer
// versions makes them again bit for bit: those go over MPI (a communicator of their own, which
// no step's statistics count, so those equal an uninterrupted run's) until the relay's head,
// which they must reach at its digest; publishing continues after it.
#include <optional>
#include <string>

#include "comm/communicator.hpp"
#include "sync/relay.hpp"
#include "train/patch_transport.hpp"

namespace pulse {

class RelayTransport : public PatchTransport {
 public:
  RelayTransport(const Communicator& sync, std::string dir, int anchor_every, int keep_anchors);

  void start(std::uint64_t version, const std::vector<sync::TensorRef>& state, const sync::Digest& state_digest) override;
  sync::EncodeOptions coding(std::uint64_t version) const override;
  void encoded(const std::vector<sync::TensorRef>&, const sync::ChangeSet&, const sync::StateDigests&) override {}
  void send(std::uint64_t version, const sync::EncodedPatch& patch, const std::vector<sync::TensorRef>& state,
            const sync::Digest& base_state, const sync::Digest& target_state) override;
  ReceivedPatch deliver(std::uint64_t version, const std::vector<std::uint8_t>& patch,
                        std::vector<sync::MutableTensor>& state, sync::StateDigests& digests) override;
  void save(RankCheckpoint&) const override {}  // the relay folder is the record
  void load(const RankCheckpoint&) override {}

 private:
  bool replaying(std::uint64_t version) const { return version <= replay_until_; }

  Communicator sync_;
  std::string dir_;
  sync::PublishOptions publish_;
  // Resumed run: versions up to replay_until_ go over MPI; the relay's head digest.
  std::uint64_t replay_until_ = 0;
  sync::Digest relay_head_state_{};
  std::optional<Communicator> replay_;  // a duplicate of sync_ for the replayed patches (uncounted)
};

}  // namespace pulse
