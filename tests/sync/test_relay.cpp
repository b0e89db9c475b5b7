// The relay's pieces below the CLI (issue 12): exact file names and canonical versions, signed
// HEAD and anchor records, bounded regular-file reads, zstd frames that lie about their size,
// a safetensors input truncated while in use (a SIGBUS with a memory map), and metadata carried
// through publish and pull.
#include <cstring>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/file_read.hpp"
#include "io/safetensors.hpp"
#include "coding/compress.hpp"
#include "sync/relay.hpp"
#include "sync/relay_names.hpp"
#include "sync/relay_record.hpp"

namespace fs = std::filesystem;
using namespace pulse::sync;

namespace {

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "pulse_relay_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& bytes) const { std::ofstream(path(name), std::ios::binary) << bytes; }
  fs::path dir_;
};

std::vector<std::uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

TEST(RelayNames, CanonicalVersions) {
  EXPECT_EQ(parse_canonical_version("0"), 0u);
  EXPECT_EQ(parse_canonical_version("12"), 12u);
  EXPECT_EQ(parse_canonical_version("18446744073709551615"), UINT64_MAX);
  for (const char* bad : {"", "-3", "+3", "007", "00", "18446744073709551616", "99999999999999999999", "1e3", " 1", "1 ",
                          "0x10", "184467440737095516150"})
    EXPECT_FALSE(parse_canonical_version(bad).has_value()) << bad;
}

TEST(RelayNames, ExactGrammar) {
  auto kind = [](const char* name) { return parse_relay_name(name)->kind; };
  EXPECT_EQ(kind("HEAD"), RelayFile::head);
  EXPECT_EQ(kind("anchor-4.safetensors"), RelayFile::anchor);
  EXPECT_EQ(kind("anchor-4.safetensors.zst"), RelayFile::anchor_zst);
  EXPECT_EQ(kind("anchor-4.record"), RelayFile::anchor_record);
  EXPECT_EQ(parse_relay_name("patch-4-5.pulse")->to, 5u);
  EXPECT_EQ(kind("publish.lock"), RelayFile::lock);
  for (const char* temp : {"HEAD.tmp.a1B2c3", "anchor-4.safetensors.tmp.ZZZZZZ", "anchor-4.safetensors.zst.tmp.000000",
                           "anchor-4.safetensors.uncompressed", "anchor-4.safetensors.uncompressed.tmp.abcdef",
                           "patch-1-2.pulse.tmp.xyzXYZ", "publish.lock.tmp.q1w2e3", "anchor-4.record.tmp.abcdef"})
    EXPECT_EQ(kind(temp), RelayFile::temporary) << temp;
  for (const char* other : {"anchor--3.safetensors", "anchor-0002.safetensors", "patch-1-2.pulse.bak", "patch-2-1.pulse",
                            "patch-1-1.pulse", "patch-01-2.pulse", "patch-1-2-3.pulse", "anchor-4.safetensors.gz",
                            "HEAD.tmp.keep", "HEAD.tmp.abcdefg", "HEAD.tmp.abc-ef", "mine.tmp.abcdef", "head", "HEAD ",
                            "anchor-.safetensors", "anchor-4", "anchor-18446744073709551616.safetensors",
                            "anchor-4.record.uncompressed", "patch-1-2.pulse.uncompressed", ""})
    EXPECT_FALSE(parse_relay_name(other).has_value()) << other;
  EXPECT_EQ(anchor_file_name(7, true), "anchor-7.safetensors.zst");
  EXPECT_EQ(patch_file_name(6, 7), "patch-6-7.pulse");
}

