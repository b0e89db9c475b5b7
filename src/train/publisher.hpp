#pragma once
// The publisher role of pulse-train: the versions of the BF16 weights a rank holds on the host
// (newest last, as many as rollouts with async_lag may still be sampled from) and PULSESync
// between them: trainer 0 sends each new version as a patch (WeightSync) and the inference ranks
// turn their copy into it. The newest version is updated in place; with async_lag the versions
// before it are copies. The other trainers only count versions, and keep them (copied from the
// device) when they generate rollouts themselves (no inference ranks) from older versions
// (async_lag > 0).
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "core/tensor_table.hpp"
#include "sync/change_set.hpp"
#include "train/rank_checkpoint.hpp"
#include "train/train_config.hpp"
#include "train/transfer_counter.hpp"
#include "train/weight_sync.hpp"

namespace pulse {

// trainer 0 | an inference rank | any other trainer
enum class SyncRole { sender, receiver, trainer };

// What publishing a version came to on this rank.
struct Publication {
  SyncStepStats sync;  // the WeightSync step's (sender, receivers); sync.state there: the digest
                       // of the weights this rank now holds (zero on the other trainers: none hashed)
  double seconds = 0;       // in the WeightSync step
  double wait_seconds = 0;  // of those, in collective calls (waiting for the peers, the patch's send)
};

class Publisher {
 public:
  // sync: trainer 0 as rank 0 and the inference ranks (unused by the other trainers).
  // keep_versions: a trainer (not trainer 0) that samples rollouts keeps the versions too.
  Publisher(const Communicator& sync, const TensorTable& table, const TrainConfig& c, SyncRole role,
            bool keep_versions);

  // Collective over the sync ranks: trainer 0's weights reach the inference ranks densely.
  // weights: a trainer's BF16 weights of the current version (the inference ranks' are replaced).
  // A fresh run remembers them as its first version; a resumed inference rank checks that they
  // are the newest version of its checkpoint.
  void start(std::vector<bf16_bits> weights, bool resumed);

  // Collective over the sync ranks: the next version. Trainer 0 passes the step's change set
  // (null elsewhere), codes the patch from it and writes it into its copy; inference ranks apply
  // the patch to theirs; the other trainers copy `trainer_weights` to the host only when they
  // keep versions.
  Publication publish(sync::ChangeSet* changes, const Kokkos::View<const bf16_bits*>& trainer_weights,
                      TransferCounter& copies);

  std::uint64_t version() const { return version_; }
  // Host BF16 weights of a version still kept.
  const std::vector<bf16_bits>& version_weights(std::uint64_t version) const;

  // The version and the kept versions in a checkpoint, and back.
  void save(RankCheckpoint& state) const;
  void load(const RankCheckpoint& state);

 private:
  void remember_version(std::vector<bf16_bits> weights);
  // The newest version, ready to become the next in place: with async_lag, a copy of it goes
  // behind it first (into the oldest kept version's buffer).
  std::vector<bf16_bits>& next_version();

  const TensorTable& table_;
  SyncRole role_;
  bool keep_versions_;
  std::size_t versions_kept_;  // async_lag + 1
  std::unique_ptr<WeightSync> weight_sync_;  // sender and receivers
  std::deque<std::vector<bf16_bits>> history_;  // oldest first
  std::uint64_t version_ = 0;
};

}  // namespace pulse
