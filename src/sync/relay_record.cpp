#include "sync/relay_record.hpp"

#include <random>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "sync/relay_names.hpp"

namespace pulse::sync {

namespace {

// The first line names the record type, so a signature over one type never validates another.
constexpr std::string_view kHeadTitle = "PULSESync relay HEAD 3";
constexpr std::string_view kAnchorTitle = "PULSESync relay anchor 3";
// Formats 1 and 2 state digests of the whole-tensor xxh3-128 (before the block digest): refused.
constexpr std::string_view kHeadTitle2 = "PULSESync relay HEAD 2";
constexpr std::string_view kAnchorTitle2 = "PULSESync relay anchor 2";
constexpr std::string_view kHeadTitle1 = "PULSESync relay HEAD 1";
constexpr std::string_view kAnchorTitle1 = "PULSESync relay anchor 1";
constexpr std::string_view kSignatureKey = "signature ";

std::string hex_bytes(const std::uint8_t* data, std::size_t size) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < size; ++i) {
    out += digits[data[i] >> 4];
    out += digits[data[i] & 15];
  }
  return out;
}

bool parse_hex(std::string_view text, std::uint8_t* out, std::size_t size) {
  if (text.size() != 2 * size) return false;
  auto nibble = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  for (std::size_t i = 0; i < size; ++i) {
    const int hi = nibble(text[2 * i]), lo = nibble(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<std::uint8_t>(hi << 4 | lo);
  }
  return true;
}

std::string signed_text(const std::string& body, const SecretKey* key) {
  if (!key) return body;
  const Signature sig = sign(*key, reinterpret_cast<const std::uint8_t*>(body.data()), body.size());
  return body + std::string(kSignatureKey) + hex_bytes(sig.data(), sig.size()) + "\n";
}

// A record's lines after its title, each "key value", checked for the exact keys in order, the
// optional signature line last (verified over every byte before it when a key is given).
class RecordReader {
 public:
  RecordReader(const std::uint8_t* data, std::size_t size, std::string_view title, std::string_view title1,
               std::string_view title2, const PublicKey* key, const std::string& source)
      : source_(source) {
    check(size <= kMaxRelayRecordBytes, "is larger than " + std::to_string(kMaxRelayRecordBytes) + " bytes");
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    check(!text.empty() && text.back() == '\n', "does not end with a newline");
    std::size_t pos = 0;
    while (pos < text.size()) {
      const std::size_t end = text.find('\n', pos);
      lines_.push_back(text.substr(pos, end - pos));
      pos = end + 1;
    }
    for (const std::string_view older : {title1, title2})
      check(lines_[0] != older, "was written by an older pulse, whose state digests are no longer computed (format " +
                                    std::string(older.substr(older.size() - 1)) + "); publish the relay again");
    check(lines_[0] == title, "is not a " + std::string(title.substr(0, title.size() - 2)) + " record");
    std::size_t body_lines = lines_.size();
    const std::string_view last = lines_.back();
    if (last.substr(0, kSignatureKey.size()) == kSignatureKey) {
      Signature sig;
      check(parse_hex(last.substr(kSignatureKey.size()), sig.data(), sig.size()), "has a malformed signature");
      const std::size_t body_bytes = text.size() - last.size() - 1;
      check(!key || verify_signature(*key, sig, data, body_bytes), "has a signature that does not verify with the key");
      is_signed_ = true;
      --body_lines;
    } else {
      check(!key, "is not signed, and a public key was given");
    }
    lines_.resize(body_lines);
  }

  std::string_view value(std::size_t line, std::string_view key) {
    check(line < lines_.size(), "has no '" + std::string(key) + "' line");
    const std::string_view l = lines_[line];
    check(l.size() > key.size() && l.substr(0, key.size()) == key && l[key.size()] == ' ',
          "line " + std::to_string(line + 1) + " is not '" + std::string(key) + " ...'");
    return l.substr(key.size() + 1);
  }
  std::uint64_t version(std::size_t line, std::string_view key) {
    const auto v = parse_canonical_version(value(line, key));
    check(v.has_value(), "has no canonical decimal " + std::string(key));
    return *v;
  }
  Digest digest(std::size_t line, std::string_view key = "state") {
    Digest d;
    check(parse_hex(value(line, key), d.data(), d.size()), "has a malformed " + std::string(key) + " digest");
    return d;
  }
  RelayId relay(std::size_t line) {
    const std::string_view id = value(line, "relay");
    std::uint8_t bytes[16];
    check(parse_hex(id, bytes, sizeof bytes), "has a malformed relay id");
    return RelayId(id);
  }
  int format() const { return format_; }
  void end(std::size_t lines) { check(lines_.size() == lines, "has unexpected lines"); }
  bool is_signed() const { return is_signed_; }
  void check(bool ok, const std::string& problem) const { PULSE_CHECK(ok, "relay record " + source_ + " " + problem); }

 private:
  std::string source_;
  std::vector<std::string_view> lines_;
  bool is_signed_ = false;
  int format_ = kRelayRecordFormat;
};

}  // namespace