TEST(RelayRecords, RoundTripSignedAndUnsigned) {
  const KeyPair k = generate_keypair(), other = generate_keypair();
  RelayHead h;
  h.relay = new_relay_id();
  h.version = 12;
  h.follows = 11;
  h.state[0] = 0xAB;
  h.layout[15] = 0xCD;
  const std::string unsigned_text = format_head(h, nullptr), signed_text = format_head(h, &k.secret_key);
  const auto back = parse_head(reinterpret_cast<const std::uint8_t*>(signed_text.data()), signed_text.size(),
                               &k.public_key, "HEAD");
  EXPECT_EQ(back.version, 12u);
  EXPECT_EQ(back.follows, 11u);
  EXPECT_EQ(back.state, h.state);
  EXPECT_EQ(back.layout, h.layout);
  EXPECT_EQ(back.relay, h.relay);
  EXPECT_EQ(back.relay.size(), 32u);
  EXPECT_EQ(back.format, kRelayRecordFormat);
  EXPECT_TRUE(back.is_signed);
  auto parse = [](const std::string& text, const PublicKey* key) {
    return parse_head(reinterpret_cast<const std::uint8_t*>(text.data()), text.size(), key, "HEAD");
  };
  EXPECT_FALSE(parse(unsigned_text, nullptr).is_signed);
  EXPECT_TRUE(parse(signed_text, nullptr).is_signed);  // without a key: read, not verified
  EXPECT_THROW(parse(unsigned_text, &k.public_key), pulse::Error);
  EXPECT_THROW(parse(signed_text, &other.public_key), pulse::Error);
  // Any change of a signed byte breaks the signature; any change of form breaks parsing.
  for (std::size_t i = 0; i < signed_text.size(); ++i) {
    std::string bad = signed_text;
    bad[i] = bad[i] == '1' ? '2' : '1';
    EXPECT_THROW(parse(bad, &k.public_key), pulse::Error) << i;
  }
  RelayHead first = h;
  first.version = 1;
  first.follows.reset();
  EXPECT_FALSE(parse(format_head(first, nullptr), nullptr).follows.has_value());
  EXPECT_NE(new_relay_id(), h.relay);
  // Formats 1 and 2 state digests of whole-tensor xxh3-128 (before the block digest): refused
  // in one line that says to publish again.
  for (const char* title : {"PULSESync relay HEAD 1", "PULSESync relay HEAD 2"}) {
    try {
      parse(std::string(title) + "\nversion 3\nstate " + std::string(32, '0') + "\nfollows none\n", nullptr);
      ADD_FAILURE() << title << " was read";
    } catch (const pulse::Error& e) {
      EXPECT_NE(std::string(e.what()).find("publish the relay again"), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
  }
  for (const std::string& bad :
       {std::string("PULSESync relay HEAD 1\nversion 3\nstate ") + std::string(32, '0') + "\nfollows 3\n",
        std::string("PULSESync relay HEAD 1\nversion 03\nstate ") + std::string(32, '0') + "\nfollows none\n",
        std::string("PULSESync relay HEAD 1\nversion 3\nstate ") + std::string(32, 'A') + "\nfollows none\n",
        std::string("PULSESync relay HEAD 1\nversion 3\nstate ") + std::string(32, '0') + "\nfollows none",
        std::string("PULSESync relay HEAD 1\nversion 3\nstate ") + std::string(32, '0') + "\nfollows none\nextra 1\n",
        std::string("version 3 ") + std::string(32, '0') + "\n", std::string()})
    EXPECT_THROW(parse(bad, nullptr), pulse::Error) << bad;
  // A signed anchor record is not a HEAD, even with a valid signature.
  AnchorRecord anchor{h.relay, 12, h.state, 1234, 5678};
  const std::string record = format_anchor_record(anchor, &k.secret_key);
  EXPECT_THROW(parse(record, &k.public_key), pulse::Error);
  const auto a = parse_anchor_record(reinterpret_cast<const std::uint8_t*>(record.data()), record.size(), &k.public_key,
                                     "anchor-12.record");
  EXPECT_EQ(a.version, 12u);
  EXPECT_EQ(a.state, h.state);
  EXPECT_EQ(a.relay, h.relay);
  EXPECT_EQ(a.file_bytes, 1234u);
  EXPECT_EQ(a.state_bytes, 5678u);
}

TEST_F(TempDir, BoundedReadsRefuseWhatIsNotARegularFile) {
  write("small", "abc");
  EXPECT_EQ(pulse::read_regular_file(path("small"), 3, "test file"), bytes_of("abc"));
  EXPECT_THROW(pulse::read_regular_file(path("small"), 2, "test file"), pulse::Error);  // over the limit, unread
  EXPECT_THROW(pulse::read_regular_file(path("absent"), 100, "test file"), pulse::Error);
  EXPECT_THROW(pulse::read_regular_file(dir_.string(), 100, "test file"), pulse::Error);
  EXPECT_THROW(pulse::read_regular_file("/dev/zero", 100, "test file"), pulse::Error);
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  try {  // opening a FIFO with no writer would block without O_NONBLOCK
    pulse::read_regular_file(path("fifo"), 100, "test file");
    FAIL() << "a FIFO was read";
  } catch (const pulse::Error& e) {
    EXPECT_NE(std::string(e.what()).find("FIFO"), std::string::npos) << e.what();
  }
}

TEST(ZstdFrames, DeclaredSizeCheckedAndNotTrusted) {
  std::vector<std::uint8_t> raw(100000);
  for (std::size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<std::uint8_t>(i * 7 % 251);
  const auto coded = compress(Compressor::zstd, 3, raw);
  EXPECT_EQ(decompress_zstd_frame(coded.data(), coded.size(), raw.size(), "frame"), raw);
  EXPECT_THROW(decompress_zstd_frame(coded.data(), coded.size(), raw.size() - 1, "frame"), pulse::Error);
  EXPECT_THROW(decompress_zstd_frame(coded.data(), coded.size() - 3, raw.size(), "frame"), pulse::Error);
  // 20 bytes declaring 2^40 bytes: refused quickly, without allocating the declared size.
  std::vector<std::uint8_t> liar{0x28, 0xB5, 0x2F, 0xFD, 0xE0};
  for (int i = 0; i < 8; ++i) liar.push_back(static_cast<std::uint8_t>((std::uint64_t(1) << 40) >> (8 * i)));
  for (int b : std::initializer_list<int>{0x21, 0x00, 0x00, 'a', 'b', 'c', 'd'}) liar.push_back(static_cast<std::uint8_t>(b));
  EXPECT_THROW(decompress_zstd_frame(liar.data(), liar.size(), std::uint64_t(1) << 41, "frame"), pulse::Error);
  EXPECT_THROW(decompress_zstd_frame(liar.data(), liar.size(), 1000, "frame"), pulse::Error);
}

// The streamed frame (relay anchors written by publish) and the file reader in pieces (pull).
TEST_F(TempDir, ZstdFramesWrittenAndReadInPieces) {
  std::vector<std::uint8_t> raw(3000000);
  for (std::size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<std::uint8_t>((i * 7 + i / 1000) % 251);
  std::vector<std::uint8_t> frame;
  {
    ZstdFrameWriter writer(3, raw.size(), [&](const void* p, std::size_t n) {
      frame.insert(frame.end(), static_cast<const std::uint8_t*>(p), static_cast<const std::uint8_t*>(p) + n);
    });
    for (std::size_t done = 0, piece = 1; done < raw.size(); done += piece, piece = piece * 3 + 1)
      writer.write(raw.data() + done, std::min(piece, raw.size() - done));
    writer.finish();
  }
  EXPECT_EQ(decompress_zstd_frame(frame.data(), frame.size(), raw.size(), "frame"), raw);  // declares its size
  const auto read_file = [&](const std::vector<std::uint8_t>& bytes, std::uint64_t limit) {
    write("f.zst", std::string(bytes.begin(), bytes.end()));
    std::vector<std::uint8_t> out;
    decompress_zstd_file(path("f.zst"), limit, [&](const void* p, std::size_t n) {
      out.insert(out.end(), static_cast<const std::uint8_t*>(p), static_cast<const std::uint8_t*>(p) + n);
    });
    return out;
  };
  EXPECT_EQ(read_file(frame, raw.size()), raw);
  EXPECT_THROW(read_file(frame, raw.size() - 1), pulse::Error);  // declares more than the limit
  auto longer = frame;
  longer.push_back(0);
  EXPECT_THROW(read_file(longer, raw.size()), pulse::Error);  // bytes after the frame
  EXPECT_THROW(read_file({frame.begin(), frame.end() - 3}, raw.size()), pulse::Error);  // cut short
  // A writer given fewer or more bytes than it declared makes no frame.
  ZstdFrameWriter short_writer(3, 10, [](const void*, std::size_t) {});
  short_writer.write(raw.data(), 4);
  EXPECT_THROW(short_writer.finish(), pulse::Error);
  EXPECT_THROW(short_writer.write(raw.data(), 7), pulse::Error);
}

TEST_F(TempDir, SafetensorsInputTruncatedWhileInUse) {
  std::vector<std::uint16_t> w(1 << 20, 0x3F80);
  pulse::io::write_safetensors(path("w.safetensors"), {{"w", pulse::io::DType::BF16, {1 << 20}, w.data(), 2 << 20}});
  const auto file = pulse::io::SafetensorsFile::open(path("w.safetensors"));
  ASSERT_EQ(::truncate(path("w.safetensors").c_str(), 0), 0);  // another process truncates it
  const auto* t = file.find("w");
  unsigned sum = 0;
  for (std::size_t i = 0; i < t->bytes; ++i) sum += std::to_integer<unsigned>(t->data[i]);  // SIGBUS with a map
  EXPECT_EQ(sum, (0x3Fu + 0x80u) << 20);
  EXPECT_THROW(pulse::io::SafetensorsFile::open(path("w.safetensors")), pulse::Error);
}

TEST_F(TempDir, PublishLockHeldByALiveProcessRefusesASecondPublisher) {
  Relay relay(dir_.string());
  std::vector<std::uint16_t> w(16, 0x3F80);
  const std::vector<TensorRef> state{{"w", "BF16", {16}, reinterpret_cast<const std::byte*>(w.data()), 32}};
  relay.publish(1, state, nullptr, {});
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  write("publish.lock", std::string("host ") + host + "\npid " + std::to_string(::getppid()) + "\ntoken 7\n");
  EXPECT_THROW(relay.publish(2, state, nullptr, {}), pulse::Error);
  EXPECT_EQ(relay.head()->version, 1u);
  fs::remove(path("publish.lock"));
  relay.publish(2, state, nullptr, {});
  EXPECT_EQ(relay.head()->version, 2u);
  EXPECT_FALSE(fs::exists(path("publish.lock")));
  // Another host's lock: held while fresh, broken once it has not been refreshed for 15 min.
  write("publish.lock", "host another-host.invalid\npid 1\ntoken 8\n");
  EXPECT_THROW(relay.publish(3, state, nullptr, {}), pulse::Error);
  fs::last_write_time(path("publish.lock"), fs::file_time_type::clock::now() - std::chrono::minutes(16));
  relay.publish(3, state, nullptr, {});
  EXPECT_EQ(relay.head()->version, 3u);
  EXPECT_TRUE(std::none_of(fs::directory_iterator(dir_), fs::directory_iterator(), [](const fs::directory_entry& e) {
    return e.path().filename().string().rfind("publish.lock", 0) == 0;
  }));
}

TEST_F(TempDir, MetadataTravelsThroughTheRelay) {
  Relay relay(dir_.string());
  std::vector<std::uint16_t> w1(16, 0x3F80), w2 = w1;
  w2[3] ^= 1;
  const std::vector<TensorRef> v1{{"w", "BF16", {16}, reinterpret_cast<const std::byte*>(w1.data()), 32}},
      v2{{"w", "BF16", {16}, reinterpret_cast<const std::byte*>(w2.data()), 32}};
  const Metadata m1{{"format", "pt"}}, m2{{"format", "pt"}, {"step", "2"}};
  PublishOptions options;
  options.anchor_every = 100;  // version 2 travels as a patch only
  relay.publish(1, v1, m1, nullptr, nullptr, options);
  relay.publish(2, v2, m2, &v1, &m1, options);
  EXPECT_EQ(relay.head()->state, state_digest(v2, m2));
  EXPECT_FALSE(fs::exists(relay.anchor_path(2)));
  const PullResult late = relay.pull(nullptr, 0);  // anchor 1 + patch 1 -> 2
  EXPECT_EQ(late.state.metadata, m2);
  EXPECT_EQ(load_checkpoint(relay.anchor_path(1)).metadata, m1);
  // Previous weights with other metadata are not the head version.
  EXPECT_THROW(relay.publish(3, v2, m2, &v2, &m1, options), pulse::Error);
}

// A model of two BF16 tensors with the given names; version v changes element v of each.
struct Model {
  std::vector<std::string> names;
  std::vector<std::vector<std::uint16_t>> data;
  Model(std::vector<std::string> n, std::uint16_t fill) : names(std::move(n)), data(names.size(), std::vector<std::uint16_t>(64, fill)) {}
  std::vector<TensorRef> at(std::uint64_t v) {
    for (auto& d : data) d[v % d.size()] ^= 1;
    std::vector<TensorRef> out;
    for (std::size_t i = 0; i < names.size(); ++i)
      out.push_back({names[i], "BF16", {64}, reinterpret_cast<const std::byte*>(data[i].data()), 128});
    return out;
  }
};

Checkpoint copy_of(const std::vector<TensorRef>& state) {
  Checkpoint c;
  c.layout = state;
  for (const auto& t : state) c.data.emplace_back(t.data, t.data + t.bytes);
  for (std::size_t i = 0; i < c.layout.size(); ++i) c.layout[i].data = c.data[i].data();
  return c;
}

// Publishes versions 0..last of `model` to dir (signed with key when given); returns version last.
Checkpoint publish_series(const std::string& dir, Model& model, std::uint64_t last, const SecretKey* key,
                          bool compress = false) {
  Relay relay(dir);
  PublishOptions o;
  o.anchor_every = 2;
  o.keep_anchors = 3;
  o.compress_anchors = compress;
  o.encode.signing_key = key;
  Checkpoint previous;
  for (std::uint64_t v = 0; v <= last; ++v) {
    Checkpoint now = copy_of(model.at(v));
    relay.publish(v, now.layout, v ? &previous.layout : nullptr, o);
    previous = std::move(now);
  }
  return previous;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const pulse::Error& e) {
    return e.what();
  }
  return "";
}

// publish with tensors read by loaders (pulse-sync publish's StreamedState) writes the anchors
// and patches the in-memory publish writes, and pull_into brings a file to HEAD from either.
TEST_F(TempDir, StreamedPublishAndPullIntoAFile) {
  std::vector<std::uint16_t> w1(4096), w2;
  for (std::size_t i = 0; i < w1.size(); ++i) w1[i] = static_cast<std::uint16_t>(0x3C00 + i % 512);
  w2 = w1;
  for (std::size_t i = 0; i < w2.size(); i += 37) w2[i] ^= 1;
  const auto refs = [](const std::vector<std::uint16_t>& w, bool in_memory) {
    return std::vector<TensorRef>{{"a", "BF16", {64, 32}, in_memory ? reinterpret_cast<const std::byte*>(w.data()) : nullptr, 4096},
                                  {"b", "BF16", {2048}, in_memory ? reinterpret_cast<const std::byte*>(w.data() + 2048) : nullptr, 4096}};
  };
  const auto loader = [](const std::vector<std::uint16_t>& w) {
    return TensorLoader([&w](std::size_t i, std::uint64_t offset, std::size_t bytes, std::byte* out) {
      std::memcpy(out, reinterpret_cast<const std::byte*>(w.data() + 2048 * i) + offset, bytes);
    });
  };
  const Metadata m{{"format", "pt"}};
  for (const bool zst : {false, true}) {
    PublishOptions o;
    o.compress_anchors = zst;
    o.anchor_every = 100;
    Relay memory(path(zst ? "memory-zst" : "memory")), streamed(path(zst ? "streamed-zst" : "streamed"));
    const auto m1 = refs(w1, true), m2 = refs(w2, true), s1 = refs(w1, false), s2 = refs(w2, false);
    memory.publish(1, m1, m, nullptr, nullptr, o);
    memory.publish(2, m2, m, &m1, &m, o);
    streamed.publish(1, s1, m, nullptr, nullptr, o, loader(w1));
    streamed.publish(2, s2, m, &s1, &m, o, loader(w2), loader(w1));
    EXPECT_EQ(streamed.head()->state, memory.head()->state);
    EXPECT_EQ(streamed.head()->state, state_digest(refs(w2, true), m));
    const auto file = [](const std::string& f) { return pulse::read_regular_file(f, 1 << 20, "test"); };
    EXPECT_EQ(file(streamed.anchor_path(1)), file(memory.anchor_path(1)));
    EXPECT_EQ(file(streamed.patch_path(1, 2)), file(memory.patch_path(1, 2)));
    // late joiner (anchor 1 + patch), then the fast path from version 1's file
    const std::string late = path("late.safetensors"), fast = path("fast.safetensors");
    const PullResult r = streamed.pull_into(late, "", 0, {}, ReplaceFolder::if_nothing_lost, 2);
    EXPECT_FALSE(r.fast_path);
    EXPECT_EQ(r.patches_applied, 1u);
    const Checkpoint got = load_checkpoint(late);
    EXPECT_EQ(state_digest(got.layout, got.metadata), streamed.head()->state);
    save_checkpoint(path("v1.safetensors"), refs(w1, true), m);
    const PullResult f = streamed.pull_into(fast, path("v1.safetensors"), 1, {}, ReplaceFolder::if_nothing_lost, 1);
    EXPECT_TRUE(f.fast_path) << f.fallback;
    EXPECT_EQ(file(fast), file(late));
    for (const auto& entry : fs::directory_iterator(dir_))  // no scratch folder left
      EXPECT_EQ(entry.path().filename().string().find(".pulse-pull."), std::string::npos) << entry.path();
    fs::remove(late);
    fs::remove(fast);
  }
}

// A state whose bytes change between the patch and the anchor is not published past the patch.
TEST_F(TempDir, AStateThatChangesWhilePublishedIsRefused) {
  Relay relay(dir_.string());
  std::vector<std::uint16_t> w1(64, 0x3F80), w2 = w1, changed;
  w2[5] ^= 1;
  changed = w2;
  changed[9] ^= 1;
  const std::vector<TensorRef> v1{{"w", "BF16", {64}, reinterpret_cast<const std::byte*>(w1.data()), 128}},
      v2{{"w", "BF16", {64}, nullptr, 128}};
  PublishOptions o;
  o.anchor_every = 2;  // version 2 gets a patch and an anchor
  relay.publish(1, v1, {}, nullptr, nullptr, o);
  int calls = 0;  // the encoder reads w2 once, the anchor writer then reads other bytes
  const TensorLoader shifting = [&](std::size_t, std::uint64_t offset, std::size_t bytes, std::byte* out) {
    std::memcpy(out, reinterpret_cast<const std::byte*>((calls++ == 0 ? w2 : changed).data()) + offset, bytes);
  };
  EXPECT_NE(error_of([&] { relay.publish(2, v2, {}, &v1, nullptr, o, shifting); }).find("changed while being published"),
            std::string::npos);
  EXPECT_EQ(relay.head()->version, 1u);
  EXPECT_FALSE(fs::exists(relay.anchor_path(2)));
}

// Issue 27, class 1: another relay's files, signed with the same key, copied into a relay.
TEST_F(TempDir, SignedRecordsBindTheRelayAndTheModel) {
  const KeyPair k = generate_keypair();
  Model a({"a.0", "a.1"}, 0x3F80), b({"b.0", "b.1"}, 0x4000);
  const std::string relay_a = path("a"), relay_b = path("b");
  const Checkpoint a4 = publish_series(relay_a, a, 4, &k.secret_key);
  publish_series(relay_b, b, 6, &k.secret_key);
  PullOptions keyed;
  keyed.public_key = &k.public_key;
  // B's HEAD, anchors and patches over A's: A's remaining records name another relay.
  for (const auto& e : fs::directory_iterator(relay_b)) fs::copy_file(e.path(), fs::path(relay_a) / e.path().filename(), fs::copy_options::overwrite_existing);
  EXPECT_NE(error_of([&] { Relay(relay_a).pull(&a4, 4, keyed); }).find("records are not all its own"), std::string::npos);
  // A replaced by B whole: consistent, but the receiver's model (a.*) has no patch chain to it.
  fs::remove_all(relay_a);
  fs::copy(relay_b, relay_a);
  const std::string moved = error_of([&] { Relay(relay_a).pull(&a4, 4, keyed); });
  EXPECT_NE(moved.find("another tensor layout"), std::string::npos) << moved;
  // Without --have the relay's model is what the reader asked for.
  EXPECT_EQ(Relay(relay_a).pull(nullptr, 0, keyed).version, 6u);
}

TEST_F(TempDir, PublishingKeepsTheRelaysSigner) {
  const KeyPair k = generate_keypair(), other = generate_keypair();
  Model m({"w"}, 0x3F80);
  Checkpoint last = publish_series(path("signed"), m, 1, &k.secret_key);
  Relay signed_relay(path("signed"));
  PublishOptions o;
  const auto v2 = m.at(2);
  EXPECT_NE(error_of([&] { signed_relay.publish(2, v2, &last.layout, o); }).find("is signed; publishing unsigned"),
            std::string::npos);
  o.encode.signing_key = &other.secret_key;
  EXPECT_NE(error_of([&] { signed_relay.publish(2, v2, &last.layout, o); }).find("another key"), std::string::npos);
  EXPECT_EQ(signed_relay.head()->version, 1u);
  o.encode.signing_key = &k.secret_key;
  signed_relay.publish(2, v2, &last.layout, o);
  EXPECT_EQ(signed_relay.head(&k.public_key)->version, 2u);
  publish_series(path("unsigned"), m, 0, nullptr);
  EXPECT_NE(error_of([&] { Relay(path("unsigned")).publish(5, v2, nullptr, o); }).find("is not signed"), std::string::npos);
}

// Issue 27, class 2: a small .zst anchor that decodes to far more than its record names.
TEST_F(TempDir, AHostileCompressedAnchorIsRefusedByItsRecordAndTheNextOneServes) {
  const KeyPair k = generate_keypair();
  Model m({"w.0", "w.1"}, 0x3F80);
  const Checkpoint last = publish_series(dir_.string(), m, 5, &k.secret_key, true);  // anchors 0, 2, 4
  Relay relay(dir_.string());
  const std::vector<std::uint8_t> zeros(64 << 20);  // 64 MiB of zeros: a few KB as zstd
  const auto bomb = compress(Compressor::zstd, 19, zeros);
  ASSERT_LT(bomb.size(), 1u << 16);
  const std::string newest = relay.anchor_path(4);
  ASSERT_EQ(newest.substr(newest.size() - 4), ".zst");
  std::ofstream(newest, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(bomb.data()), std::streamsize(bomb.size()));
  PullOptions keyed;
  keyed.public_key = &k.public_key;
  const PullResult r = relay.pull(nullptr, 0, keyed);
  EXPECT_EQ(r.version, 5u);
  EXPECT_EQ(r.anchor, 2u);  // fell back to the older anchor
  EXPECT_NE(r.fallback.find("its record names"), std::string::npos) << r.fallback;
  // The record bounds decoding too: a frame of the recorded size that declares more is refused
  // before it is decoded.
  const auto record_bytes = pulse::read_regular_file(path("anchor-2.record"), 4096, "record");
  const AnchorRecord record = parse_anchor_record(record_bytes.data(), record_bytes.size(), &k.public_key, "record");
  EXPECT_THROW(load_checkpoint(relay.anchor_path(2), record.state_bytes - 1), pulse::Error);
  EXPECT_EQ(load_checkpoint(relay.anchor_path(2), record.state_bytes).layout.size(), 2u);
  EXPECT_EQ(r.state.data, last.data);
}

// Issue 27, class 2: an anchor that does not fit in memory (std::bad_alloc while it is decoded)
// is passed over like a corrupt one, and the pull falls back to the next anchor. In a child
// process under an address-space limit of 192 MiB above what it uses: the newest anchor of an
// unsigned relay, its record removed (nothing bounds it but the machine's memory), decodes to
// 256 MiB, which the decoder's growing buffer cannot reach there.
TEST_F(TempDir, AnAnchorTooLargeForMemoryFallsBackToTheNextOne) {
  Model m({"w.0", "w.1"}, 0x3F80);
  const Checkpoint last = publish_series(dir_.string(), m, 5, nullptr, true);  // anchors 0, 2, 4
  Relay relay(dir_.string());
  {
    const std::vector<std::uint8_t> zeros(256u << 20);
    const auto big = compress(Compressor::zstd, 1, zeros);
    std::ofstream(relay.anchor_path(4), std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char*>(big.data()), std::streamsize(big.size()));
  }
  ASSERT_TRUE(fs::remove(path(anchor_record_name(4))));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // exit status: 0 fell back as expected, 1 did not, 2 threw, 3 no limit set
    long pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    const rlim_t limit = rlim_t(pages) * rlim_t(sysconf(_SC_PAGESIZE)) + (rlim_t(192) << 20);
    const rlimit cap{limit, limit};
    if (pages <= 0 || setrlimit(RLIMIT_AS, &cap) != 0) _exit(3);
    try {
      const PullResult r = relay.pull(nullptr, 0);
      const bool ok = r.version == 5 && r.anchor == 2 && r.state.data == last.data &&
                      r.fallback.find("anchor 4: out of memory") != std::string::npos;
      if (!ok) std::fprintf(stderr, "anchor %llu, fallback: %s\n", (unsigned long long)r.anchor, r.fallback.c_str());
      _exit(ok ? 0 : 1);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "pull: %s\n", e.what());
      _exit(2);
    }
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  // Without the limit the 256 MiB are decoded, and refused as what they are (not a checkpoint).
  const PullResult unlimited = relay.pull(nullptr, 0);
  EXPECT_EQ(unlimited.anchor, 2u);
  EXPECT_EQ(unlimited.fallback.find("out of memory"), std::string::npos) << unlimited.fallback;
}

// Issue 27, class 6: folders (and links) with relay file names are not the relay's: a publish
// neither trips over them (a folder named like a temporary file, or like an anchor retention
// would delete after HEAD moved) nor deletes them.
TEST_F(TempDir, FoldersWithRelayNamesAreNeitherUsedNorDeleted) {
  Model m({"w"}, 0x3F80);
  for (const char* name : {"HEAD.tmp.abc123", "anchor-0.safetensors.zst"}) {
    fs::create_directories(dir_ / name);
    write(std::string(name) + "/inside", "kept");
  }
  Relay relay(dir_.string());
  PublishOptions o;
  o.anchor_every = 1;
  o.keep_anchors = 1;
  Checkpoint previous;
  for (std::uint64_t v = 0; v <= 3; ++v) {
    Checkpoint now = copy_of(m.at(v));
    EXPECT_NO_THROW(relay.publish(v, now.layout, v ? &previous.layout : nullptr, o)) << v;
    previous = std::move(now);
  }
  EXPECT_EQ(relay.head()->version, 3u);
  EXPECT_TRUE(fs::exists(dir_ / "HEAD.tmp.abc123" / "inside"));
  EXPECT_TRUE(fs::exists(dir_ / "anchor-0.safetensors.zst" / "inside"));
  EXPECT_FALSE(fs::exists(dir_ / "anchor-2.safetensors"));  // retention went on around them
  EXPECT_EQ(relay.pull(nullptr, 0).state.data, previous.data);
}

}  // namespace
