#include "sync/relay.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
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
#include "coding/compress.hpp"
#include "sync/file_apply.hpp"
#include "sync/relay_lock_record.hpp"
#include "sync/relay_names.hpp"
#include "sync/streamed_save.hpp"
#include "sync/streamed_state.hpp"

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

namespace {

// A state's digests, a tensor at a time (those not in memory read by the loader).
StateDigests digests_of(const std::vector<TensorRef>& state, const Metadata& metadata, const TensorLoader& loader) {
  if (!loader) return compute_digests(state, metadata);
  StateDigests out;
  std::vector<Digest> digests;
  ByteBuffer buffer;
  for (std::size_t i = 0; i < state.size(); ++i) {
    digests.push_back(for_each_piece(state, loader, i, buffer, [](const std::byte*, std::size_t) {}));
    out.tensors[state[i].name] = digests.back();
  }
  out.state = state_digest(state, digests, metadata);
  return out;
}

}  // namespace

void Relay::publish(std::uint64_t version, const std::vector<TensorRef>& state, const Metadata& metadata,
                    const std::vector<TensorRef>* previous, const Metadata* previous_metadata,
                    const PublishOptions& options, const TensorLoader& state_loader,
                    const TensorLoader& previous_loader) {
  const Metadata no_metadata;
  if (!previous_metadata) previous_metadata = &no_metadata;
  publish_locked(version, state, metadata, options, state_loader, [&](const RelayHead& current) -> std::optional<MadePatch> {
    if (!previous) return std::nullopt;
    // Hashed once here, then not again by encode.
    const StateDigests base = digests_of(*previous, *previous_metadata, previous_loader);
    PULSE_CHECK(base.state == current.state,
                "relay: the previous weights given are not the relay's head version " + std::to_string(current.version));
    EncodeOptions enc = options.encode;
    enc.base_version = current.version;
    enc.target_version = version;
    StateDigests target;
    auto patch = encode_patch(*previous, state, enc, &base, &target, *previous_metadata, metadata, previous_loader,
                              state_loader);
    return MadePatch{std::move(patch), target.state};
  });
}

void Relay::publish_encoded(std::uint64_t version, const std::vector<TensorRef>& state,
                            const std::vector<std::uint8_t>& patch, const Digest& base_state, const Digest& target_state,
                            const PublishOptions& options) {
  publish_locked(version, state, {}, options, {}, [&](const RelayHead& current) -> std::optional<MadePatch> {
    PULSE_CHECK(base_state == current.state, "relay: the patch given is not from the relay's head version " +
                                                 std::to_string(current.version));
    return MadePatch{patch, target_state};
  });
}

