#include "sync/relay.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <ctime>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "core/file_read.hpp"
#include "sync/relay_lock_record.hpp"
#include "sync/relay_names.hpp"

namespace fs = std::filesystem;

namespace pulse::sync {

namespace {

// A lock of another host whose holder has not touched it for this long is stale: the holder
// refreshes it before every file it writes, and no single file takes anywhere near this long.
constexpr long kStaleLockSeconds = 900;

std::string random_letters(std::size_t n) {
  static const char* alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::random_device random;
  std::string out;
  for (std::size_t i = 0; i < n; ++i) out += alphabet[random() % 62];
  return out;
}

// A process killed but not yet reaped by its parent (a zombie) still answers kill(pid, 0).
bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream stat_file("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(stat_file, text);
  const auto close = text.rfind(')');  // the state follows "(command) "
  return close != std::string::npos && close + 2 < text.size() && (text[close + 2] == 'Z' || text[close + 2] == 'X');
}

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

// publish.lock: created whole and exclusively (try_create), naming its holder's host, pid and a
// random token. A lock whose holder is gone (same host: the pid no longer exists; other host:
// not refreshed for kStaleLockSeconds) is broken by renaming it away, which only one breaker
// can do; the renamed file has a temporary name, so a breaker killed meanwhile leaves nothing
// the next publisher does not remove.
class PublishLock {
 public:
  explicit PublishLock(std::string path) : path_(std::move(path)) {
    content_ = format_lock({host_name(), std::uint64_t(::getpid()), random_letters(16)});
    for (int attempt = 0; attempt < 3; ++attempt) {
      if (try_create()) return;
      const std::string holder = read_holder();
      if (!is_stale(holder)) break;
      const std::string moved = path_ + ".tmp." + random_letters(6);
      if (::rename(path_.c_str(), moved.c_str()) != 0) continue;  // someone else broke it first
      const bool same = read_text(moved) == holder;
      if (!same) ::link(moved.c_str(), path_.c_str());  // a fresh lock after all: put it back
      ::unlink(moved.c_str());
    }
    const std::string holder = read_holder();
    throw_error(__FILE__, __LINE__,
                "relay: another publisher holds " + path_ + " (" + describe(holder) +
                    "); one publisher per relay (remove the file if that publisher is gone)");
  }
  ~PublishLock() {
    if (read_text(path_) == content_) ::unlink(path_.c_str());
  }
  PublishLock(const PublishLock&) = delete;
  PublishLock& operator=(const PublishLock&) = delete;

  // Before each file: the lock must still be ours (fencing), and its time is refreshed.
  void confirm() const {
    PULSE_CHECK(read_text(path_) == content_,
                "relay: lost " + path_ + " to another publisher; stopped before changing HEAD");
    ::utimensat(AT_FDCWD, path_.c_str(), nullptr, 0);
  }

 private:
  // The lock appears with its content (written to a temporary file, then hard-linked, which
  // fails if the lock exists), so a publisher killed at any point never leaves an empty lock.
  // Where hard links are not supported, O_EXCL creates it directly.
  bool try_create() const {
    std::string temp = path_ + ".tmp.XXXXXX";
    const int fd = ::mkstemp(temp.data());
    PULSE_CHECK(fd >= 0, "relay: cannot create a file next to " + path_ + ": " + std::strerror(errno));
    const bool written = ::write(fd, content_.data(), content_.size()) == static_cast<ssize_t>(content_.size());
    const bool closed = ::close(fd) == 0;
    if (!written || !closed) ::unlink(temp.c_str());
    PULSE_CHECK(written && closed, "relay: cannot write " + temp);
    const int rc = ::link(temp.c_str(), path_.c_str());
    const int link_errno = errno;
    ::unlink(temp.c_str());
    if (rc == 0) return true;
    if (link_errno == EEXIST || link_errno == ENOENT) return false;  // held, or the holder removed our temporary
    const int lock = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (lock < 0) {
      PULSE_CHECK(errno == EEXIST, "relay: cannot create " + path_ + ": " + std::strerror(errno));
      return false;
    }
    const bool ok = ::write(lock, content_.data(), content_.size()) == static_cast<ssize_t>(content_.size()) &&
                    ::close(lock) == 0;
    if (!ok) ::unlink(path_.c_str());
    PULSE_CHECK(ok, "relay: cannot write " + path_);
    return true;
  }
  static std::string read_text(const std::string& path) {
    try {
      const auto bytes = read_regular_file(path, kMaxRelayRecordBytes, "relay lock");
      return std::string(bytes.begin(), bytes.end());
    } catch (const Error&) {
      return "";
    }
  }
  std::string read_holder() const { return read_text(path_); }
  static std::string describe(const std::string& text) {
    const LockHolder holder = parse_lock(text);
    return holder.host.empty() || !holder.pid ? "holder unknown"
                                              : "pid " + std::to_string(*holder.pid) + " on " + holder.host;
  }
  bool is_stale(const std::string& text) const {
    const LockHolder holder = parse_lock(text);
    const auto pid = holder.pid;
    if (holder.host == host_name() && pid && *pid > 0 && *pid <= std::uint64_t(INT32_MAX))
      return process_gone(static_cast<pid_t>(*pid));
    struct stat st {};
    if (::stat(path_.c_str(), &st) != 0) return false;  // gone: the next attempt creates it
    return std::time(nullptr) - st.st_mtime > kStaleLockSeconds;
  }

