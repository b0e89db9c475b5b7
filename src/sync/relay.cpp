#include "sync/relay.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <vector>

#include "core/atomic_file.hpp"
#include "core/error.hpp"

namespace fs = std::filesystem;

namespace pulse::sync {

namespace {

std::vector<std::uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  PULSE_CHECK(in, "relay: cannot read " + path);
  return std::vector<std::uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Versions of the anchors present, ascending.
std::vector<std::uint64_t> anchor_versions(const std::string& dir) {
  std::vector<std::uint64_t> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    std::uint64_t v;
    char tail[32];
    if (std::sscanf(name.c_str(), "anchor-%lu.%31s", &v, tail) == 2 &&
        (std::string(tail) == "safetensors" || std::string(tail) == "safetensors.zst"))
      out.push_back(v);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

Relay::Relay(std::string dir) : dir_(std::move(dir)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  PULSE_CHECK(fs::is_directory(dir_), "relay: " + dir_ + " is not a folder");
}

std::string Relay::anchor_path(std::uint64_t v) const {
  const std::string plain = dir_ + "/anchor-" + std::to_string(v) + ".safetensors";
  return fs::exists(plain + ".zst") ? plain + ".zst" : plain;
}
std::string Relay::patch_path(std::uint64_t from, std::uint64_t to) const {
  return dir_ + "/patch-" + std::to_string(from) + "-" + std::to_string(to) + ".pulse";
}

std::optional<RelayHead> Relay::head() const {
  std::ifstream in(dir_ + "/HEAD");
  if (!in) return std::nullopt;
  std::string key, hex;
  RelayHead h;
  in >> key >> h.version >> hex;
  PULSE_CHECK(in && key == "version", "relay: " + dir_ + "/HEAD is malformed");
  h.state = digest_from_hex(hex);
  return h;
}

void Relay::publish(std::uint64_t version, const std::vector<TensorRef>& state, const std::vector<TensorRef>* previous,
                    const PublishOptions& options) {
  PULSE_CHECK(options.anchor_every >= 1 && options.keep_anchors >= 1, "relay: anchor_every and keep_anchors must be >= 1");
  const auto current = head();
  PULSE_CHECK(!current || version > current->version,
              "relay: version " + std::to_string(version) + " is not newer than the head " + std::to_string(current->version));
  bool wrote_patch = false;
  if (current && previous && current->version + 1 == version) {
    PULSE_CHECK(state_digest(*previous) == current->state,
                "relay: the previous weights given are not the relay's head version " + std::to_string(current->version));
    EncodeOptions enc = options.encode;
    enc.base_version = current->version;
    enc.target_version = version;
    const auto patch = encode_patch(*previous, state, enc);
    write_file_atomically(patch_path(current->version, version), patch.data(), patch.size());
    wrote_patch = true;
  }
  if (!wrote_patch || version % options.anchor_every == 0 || anchor_versions(dir_).empty()) {
    Checkpoint anchor;
    anchor.layout = state;
    for (const auto& t : state) anchor.data.emplace_back(t.data, t.data + t.bytes);
    const std::string plain = dir_ + "/anchor-" + std::to_string(version) + ".safetensors";
    save_checkpoint(options.compress_anchors ? plain + ".zst" : plain, anchor, options.anchor_level);
  }
  std::ostringstream head_text;
  head_text << "version " << version << " " << to_hex(state_digest(state)) << "\n";
  const std::string text = head_text.str();
  write_file_atomically(dir_ + "/HEAD", text.data(), text.size());  // last: the version is now visible
  retain(version, options.keep_anchors);
}

void Relay::retain(std::uint64_t newest, std::uint64_t keep_anchors) const {
  const auto anchors = anchor_versions(dir_);
  if (anchors.size() <= keep_anchors) return;
  const std::uint64_t oldest_kept = anchors[anchors.size() - keep_anchors];
  for (std::uint64_t v : anchors)
    if (v < oldest_kept) fs::remove(anchor_path(v));
  for (const auto& entry : fs::directory_iterator(dir_)) {
    std::uint64_t from, to;
    if (std::sscanf(entry.path().filename().string().c_str(), "patch-%lu-%lu.pulse", &from, &to) == 2 &&
        to <= oldest_kept && to <= newest)
      fs::remove(entry.path());
  }
}

PullResult Relay::pull(const Checkpoint* have, std::uint64_t have_version, const PublicKey* public_key) const {
  const auto h = head();
  PULSE_CHECK(h.has_value(), "relay: " + dir_ + " has no HEAD (nothing published yet)");
  PullResult result;
  result.version = h->version;
  auto chain_from = [&](std::uint64_t v) {
    for (std::uint64_t u = v; u < h->version; ++u)
      if (!fs::exists(patch_path(u, u + 1))) return false;
    return true;
  };
  std::uint64_t start;
  if (have && have_version <= h->version && chain_from(have_version)) {
    result.state = *have;
    for (std::size_t i = 0; i < result.state.layout.size(); ++i) result.state.layout[i].data = result.state.data[i].data();
    start = have_version;
    result.fast_path = true;
  } else {
    const auto anchors = anchor_versions(dir_);
    auto it = std::upper_bound(anchors.begin(), anchors.end(), h->version);
    PULSE_CHECK(it != anchors.begin(), "relay: no anchor at or before version " + std::to_string(h->version));
    start = *std::prev(it);
    PULSE_CHECK(chain_from(start), "relay: the patch chain from anchor " + std::to_string(start) + " is incomplete");
    result.state = load_checkpoint(anchor_path(start));
  }
  for (std::uint64_t u = start; u < h->version; ++u) {
    const auto bytes = read_bytes(patch_path(u, u + 1));
    const ParsedPatch p = parse_patch(bytes.data(), bytes.size(), {}, public_key);
    PULSE_CHECK(p.header.base_version == u && p.header.target_version == u + 1,
                "relay: " + patch_path(u, u + 1) + " holds versions " + std::to_string(p.header.base_version) + " -> " +
                    std::to_string(p.header.target_version));
    auto tensors = result.state.mutables();
    apply_patch(p, tensors);
    ++result.patches_applied;
  }
  PULSE_CHECK(state_digest(result.state.layout) == h->state,
              "relay: the weights reached do not match HEAD's digest for version " + std::to_string(h->version));
  return result;
}

}  // namespace pulse::sync