void Relay::publish_locked(std::uint64_t version, const std::vector<TensorRef>& state, const Metadata& metadata,
                           const PublishOptions& options, const TensorLoader& state_loader,
                           const std::function<std::optional<MadePatch>(const RelayHead& head)>& make_patch) {
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
  std::optional<Digest> digest;  // the state's, once known
  if (current && current->version + 1 == version) {
    if (const std::optional<MadePatch> made = make_patch(*current)) {
      lock.confirm();
      write_file_atomically(patch_path(current->version, version), made->bytes.data(), made->bytes.size());
      digest = made->target_state;
    }
  }
  if (!digest || version % options.anchor_every == 0 || anchor_versions().empty()) {
    lock.confirm();
    const std::string anchor_file = path(anchor_file_name(version, options.compress_anchors));
    AnchorRecord record_of{relay_id, version, {}};
    // Streamed from the state, hashed as written: a state that changed since the patch was
    // encoded from it is refused before the anchor appears.
    record_of.state_bytes = write_streamed_checkpoint(
        anchor_file, state, metadata, state_loader, options.anchor_level, [&](const Digest& written) {
          PULSE_CHECK(!digest || written == *digest, "relay: the state changed while being published (its anchor is "
                                                     "not the patch's target); HEAD not moved");
          digest = written;
        });
    record_of.state = *digest;
    record_of.file_bytes = fs::file_size(anchor_file);
    const std::string record = format_anchor_record(record_of, key);
    write_file_atomically(path(anchor_record_name(version)), record.data(), record.size());
  }
  const RelayHead next{relay_id, version, *digest, layout_digest(state),
                       current ? std::optional(current->version) : std::nullopt};
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

RelayHead Relay::checked_head(std::uint64_t floor, const PullOptions& options) const {
  const auto h = head(options.public_key);
  PULSE_CHECK(h.has_value(), "relay: " + dir_ + " has no HEAD (nothing published yet)");
  PULSE_CHECK(h->version >= floor, "relay: HEAD names version " + std::to_string(h->version) +
                                       ", older than version " + std::to_string(floor) +
                                       " the reader holds or requires; refusing to move back");
  if (options.public_key) check_records(*h, *options.public_key);
  return *h;
}

std::vector<std::uint64_t> Relay::anchors_up_to(std::uint64_t version) const {
  auto anchors = anchor_versions();
  anchors.erase(std::upper_bound(anchors.begin(), anchors.end(), version), anchors.end());
  return anchors;
}

std::optional<AnchorRecord> Relay::checked_record(std::uint64_t v, const RelayHead& h, const PullOptions& options,
                                                  std::uint64_t& max_state_bytes) const {
  max_state_bytes = 0;
  const std::string record_path = path(anchor_record_name(v));
  std::optional<AnchorRecord> record;
  if (options.public_key || fs::exists(record_path)) {
    const auto bytes = read_regular_file(record_path, kMaxRelayRecordBytes, "anchor record");
    record = parse_anchor_record(bytes.data(), bytes.size(), options.public_key, record_path);
    PULSE_CHECK(record->version == v, "relay: " + record_path + " names version " + std::to_string(record->version));
    PULSE_CHECK(!options.public_key || record->format >= 2,
                "relay: " + record_path + " is of format 1 (no relay id or sizes), not used with a key");
  }
  // A format-2 record bounds the anchor before a byte of it is read or decoded: a small
  // hostile .zst that declares gigabytes is refused by its size, not by its digest.
  if (record && record->format >= 2) {
    const std::string anchor_file = anchor_path(v);
    PULSE_CHECK(h.format < 2 || record->relay == h.relay,
                "relay: " + record_path + " names relay " + record->relay + ", HEAD names " + h.relay);
    const std::uint64_t size = read_regular_file_prefix(anchor_file, 0, "anchor").file_size;
    PULSE_CHECK(size == record->file_bytes, "relay: " + anchor_file + " is " + std::to_string(size) +
                                                " bytes, its record names " + std::to_string(record->file_bytes));
    max_state_bytes = record->state_bytes;
  }
  return record;
}

PullResult Relay::walk_to_head(const RelayHead& h, const PullOptions& options, const std::vector<TensorRef>* have_layout,
                               const FromHave& from_have, const FromAnchor& from_anchor) const {
  PullResult result;
  result.version = h.version;
  if (have_layout) {
    try {
      from_have(result);
      result.fast_path = true;
      return result;
    } catch (const Error& e) {
      result.fallback = std::string("fast path: ") + e.what();
    }
    // Without a patch chain from the receiver's state, an anchor of another model (another
    // relay's files copied in, signed with the same key) would replace it: refused.
    PULSE_CHECK(h.format < 2 || layout_digest(*have_layout) == h.layout,
                "relay: HEAD's model has another tensor layout than the state you have, and no patch chain leads "
                "from yours (" + result.fallback + "); pull without --have to take the relay's model");
  }
  const auto anchors = anchors_up_to(h.version);
  PULSE_CHECK(!anchors.empty() || !result.fallback.empty(),
              "relay: no anchor at or before version " + std::to_string(h.version));
  for (auto it = anchors.rbegin(); it != anchors.rend(); ++it) {
    result.patches_applied = 0;
    const std::string failed = (result.fallback.empty() ? "" : "; ") + std::string("anchor ") + std::to_string(*it) + ": ";
    try {
      std::uint64_t max_state_bytes = 0;
      const auto record = checked_record(*it, h, options, max_state_bytes);
      from_anchor(*it, record, max_state_bytes, result);
      result.anchor = *it;
      return result;
    } catch (const Error& e) {
      result.fallback += failed + e.what();
    } catch (const std::bad_alloc&) {  // an anchor (or a step) too large for this machine: the next one may fit
      result.fallback += failed + "out of memory while loading it";
    }
  }
  throw_error(__FILE__, __LINE__, "relay: cannot reach HEAD version " + std::to_string(h.version) + " (" +
                                      result.fallback + ")");
}

PullResult Relay::pull(const Checkpoint* have, std::uint64_t have_version, const PullOptions& options) const {
  const RelayHead h = checked_head(std::max(options.min_version, have ? have_version : 0), options);
  return walk_to_head(
      h, options, have ? &have->layout : nullptr,
      [&](PullResult& result) {
        result.state = *have;
        for (std::size_t i = 0; i < result.state.layout.size(); ++i) result.state.layout[i].data = result.state.data[i].data();
        follow_patches(*this, result.state, have_version, h, options, result);
      },
      [&](std::uint64_t v, const std::optional<AnchorRecord>& record, std::uint64_t max_state_bytes, PullResult& result) {
        result.state = load_checkpoint(anchor_path(v), max_state_bytes);
        PULSE_CHECK(!record || state_digest(result.state.layout, result.state.metadata) == record->state,
                    "relay: " + anchor_path(v) + " does not match the digest its record names");
        follow_patches(*this, result.state, v, h, options, result);
      });
}

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

// A state's layout from its headers (data null); a compressed file is loaded whole.
std::vector<TensorRef> layout_of(const std::string& path) {
  std::vector<TensorRef> layout = ends_with(path, ".zst") ? load_checkpoint(path).layout : StreamedState::open(path).tensors();
  for (auto& t : layout) t.data = nullptr;
  return layout;
}

// The scratch folder of a pull: ".<out's name>.pulse-pull.XXXXXX" next to out (the same
// filesystem), made when first needed, flock'ed while it lives so that a later pull can tell a
// killed puller's from a live one's (and remove it), removed with its contents at the end.
class PullScratch {
 public:
  explicit PullScratch(const std::string& out) {
    fs::path p(out);
    if (!p.has_filename()) p = p.parent_path();
    parent_ = p.has_parent_path() ? p.parent_path() : fs::path(".");
    prefix_ = "." + p.filename().string() + ".pulse-pull.";
  }
  ~PullScratch() {
    if (fd_ < 0) return;
    std::error_code ec;
    fs::remove_all(dir_, ec);
    ::close(fd_);
  }
  PullScratch(const PullScratch&) = delete;
  PullScratch& operator=(const PullScratch&) = delete;

  std::string path(const std::string& name) {
    if (fd_ < 0) create();
    return dir_ + "/" + name;
  }
  std::uint64_t free_bytes() {
    struct statvfs st {};
    return ::statvfs(path("").c_str(), &st) == 0 ? std::uint64_t(st.f_bavail) * st.f_frsize : 0;
  }

 private:
  void create() {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(parent_, ec)) {  // killed pullers' scratch folders
      const std::string name = entry.path().filename().string();
      if (name.size() != prefix_.size() + 6 || name.compare(0, prefix_.size(), prefix_) != 0) continue;
      const int fd = ::open(entry.path().c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) continue;
      if (::flock(fd, LOCK_EX | LOCK_NB) == 0) fs::remove_all(entry.path(), ec);
      ::close(fd);
    }
    std::string name = (parent_ / (prefix_ + "XXXXXX")).string();
    PULSE_CHECK(::mkdtemp(name.data()), "pull: cannot create a scratch folder in " + parent_.string() + " (" +
                                            std::strerror(errno) + ")");
    dir_ = name;
    fd_ = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    PULSE_CHECK(fd_ >= 0 && ::flock(fd_, LOCK_EX | LOCK_NB) == 0, "pull: cannot lock the scratch folder " + dir_);
  }
  fs::path parent_;
  std::string prefix_, dir_;
  int fd_ = -1;
};