  std::string path_, content_;
};

}  // namespace

std::uint64_t patch_bytes_limit(const std::vector<TensorRef>& state) {
  std::uint64_t bytes = 0;
  for (const auto& t : state) bytes += t.bytes;
  return 8 * bytes + PatchLimits{}.max_entry_table_bytes + (1 << 20);
}

Relay::Relay(std::string dir) : dir_(std::move(dir)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  PULSE_CHECK(fs::is_directory(dir_), "relay: " + dir_ + " is not a folder");
}

std::string Relay::anchor_path(std::uint64_t v) const {
  const std::string compressed = path(anchor_file_name(v, true));
  std::error_code ec;
  return fs::is_regular_file(compressed, ec) ? compressed : path(anchor_file_name(v, false));
}
std::string Relay::patch_path(std::uint64_t from, std::uint64_t to) const { return path(patch_file_name(from, to)); }

namespace {

// The relay's own files: names of its grammar that are regular files (not links, folders or
// FIFOs, which a relay never writes; they are ignored and never deleted).
std::vector<std::pair<fs::path, RelayName>> relay_files(const std::string& dir) {
  std::vector<std::pair<fs::path, RelayName>> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::error_code ec;
    if (!entry.is_regular_file(ec) || entry.is_symlink(ec)) continue;
    if (const auto name = parse_relay_name(entry.path().filename().string())) out.emplace_back(entry.path(), *name);
  }
  return out;
}

}  // namespace

