#pragma once
// PULSESync patches broadcast over MPI: every receiver follows every version, so sender and
// receivers keep a change history (sync/change_history.hpp) from the run's start and code with
// expclass-history, the smallest coding; checkpoints keep the history, so a resumed run codes
// the same bytes.
#include <optional>
#include <utility>

#include "comm/communicator.hpp"
#include "sync/change_history.hpp"
#include "train/patch_transport.hpp"

namespace pulse {

// Collective over `sizes` and `patches` (the same ranks, rank 0 sending): the patch's size, then
// its bytes, reach the others, which apply it to `state` (version - 1, of `digests`) in place.
// A receiver with a change history passes it (apply_patch advances it).
ReceivedPatch broadcast_patch(const Communicator& sizes, const Communicator& patches, std::uint64_t version,
                              const std::vector<std::uint8_t>& patch, std::vector<sync::MutableTensor>& state,
                              sync::StateDigests& digests, sync::ChangeHistory* history);

class MpiTransport : public PatchTransport {
 public:
  explicit MpiTransport(const Communicator& sync) : sync_(sync) {}

  void start(std::uint64_t version, const std::vector<sync::TensorRef>& state, const sync::Digest& state_digest) override;
  sync::EncodeOptions coding(std::uint64_t version) const override;
  void encoded(const std::vector<sync::TensorRef>& base, const sync::ChangeSet& changes,
               const sync::StateDigests& target) override;
  void send(std::uint64_t, const sync::EncodedPatch&, const std::vector<sync::TensorRef>&, const sync::Digest&,
            const sync::Digest&) override {}  // deliver broadcasts it
  ReceivedPatch deliver(std::uint64_t version, const std::vector<std::uint8_t>& patch,
                        std::vector<sync::MutableTensor>& state, sync::StateDigests& digests) override;
  void save(RankCheckpoint& state) const override;
  void load(const RankCheckpoint& state) override;

 private:
  Communicator sync_;
  // The history both ends follow since the run's start; one loaded from a checkpoint waits in
  // saved_history_ for start.
  std::optional<sync::ChangeHistory> history_;
  std::optional<std::pair<std::vector<std::uint8_t>, sync::Digest>> saved_history_;
};

}  // namespace pulse