// One patch from the state at base to dest (a file or folder as save_state names it): streamed
// where the file or folder apply takes it, otherwise the base loaded whole. True for a folder.
bool apply_step(const std::string& base, const ParsedPatch& patch, const std::string& dest, ReplaceFolder replace,
                unsigned threads) {
  if (fs::is_directory(base)) {
    const OpenState headers = open_state(base, io::ShardBytes::header_only);
    if (folder_apply_fits(headers, dest, patch)) {
      apply_folder(headers, patch, dest, replace, threads);
      return true;
    }
  } else if (!ends_with(base, ".zst")) {
    const io::SafetensorsFile header = io::SafetensorsFile::open_header(base);
    if (file_apply_fits(base, dest, tensor_refs(header), patch)) {
      apply_file(base, patch, dest, threads);
      return false;
    }
  }
  Checkpoint state = load_checkpoint(base);
  apply_to_checkpoint(patch, state);
  return save_state(dest, state, replace);
}

struct IntoOptions {
  const std::string& out;
  ReplaceFolder replace;
  unsigned threads;
};

// From the state at start (version from, a file or a folder; its digest *start_digest when
// known) to HEAD, written to out: patch by patch, the versions between in the scratch folder.
// The last patch must lead to HEAD's digest before it is applied; each apply verifies its base
// and target digests.
void follow_patches_into(const Relay& relay, const std::string& start, std::uint64_t from, const Digest* start_digest,
                         const RelayHead& head, const PullOptions& options, const IntoOptions& into,
                         PullScratch& scratch, PullResult& result) {
  if (from == head.version) {  // nothing to apply: the start must be HEAD's state
    PULSE_CHECK(!start_digest || *start_digest == head.state,
                "relay: the state of version " + std::to_string(from) + " is not HEAD's (digest " +
                    to_hex(*start_digest) + ", HEAD names " + to_hex(head.state) + ")");
    if (ends_with(start, ".zst")) {
      const Checkpoint state = load_checkpoint(start);
      PULSE_CHECK(state_digest(state.layout, state.metadata) == head.state,
                  "relay: the weights reached do not match HEAD's digest for version " + std::to_string(head.version));
      result.folder = save_state(into.out, state, into.replace);
      return;
    }
    const StreamedState state = StreamedState::open(start);
    if (same_file(start, into.out)) {  // already there: checked, not written
      std::vector<Digest> digests;
      for (std::size_t i = 0; i < state.tensors().size(); ++i) digests.push_back(state.digest(i));
      PULSE_CHECK(state_digest(state.tensors(), digests, state.metadata()) == head.state,
                  "relay: the weights reached do not match HEAD's digest for version " + std::to_string(head.version));
      result.folder = state.folder();
      return;
    }
    result.folder = save_streamed_state(into.out, state, &head.state, into.replace);
    return;
  }
  const bool folders = fs::is_directory(start);
  PatchLimits limits;
  limits.max_patch_bytes = patch_bytes_limit(layout_of(start));
  std::string current = start;
  bool current_in_scratch = false;
  for (std::uint64_t u = from; u < head.version; ++u) {
    const std::string file = relay.patch_path(u, u + 1);
    const auto bytes = read_regular_file(file, limits.max_patch_bytes, "patch");
    const ParsedPatch p = parse_patch(bytes.data(), bytes.size(), limits, options.public_key);
    PULSE_CHECK(p.header.base_version == u && p.header.target_version == u + 1,
                "relay: " + file + " holds versions " + std::to_string(p.header.base_version) + " -> " +
                    std::to_string(p.header.target_version));
    PULSE_CHECK(u != from || !start_digest || p.header.base_state == *start_digest,
                "relay: " + file + " starts from another state than the one of version " + std::to_string(u) +
                    " (digest " + to_hex(*start_digest) + ")");
    const bool last = u + 1 == head.version;
    PULSE_CHECK(!last || p.header.target_state == head.state,
                "relay: " + file + " does not lead to HEAD's digest for version " + std::to_string(head.version));
    const std::string dest = last ? into.out : scratch.path(std::to_string(u + 1) + (folders ? "" : ".safetensors"));
    result.folder = apply_step(current, p, dest, last ? into.replace : ReplaceFolder::if_nothing_lost, into.threads);
    std::error_code ec;
    if (current_in_scratch) fs::remove_all(current, ec);  // disk: two versions at a time
    current = dest;
    current_in_scratch = !last;
    ++result.patches_applied;
  }
}

}  // namespace