std::vector<std::uint64_t> Relay::anchor_versions() const {
  std::vector<std::uint64_t> out;
  for (const auto& [file, parsed] : relay_files(dir_)) {
    const auto* name = &parsed;
    if (name && (name->kind == RelayFile::anchor || name->kind == RelayFile::anchor_zst)) out.push_back(name->version);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::optional<RelayHead> Relay::head(const PublicKey* public_key) const {
  const std::string head_path = path(kRelayHeadName);
  struct stat st {};
  if (::lstat(head_path.c_str(), &st) != 0 && errno == ENOENT) return std::nullopt;
  const auto bytes = read_regular_file(head_path, kMaxRelayRecordBytes, "relay HEAD");
  return parse_head(bytes.data(), bytes.size(), public_key, head_path);
}

void Relay::publish(std::uint64_t version, const std::vector<TensorRef>& state, const std::vector<TensorRef>* previous,
                    const PublishOptions& options) {
  const Metadata none;
  publish(version, state, none, previous, previous ? &none : nullptr, options);
}

void Relay::publish(std::uint64_t version, const std::vector<TensorRef>& state, const Metadata& metadata,
                    const std::vector<TensorRef>* previous, const Metadata* previous_metadata,
                    const PublishOptions& options) {
  const Metadata no_metadata;
  if (!previous_metadata) previous_metadata = &no_metadata;
  PULSE_CHECK(options.anchor_every >= 1 && options.keep_anchors >= 1, "relay: anchor_every and keep_anchors must be >= 1");
  PublishLock lock(path(kRelayLockName));
  remove_temporary_files();  // with the lock held, every writer of these is gone
  const auto current = head();
  PULSE_CHECK(!current || version > current->version,
              "relay: version " + std::to_string(version) + " is not newer than the head " + std::to_string(current->version));
  const SecretKey* key = options.encode.signing_key;
  if (current) check_same_signer(*current, key);
  // The relay's id is drawn at its first publish (or the first since format 1) and kept.
  const RelayId relay_id = current && current->format >= 2 ? current->relay : new_relay_id();
  bool wrote_patch = false;
  if (current && previous && current->version + 1 == version) {
    PULSE_CHECK(state_digest(*previous, *previous_metadata) == current->state,
                "relay: the previous weights given are not the relay's head version " + std::to_string(current->version));
    EncodeOptions enc = options.encode;
    enc.base_version = current->version;
    enc.target_version = version;
    const auto patch = encode_patch(*previous, state, enc, nullptr, nullptr, *previous_metadata, metadata);
    lock.confirm();
    write_file_atomically(patch_path(current->version, version), patch.data(), patch.size());
    wrote_patch = true;
  }
  const Digest digest = state_digest(state, metadata);
  if (!wrote_patch || version % options.anchor_every == 0 || anchor_versions().empty()) {
    Checkpoint anchor;
    anchor.layout = state;
    anchor.metadata = metadata;
    for (const auto& t : state) anchor.data.emplace_back(t.data, t.data + t.bytes);
    lock.confirm();
    const std::string anchor_file = path(anchor_file_name(version, options.compress_anchors));
    AnchorRecord record_of{relay_id, version, digest};
    record_of.state_bytes = save_checkpoint(anchor_file, anchor, options.anchor_level);
    record_of.file_bytes = fs::file_size(anchor_file);
    const std::string record = format_anchor_record(record_of, key);
    write_file_atomically(path(anchor_record_name(version)), record.data(), record.size());
  }
  RelayHead next{relay_id, version, digest, layout_digest(state)};
  if (current) next.follows = current->version;
  const std::string text = format_head(next, key);
  lock.confirm();
  write_file_atomically(path(kRelayHeadName), text.data(), text.size());  // last: the version is now visible
  retain(options.keep_anchors);
}

void Relay::check_same_signer(const RelayHead& current, const SecretKey* key) const {
  if (!current.is_signed) {
    PULSE_CHECK(!key, "relay: " + dir_ + " is not signed, and a relay's readers hold its key from the first version "
                      "on; publish signed versions to a new relay folder");
    return;
  }
  PULSE_CHECK(key, "relay: " + dir_ + " is signed; publishing unsigned would break every reader that holds its key "
                   "(give --sign with its secret key)");
  const PublicKey public_key = public_key_of(*key);
  try {
    head(&public_key);
  } catch (const Error&) {
    throw_error(__FILE__, __LINE__, "relay: " + dir_ + "'s HEAD is signed by another key than the one given; "
                                    "publishing would break every reader that holds the relay's key");
  }
}

void Relay::check_records(const RelayHead& head, const PublicKey& key) const {
  PULSE_CHECK(head.format >= 2, "relay: " + path(kRelayHeadName) + " is of format 1, which names no relay or model; "
                                "a reader with a key needs the relay published once more by this pulse version");
  for (const auto& [file, name] : relay_files(dir_)) {
    if (name.kind != RelayFile::anchor_record) continue;
    const std::string record_path = file.string();
    try {
      const auto bytes = read_regular_file(record_path, kMaxRelayRecordBytes, "anchor record");
      const AnchorRecord record = parse_anchor_record(bytes.data(), bytes.size(), &key, record_path);
      PULSE_CHECK(record.format < 2 || record.relay == head.relay,
                  "relay record " + record_path + " names relay " + record.relay + ", HEAD names " + head.relay);
    } catch (const Error& e) {
      throw_error(__FILE__, __LINE__, std::string("relay: refusing a relay whose records are not all its own: ") +
                                          e.what());
    }
  }
}

void Relay::remove_temporary_files() const {
  for (const auto& [file, name] : relay_files(dir_)) {
    std::error_code ec;
    if (name.kind == RelayFile::temporary) fs::remove(file, ec);  // best effort: never blocks a publish
  }
}

void Relay::retain(std::uint64_t keep_anchors) const {
  const auto anchors = anchor_versions();
  if (anchors.size() <= keep_anchors) return;
  const std::uint64_t oldest_kept = anchors[anchors.size() - keep_anchors];
  // After HEAD has moved: a file that cannot go now goes at a later publish, never an error.
  for (const auto& [file, parsed] : relay_files(dir_)) {
    const auto* name = &parsed;
    const bool old_anchor = (name->kind == RelayFile::anchor || name->kind == RelayFile::anchor_zst ||
                             name->kind == RelayFile::anchor_record) &&
                            name->version < oldest_kept;
    const bool old_patch = name->kind == RelayFile::patch && name->to <= oldest_kept;
    std::error_code ec;
    if (old_anchor || old_patch) fs::remove(file, ec);
  }
}

namespace {

// Applies the patches from `from` to the head onto state, then checks HEAD's digest.
void follow_patches(const Relay& relay, Checkpoint& state, std::uint64_t from, const RelayHead& head,
                    const PullOptions& options, PullResult& result) {
  PatchLimits limits;
  limits.max_patch_bytes = patch_bytes_limit(state.layout);
  for (std::uint64_t u = from; u < head.version; ++u) {
    const std::string file = relay.patch_path(u, u + 1);
    const auto bytes = read_regular_file(file, limits.max_patch_bytes, "patch");
    const ParsedPatch p = parse_patch(bytes.data(), bytes.size(), limits, options.public_key);
    PULSE_CHECK(p.header.base_version == u && p.header.target_version == u + 1,
                "relay: " + file + " holds versions " + std::to_string(p.header.base_version) + " -> " +
                    std::to_string(p.header.target_version));
    apply_to_checkpoint(p, state);  // tensors, layout and metadata
    ++result.patches_applied;
  }
  PULSE_CHECK(state_digest(state.layout, state.metadata) == head.state,
              "relay: the weights reached do not match HEAD's digest for version " + std::to_string(head.version));
}

}  // namespace

PullResult Relay::pull(const Checkpoint* have, std::uint64_t have_version, const PullOptions& options) const {
  const auto h = head(options.public_key);
  PULSE_CHECK(h.has_value(), "relay: " + dir_ + " has no HEAD (nothing published yet)");
  const std::uint64_t floor = std::max(options.min_version, have ? have_version : 0);
  PULSE_CHECK(h->version >= floor, "relay: HEAD names version " + std::to_string(h->version) +
                                       ", older than version " + std::to_string(floor) +
                                       " the reader holds or requires; refusing to move back");
  if (options.public_key) check_records(*h, *options.public_key);
  PullResult result;
  result.version = h->version;
  if (have) {
    try {
      result.state = *have;
      for (std::size_t i = 0; i < result.state.layout.size(); ++i) result.state.layout[i].data = result.state.data[i].data();
      follow_patches(*this, result.state, have_version, *h, options, result);
      result.fast_path = true;
      return result;
    } catch (const Error& e) {
      result.fallback = std::string("fast path: ") + e.what();
    }
    // Without a patch chain from the receiver's state, an anchor of another model (another
    // relay's files copied in, signed with the same key) would replace it: refused.
    PULSE_CHECK(h->format < 2 || layout_digest(have->layout) == h->layout,
                "relay: HEAD's model has another tensor layout than the state you have, and no patch chain leads "
                "from yours (" + result.fallback + "); pull without --have to take the relay's model");
  }
  auto anchors = anchor_versions();
  anchors.erase(std::upper_bound(anchors.begin(), anchors.end(), h->version), anchors.end());
  PULSE_CHECK(!anchors.empty() || !result.fallback.empty(),
              "relay: no anchor at or before version " + std::to_string(h->version));
  for (auto it = anchors.rbegin(); it != anchors.rend(); ++it) {
    result.patches_applied = 0;
    try {
      const std::string record_path = path(anchor_record_name(*it));
      std::optional<AnchorRecord> record;
      if (options.public_key || fs::exists(record_path)) {
        const auto bytes = read_regular_file(record_path, kMaxRelayRecordBytes, "anchor record");
        record = parse_anchor_record(bytes.data(), bytes.size(), options.public_key, record_path);
        PULSE_CHECK(record->version == *it, "relay: " + record_path + " names version " + std::to_string(record->version));
        PULSE_CHECK(!options.public_key || record->format >= 2,
                    "relay: " + record_path + " is of format 1 (no relay id or sizes), not used with a key");
      }
      // A format-2 record bounds the anchor before a byte of it is read or decoded: a small
      // hostile .zst that declares gigabytes is refused by its size, not by its digest.
      const std::string anchor_file = anchor_path(*it);
      std::uint64_t max_state_bytes = 0;
      if (record && record->format >= 2) {
        PULSE_CHECK(h->format < 2 || record->relay == h->relay,
                    "relay: " + record_path + " names relay " + record->relay + ", HEAD names " + h->relay);
        const std::uint64_t size = read_regular_file_prefix(anchor_file, 0, "anchor").file_size;
        PULSE_CHECK(size == record->file_bytes, "relay: " + anchor_file + " is " + std::to_string(size) +
                                                    " bytes, its record names " + std::to_string(record->file_bytes));
        max_state_bytes = record->state_bytes;
      }
      result.state = load_checkpoint(anchor_file, max_state_bytes);
      PULSE_CHECK(!record || state_digest(result.state.layout, result.state.metadata) == record->state,
                  "relay: " + anchor_path(*it) + " does not match the digest its record names");
      follow_patches(*this, result.state, *it, *h, options, result);
      result.anchor = *it;
      return result;
    } catch (const Error& e) {
      result.fallback += (result.fallback.empty() ? "" : "; ") + std::string("anchor ") + std::to_string(*it) + ": " +
                         e.what();
    } catch (const std::bad_alloc&) {  // an anchor too large for this machine: the next one may fit
      result.fallback += (result.fallback.empty() ? "" : "; ") + std::string("anchor ") + std::to_string(*it) +
                         ": out of memory while loading it";
    }
  }
  throw_error(__FILE__, __LINE__, "relay: cannot reach HEAD version " + std::to_string(h->version) + " (" +
                                      result.fallback + ")");
}

}  // namespace pulse::sync
