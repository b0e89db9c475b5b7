#include "train/weight_sync.hpp"

#include <Kokkos_Core.hpp>

#include "comm/agree.hpp"
#include "comm/collectives.hpp"
#include "core/error.hpp"
#include "train/mpi_transport.hpp"
#include "train/relay_transport.hpp"

namespace pulse {

std::vector<sync::TensorRef> bf16_tensor_refs(const TensorTable& table, const std::vector<bf16_bits>& bits) {
  std::vector<sync::TensorRef> refs;
  for (const TensorInfo& t : table.tensors())
    refs.push_back({t.name, "BF16", std::vector<std::int64_t>(t.shape.begin(), t.shape.end()),
                    reinterpret_cast<const std::byte*>(bits.data() + t.offset), std::size_t(t.numel) * 2});
  return refs;
}

namespace {

std::vector<sync::MutableTensor> bf16_mutables(const TensorTable& table, std::vector<bf16_bits>& bits) {
  std::vector<sync::MutableTensor> out;
  for (const TensorInfo& t : table.tensors())
    out.push_back({t.name, "BF16", std::vector<std::int64_t>(t.shape.begin(), t.shape.end()),
                   reinterpret_cast<std::byte*>(bits.data() + t.offset), std::size_t(t.numel) * 2});
  return out;
}

std::unique_ptr<PatchTransport> make_transport(const Communicator& sync, const std::string& relay, int anchor_every,
                                               int keep_anchors) {
  if (relay.empty()) return std::make_unique<MpiTransport>(sync);
  return std::make_unique<RelayTransport>(sync, relay, anchor_every, keep_anchors);
}

}  // namespace

WeightSync::WeightSync(const Communicator& sync, const TensorTable& table, const std::string& relay, int anchor_every,
                       int keep_anchors)
    : sync_(sync), table_(table), transport_(make_transport(sync, relay, anchor_every, keep_anchors)) {}

void WeightSync::bootstrap(std::uint64_t version, std::vector<bf16_bits>& weights) {
  // Over MPI with either transport: receivers start from the sender's bytes, then follow patches.
  broadcast(sync_, as_view(weights.data(), weights.size()), 0, Channel::weights);
  const auto refs = bf16_tensor_refs(table_, weights);
  digests_ = sync::compute_digests(refs);
  have_digests_ = true;
  transport_->start(version, refs, digests_.state);
}

SyncStepStats WeightSync::step(std::uint64_t version, sync::ChangeSet* changes, std::vector<bf16_bits>& weights) {
  PULSE_CHECK(have_digests_, "weight sync: step before bootstrap");
  SyncStepStats stats;
  sync::EncodedPatch patch;
  // The sender's errors (a relay that refuses the version) reach every receiver, which would
  // otherwise wait in deliver.
  agree_on_error(sync_.raw(), [&] {
    if (!is_sender()) return;
    PULSE_CHECK(changes != nullptr, "weight sync: the sender needs the step's change set");
    Kokkos::Timer timer;
    sync::StateDigests target;
    const auto base = bf16_tensor_refs(table_, weights);
    // On this rank's thread, as its training (docs/pulse-train.md, Threads): a step's patch is
    // small against the thread starts of a parallel encode (a tensor's digest is one), and the
    // other cores run the other ranks. The bytes are the same on any number of threads.
    sync::EncodeOptions coding = transport_->coding(version);
    coding.threads = 1;
    patch = sync::encode_change_set(base, *changes, coding, digests_, &target);
    transport_->encoded(base, *changes, target);
    sync::apply_change_set(*changes, weights.data(), weights.size());
    try {
      transport_->send(version, patch, base, digests_.state, target.state);
    } catch (...) {
      sync::revert_change_set(*changes, weights.data(), weights.size());  // this rank still holds version - 1
      throw;
    }
    stats.encode_seconds = timer.seconds();
    stats.patch_bytes = patch.summary.bytes;
    stats.patch_raw_bytes = patch.summary.raw_bytes();
    stats.changed = patch.summary.changed;
    digests_ = std::move(target);
  });
  auto state = bf16_mutables(table_, weights);
  const ReceivedPatch received = transport_->deliver(version, patch.bytes, state, digests_);
  if (!is_sender()) {
    stats.patch_bytes = received.patch_bytes;
    stats.changed = received.changed;
    stats.apply_seconds = received.seconds;
  }
  stats.state = digests_.state;
  return stats;
}

}  // namespace pulse
