#include "train/weight_sync.hpp"

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstring>
#include <filesystem>

#include "comm/agree.hpp"
#include "comm/collectives.hpp"
#include "core/error.hpp"
#include "core/file_read.hpp"
#include "coding/digest.hpp"
#include "train/changed_list.hpp"

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

sync::Checkpoint as_checkpoint(const TensorTable& table, const std::vector<bf16_bits>& bits) {
  sync::Checkpoint c;
  for (const sync::TensorRef& r : bf16_tensor_refs(table, bits)) {
    c.data.emplace_back(r.data, r.data + r.bytes);
    c.layout.push_back(r);
  }
  for (std::size_t i = 0; i < c.layout.size(); ++i) c.layout[i].data = c.data[i].data();
  return c;
}

// The list's changes per tensor of the table, with indices within the tensor.
std::vector<sync::TensorChanges> tensor_changes(const TensorTable& table, const ChangedList& list) {
  std::vector<sync::TensorChanges> out;
  for (const TensorInfo& t : table.tensors()) {
    const auto begin = std::lower_bound(list.indices.begin(), list.indices.end(), index_t(t.offset));
    const auto end = std::lower_bound(begin, list.indices.end(), index_t(t.offset + t.numel));
    if (begin == end) continue;
    sync::TensorChanges c{t.name, {}, {}};
    for (auto it = begin; it != end; ++it) {
      c.indices.push_back(*it - index_t(t.offset));
      c.new_bits.push_back(list.values[std::size_t(it - list.indices.begin())]);
    }
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

WeightSync::WeightSync(const Communicator& sync, const TensorTable& table, const std::string& relay, int anchor_every,
                       int keep_anchors)
    : sync_(sync), table_(table), relay_dir_(relay), anchor_every_(anchor_every), keep_anchors_(keep_anchors) {}

void WeightSync::bootstrap(std::uint64_t version, std::vector<bf16_bits>& weights) {
  replay_until_ = 0;
  // The sender's relay errors (another run's relay, an unwritable folder) reach every receiver,
  // which would otherwise wait in the broadcast below.
  agree_on_error(sync_.raw(), [&] {
    if (relay_dir_.empty() || !is_sender()) return;
    // Temporary files of a killed publisher: the next publish removes them under the relay's lock.
    sync::Relay relay(relay_dir_);
    const auto head = relay.head();
    if (head && head->version >= version) {
      PULSE_CHECK(head->version > version || head->state == sync::compute_digests(bf16_tensor_refs(table_, weights)).state,
                  "relay '" + relay_dir_ + "' holds different weights at version " + std::to_string(version) +
                      " from this run's checkpoint");
      replay_until_ = head->version;
      relay_head_state_ = head->state;
    } else {
      sync::PublishOptions options;
      options.anchor_every = anchor_every_;
      options.keep_anchors = keep_anchors_;
      relay.publish(version, bf16_tensor_refs(table_, weights), nullptr, options);
    }
  });
  broadcast(sync_, as_view(&replay_until_, 1), 0, Channel::control);
  // The replay is recovery: an uninterrupted run's receivers read these versions from the relay,
  // so its patches go over a communicator of its own, which no step's statistics count.
  replay_.reset();
  if (replay_until_ > version) replay_.emplace(sync_.raw());
  // Over MPI even with a relay: receivers start from the sender's bytes, then follow patches.
  broadcast(sync_, as_view(weights.data(), weights.size()), 0, Channel::weights);
  digests_ = sync::compute_digests(bf16_tensor_refs(table_, weights));
  have_digests_ = true;
  if (relay_dir_.empty()) {
    const auto refs = bf16_tensor_refs(table_, weights);
    if (saved_history_)
      history_.emplace(refs, saved_history_->first, saved_history_->second);
    else
      history_.emplace(refs, digests_.state);
  }
  saved_history_.reset();
}

void WeightSync::save(RankCheckpoint& state) const {
  if (!history_) return;
  state.add("sync.change_history", io::DType::U8, history_->bytes());
  state.metadata["sync.change_history_digest"] = sync::to_hex(history_->digest());
}

void WeightSync::load(const RankCheckpoint& state) {
  saved_history_.reset();
  if (state.has("sync.change_history"))
    saved_history_.emplace(state.get<std::uint8_t>("sync.change_history", table_.num_elements()),
                           sync::digest_from_hex(state.meta("sync.change_history_digest")));
}

SyncStepStats WeightSync::step(std::uint64_t version, const std::vector<bf16_bits>* previous,
                               std::vector<bf16_bits>& weights) {
  return step(version, previous, nullptr, weights);
}

SyncStepStats WeightSync::step(std::uint64_t version, const std::vector<bf16_bits>* previous,
                               const ChangedList* changes, std::vector<bf16_bits>& weights) {
  PULSE_CHECK(have_digests_, "weight sync: step before bootstrap");
  SyncStepStats stats;
  std::vector<std::uint8_t> patch;
  std::uint64_t size = 0;
  const bool replaying = !relay_dir_.empty() && version <= replay_until_;
  const bool over_mpi = relay_dir_.empty() || replaying;
  // The sender's errors (a relay that refuses the version) reach every receiver, which would
  // otherwise wait in the broadcast below.
  agree_on_error(sync_.raw(), [&] {
    if (!is_sender()) return;
    PULSE_CHECK(previous != nullptr, "weight sync: the sender needs the previous version");
    Kokkos::Timer timer;
    // Over MPI the smallest coding, against the change history; with a relay the relay's own
    // (what pulse-sync publish writes and pulse-measure sizes), for the published versions and
    // for their replay after a resume.
    sync::EncodeOptions options = history_ ? sync::exponent_class_history_options(*history_) : sync::PublishOptions{}.encode;
    options.base_version = version - 1;
    options.target_version = version;
    sync::StateDigests target;
    const auto base_refs = bf16_tensor_refs(table_, *previous);
    const auto target_refs = bf16_tensor_refs(table_, weights);
    if (over_mpi) {
      const std::vector<sync::TensorChanges> listed = changes ? tensor_changes(table_, *changes) : std::vector<sync::TensorChanges>{};
      patch = changes ? sync::encode_changes(base_refs, listed, options, digests_, &target)
                      : sync::encode_patch(base_refs, target_refs, options, &digests_, &target);
      if (history_ && changes) history_->advance(base_refs, listed, target.state);
      if (history_ && !changes) history_->advance(base_refs, target_refs, target.state);
      PULSE_CHECK(version != replay_until_ || target.state == relay_head_state_,
                  "weight sync: the resumed run's version " + std::to_string(version) +
                      " differs from the one in relay '" + relay_dir_ + "' (not the same run, or not reproducible)");
    } else {
      sync::PublishOptions publish;
      publish.anchor_every = anchor_every_;
      publish.keep_anchors = keep_anchors_;
      publish.encode = options;
      sync::Relay relay(relay_dir_);
      relay.publish(version, target_refs, &base_refs, publish);
      target = sync::compute_digests(target_refs);
      const std::string path = relay.patch_path(version - 1, version);
      std::error_code ec;
      if (std::filesystem::exists(path, ec))  // an anchor-only version has no patch file; report its size as 0
        patch = read_regular_file(path, sync::patch_bytes_limit(target_refs), "patch");
    }
    stats.encode_seconds = timer.seconds();
    if (!patch.empty()) {
      const sync::ParsedPatch parsed = sync::parse_patch(patch.data(), patch.size());
      stats.patch_raw_bytes = parsed.header.index_stream.raw + parsed.header.value_stream.raw +
                              parsed.header.whole_stream.raw;
      stats.changed = parsed.header.total_changed;
    }
    stats.patch_bytes = patch.size();
    digests_ = target;
    stats.state = target.state;
    size = over_mpi ? patch.size() : version;
  });
  // MPI: the patch itself; relay: only the news that the version is published.
  broadcast(sync_, as_view(&size, 1), 0, Channel::control);
  if (over_mpi) {
    if (!is_sender()) patch.resize(size);
    broadcast(replaying ? *replay_ : sync_, as_view(patch.data(), patch.size()), 0, Channel::patches);
  }
  // A receiver's error (a corrupt patch, a relay that fails it) has no collective call left
  // here to miss: pulse-train agrees on it over every rank after the step's publication.
  if (is_sender()) return stats;

  Kokkos::Timer timer;
  sync::StateDigests target;
  if (over_mpi) {
    const sync::ParsedPatch parsed = sync::parse_patch(patch.data(), patch.size());
    PULSE_CHECK(parsed.header.target_version == version, "weight sync: patch to version " +
                                                             std::to_string(parsed.header.target_version) +
                                                             ", expected " + std::to_string(version));
    auto state = bf16_mutables(table_, weights);
    stats.changed = sync::apply_patch(parsed, state, {}, &digests_, &target, {}, nullptr, history_ ? &*history_ : nullptr);
    stats.patch_bytes = patch.size();
    stats.apply_seconds = timer.seconds();
    timer.reset();
    // The digest apply_patch derived from the tensors it hashed, against the sender's record.
    stats.verified = target.state == parsed.header.target_state;
  } else {
    sync::Relay relay(relay_dir_);
    const sync::Checkpoint have = as_checkpoint(table_, weights);
    sync::PullResult pulled = relay.pull(&have, version - 1);
    PULSE_CHECK(pulled.version == version, "weight sync: relay head is version " + std::to_string(pulled.version) +
                                               ", expected " + std::to_string(version));
    for (std::size_t i = 0; i < pulled.state.layout.size(); ++i) {
      const TensorInfo& t = table_.tensors().at(i);
      PULSE_CHECK(pulled.state.layout[i].name == t.name && pulled.state.data[i].size() == std::size_t(t.numel) * 2,
                  "weight sync: relay state does not match the model's tensor table");
      std::memcpy(weights.data() + t.offset, pulled.state.data[i].data(), pulled.state.data[i].size());
    }
    stats.apply_seconds = timer.seconds();
    timer.reset();
    target = sync::compute_digests(bf16_tensor_refs(table_, weights));
    stats.verified = relay.head().has_value() && relay.head()->state == target.state;
  }
  stats.verify_seconds = timer.seconds();
  digests_ = target;
  stats.state = target.state;
  return stats;
}

}  // namespace pulse