RelayId new_relay_id() {
  std::random_device random;
  std::uint8_t bytes[16];
  for (auto& b : bytes) b = static_cast<std::uint8_t>(random());
  return hex_bytes(bytes, sizeof bytes);
}

std::string format_head(const RelayHead& head, const SecretKey* key) {
  const bool v2 = head.format >= 2;
  const std::string body = std::string(v2 ? kHeadTitle : kHeadTitle1) + (v2 ? "\nrelay " + head.relay : "") +
                           "\nversion " + std::to_string(head.version) + "\nstate " + to_hex(head.state) +
                           (v2 ? "\nlayout " + to_hex(head.layout) : "") + "\nfollows " +
                           (head.follows ? std::to_string(*head.follows) : std::string("none")) + "\n";
  return signed_text(body, key);
}

std::string format_anchor_record(const AnchorRecord& record, const SecretKey* key) {
  const bool v2 = record.format >= 2;
  const std::string body =
      std::string(v2 ? kAnchorTitle : kAnchorTitle1) + (v2 ? "\nrelay " + record.relay : "") + "\nversion " +
      std::to_string(record.version) + "\nstate " + to_hex(record.state) +
      (v2 ? "\nfile_bytes " + std::to_string(record.file_bytes) + "\nstate_bytes " + std::to_string(record.state_bytes)
          : "") +
      "\n";
  return signed_text(body, key);
}

RelayHead parse_head(const std::uint8_t* data, std::size_t size, const PublicKey* key, const std::string& source) {
  RecordReader r(data, size, kHeadTitle, kHeadTitle1, kHeadTitle2, key, source);
  RelayHead h;
  h.format = r.format();
  std::size_t line = 1;
  if (h.format >= 2) h.relay = r.relay(line++);
  h.version = r.version(line++, "version");
  h.state = r.digest(line++);
  if (h.format >= 2) h.layout = r.digest(line++, "layout");
  if (r.value(line, "follows") != "none") {
    h.follows = r.version(line, "follows");
    r.check(*h.follows < h.version, "follows a version that is not older");
  }
  r.end(line + 1);
  h.is_signed = r.is_signed();
  return h;
}

AnchorRecord parse_anchor_record(const std::uint8_t* data, std::size_t size, const PublicKey* key,
                                 const std::string& source) {
  RecordReader r(data, size, kAnchorTitle, kAnchorTitle1, kAnchorTitle2, key, source);
  AnchorRecord a;
  a.format = r.format();
  std::size_t line = 1;
  if (a.format >= 2) a.relay = r.relay(line++);
  a.version = r.version(line++, "version");
  a.state = r.digest(line++);
  if (a.format >= 2) {
    a.file_bytes = r.version(line++, "file_bytes");
    a.state_bytes = r.version(line++, "state_bytes");
  }
  r.end(line);
  a.is_signed = r.is_signed();
  return a;
}

}  // namespace pulse::sync
