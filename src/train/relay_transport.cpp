#include "train/relay_transport.hpp"

#include <Kokkos_Core.hpp>
#include <cstring>
#include <utility>

#include "comm/agree.hpp"
#include "comm/collectives.hpp"
#include "core/error.hpp"
#include "train/mpi_transport.hpp"

namespace pulse {

RelayTransport::RelayTransport(const Communicator& sync, std::string dir, int anchor_every, int keep_anchors)
    : sync_(sync), dir_(std::move(dir)) {
  publish_.anchor_every = anchor_every;
  publish_.keep_anchors = keep_anchors;
}

void RelayTransport::start(std::uint64_t version, const std::vector<sync::TensorRef>& state,
                           const sync::Digest& state_digest) {
  replay_until_ = 0;
  // The sender's relay errors (another run's relay, an unwritable folder) reach every receiver,
  // which would otherwise wait in the broadcast below.
  agree_on_error(sync_.raw(), [&] {
    if (sync_.rank() != 0) return;
    // Temporary files of a killed publisher: the next publish removes them under the relay's lock.
    sync::Relay relay(dir_);
    const auto head = relay.head();
    if (head && head->version >= version) {
      PULSE_CHECK(head->version > version || head->state == state_digest,
                  "relay '" + dir_ + "' holds different weights at version " + std::to_string(version) +
                      " from this run's checkpoint");
      replay_until_ = head->version;
      relay_head_state_ = head->state;
    } else {
      relay.publish(version, state, nullptr, publish_);
    }
  });
  broadcast(sync_, as_view(&replay_until_, 1), 0, Channel::control);
  // The replay is recovery: an uninterrupted run's receivers read these versions from the relay,
  // so its patches go over a communicator of its own, which no step's statistics count.
  replay_.reset();
  if (replay_until_ > version) replay_.emplace(sync_.raw());
}

sync::EncodeOptions RelayTransport::coding(std::uint64_t version) const {
  sync::EncodeOptions options = publish_.encode;
  options.base_version = version - 1;
  options.target_version = version;
  return options;
}

void RelayTransport::send(std::uint64_t version, const sync::EncodedPatch& patch,
                          const std::vector<sync::TensorRef>& state, const sync::Digest& base_state,
                          const sync::Digest& target_state) {
  if (replaying(version)) {
    PULSE_CHECK(version != replay_until_ || target_state == relay_head_state_,
                "weight sync: the resumed run's version " + std::to_string(version) + " differs from the one in relay '" +
                    dir_ + "' (not the same run, or not reproducible)");
    return;  // deliver broadcasts it
  }
  sync::Relay(dir_).publish_encoded(version, state, patch.bytes, base_state, target_state, publish_);
}

ReceivedPatch RelayTransport::deliver(std::uint64_t version, const std::vector<std::uint8_t>& patch,
                                      std::vector<sync::MutableTensor>& state, sync::StateDigests& digests) {
  if (replaying(version)) return broadcast_patch(sync_, *replay_, version, patch, state, digests, nullptr);
  // Only the news that the version is published.
  std::uint64_t news = version;
  broadcast(sync_, as_view(&news, 1), 0, Channel::control);
  if (sync_.rank() == 0) return {};
  Kokkos::Timer timer;
  sync::Relay relay(dir_);
  sync::Checkpoint have;
  for (const sync::MutableTensor& t : state) {
    have.data.emplace_back(t.data, t.data + t.bytes);
    have.layout.push_back({t.name, t.dtype, t.shape, nullptr, t.bytes});
  }
  for (std::size_t i = 0; i < have.layout.size(); ++i) have.layout[i].data = have.data[i].data();
  // pull checks the state it reaches against HEAD's digest.
  const sync::PullResult pulled = relay.pull(&have, version - 1);
  PULSE_CHECK(pulled.version == version, "weight sync: relay head is version " + std::to_string(pulled.version) +
                                             ", expected " + std::to_string(version));
  PULSE_CHECK(pulled.state.layout.size() == state.size(), "weight sync: relay state does not match the model's tensor table");
  for (std::size_t i = 0; i < state.size(); ++i) {
    PULSE_CHECK(pulled.state.layout[i].name == state[i].name && pulled.state.data[i].size() == state[i].bytes,
                "weight sync: relay state does not match the model's tensor table");
    std::memcpy(state[i].data, pulled.state.data[i].data(), state[i].bytes);
  }
  const auto head = relay.head();
  PULSE_CHECK(head && head->version == version, "weight sync: relay head moved past version " + std::to_string(version));
  digests = {};  // the state's alone: a relay receiver codes nothing against its tensors
  digests.state = head->state;
  ReceivedPatch out;
  out.seconds = timer.seconds();
  return out;
}

}  // namespace pulse