PullResult Relay::pull_into(const std::string& out, const std::string& have, std::uint64_t have_version,
                            const PullOptions& options, ReplaceFolder replace, unsigned threads) const {
  const RelayHead h = checked_head(std::max(options.min_version, have.empty() ? 0 : have_version), options);
  PullScratch scratch(out);
  const IntoOptions into{out, replace, threads};
  const std::vector<TensorRef> have_layout = have.empty() ? std::vector<TensorRef>{} : layout_of(have);
  return walk_to_head(
      h, options, have.empty() ? nullptr : &have_layout,
      [&](PullResult& result) { follow_patches_into(*this, have, have_version, nullptr, h, options, into, scratch, result); },
      [&](std::uint64_t v, const std::optional<AnchorRecord>& record, std::uint64_t max_state_bytes, PullResult& result) {
        std::string start = anchor_path(v);
        if (ends_with(start, ".zst")) {  // decompressed in pieces, bounded by its record (or the disk)
          const std::string plain = scratch.path("anchor-" + std::to_string(v) + ".safetensors");
          AtomicFile file(plain);
          decompress_zstd_file(start, max_state_bytes ? max_state_bytes : scratch.free_bytes(),
                               [&](const void* data, std::size_t size) { file.write(data, size); });
          file.commit();
          start = plain;
        }
        const Digest* expected = record ? &record->state : nullptr;
        // A folder's anchor (its files as U8 tensors) becomes a folder first, for the folder apply.
        if (v != h.version && carries_files(layout_of(start))) {
          const std::string folder = scratch.path("anchor-" + std::to_string(v));
          save_streamed_state(folder, StreamedState::open(start), expected);
          if (start != anchor_path(v)) std::remove(start.c_str());
          start = folder;
        }
        follow_patches_into(*this, start, v, expected, h, options, into, scratch, result);
      });
}

}  // namespace pulse::sync
