#include "train/mpi_transport.hpp"

#include <Kokkos_Core.hpp>
#include <string>

#include "comm/collectives.hpp"
#include "core/error.hpp"

namespace pulse {

ReceivedPatch broadcast_patch(const Communicator& sizes, const Communicator& patches, std::uint64_t version,
                              const std::vector<std::uint8_t>& patch, std::vector<sync::MutableTensor>& state,
                              sync::StateDigests& digests, sync::ChangeHistory* history) {
  std::uint64_t size = patch.size();
  broadcast(sizes, as_view(&size, 1), 0, Channel::control);
  if (patches.rank() == 0) {
    broadcast(patches, as_view(const_cast<std::uint8_t*>(patch.data()), patch.size()), 0, Channel::patches);
    return {};
  }
  std::vector<std::uint8_t> received(size);
  broadcast(patches, as_view(received.data(), received.size()), 0, Channel::patches);
  // A receiver's error (a corrupt patch) has no collective call left here to miss: pulse-train
  // agrees on it over every rank after the step's publication.
  Kokkos::Timer timer;
  const sync::ParsedPatch parsed = sync::parse_patch(received.data(), received.size());
  PULSE_CHECK(parsed.header.target_version == version, "weight sync: patch to version " +
                                                           std::to_string(parsed.header.target_version) +
                                                           ", expected " + std::to_string(version));
  // apply_patch checks the target digest and leaves the state as it was when it differs. On this
  // rank's thread, as the patch was encoded (WeightSync::step).
  sync::StateDigests target;
  ReceivedPatch out;
  out.changed = sync::apply_patch(parsed, state, {}, &digests, &target, {}, nullptr, history, 1);
  out.patch_bytes = received.size();
  out.seconds = timer.seconds();
  digests = std::move(target);
  return out;
}

void MpiTransport::start(std::uint64_t, const std::vector<sync::TensorRef>& state, const sync::Digest& state_digest) {
  if (saved_history_)
    history_.emplace(state, saved_history_->first, saved_history_->second);
  else
    history_.emplace(state, state_digest);
  saved_history_.reset();
}

sync::EncodeOptions MpiTransport::coding(std::uint64_t version) const {
  PULSE_CHECK(history_.has_value(), "weight sync: a patch before the start");
  sync::EncodeOptions options = sync::exponent_class_history_options(*history_);
  options.base_version = version - 1;
  options.target_version = version;
  return options;
}

void MpiTransport::encoded(const std::vector<sync::TensorRef>& base, const sync::ChangeSet& changes,
                           const sync::StateDigests& target) {
  history_->advance(base, changes, target.state);
}

ReceivedPatch MpiTransport::deliver(std::uint64_t version, const std::vector<std::uint8_t>& patch,
                                    std::vector<sync::MutableTensor>& state, sync::StateDigests& digests) {
  return broadcast_patch(sync_, sync_, version, patch, state, digests, history_ ? &*history_ : nullptr);
}

void MpiTransport::save(RankCheckpoint& state) const {
  if (!history_) return;
  state.add("sync.change_history", io::DType::U8, history_->bytes());
  state.metadata["sync.change_history_digest"] = sync::to_hex(history_->digest());
}

void MpiTransport::load(const RankCheckpoint& state) {
  saved_history_.reset();
  if (state.has("sync.change_history"))
    saved_history_.emplace(state.get<std::uint8_t>("sync.change_history"),  // start checks it against the layout
                           sync::digest_from_hex(state.meta("sync.change_history_digest")));
}

}  // namespace pulse
