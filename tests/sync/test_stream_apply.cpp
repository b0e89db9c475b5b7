// Streamed file-to-file apply (sync/file_apply.hpp): on every thread count the output is the
// target file byte for byte (raw, keydiff and expclass patches; a tensor of several chunks,
// tensors unchanged, carried whole and empty; file order unlike name order), and a patch that
// fails in the middle of the stream or a base that is not the patch's leaves no output, an
// existing output as it was and no temporary file. With many small parts (spanning tensors and
// cut inside them), encode (in memory and streamed) and apply (file to file, in place, folder to
// folder) give the same bytes on 1, 2 and 3 threads, and so does a streamed encode that reads a
// long segment in pieces. A changed tensor whose segment is too long to read into a buffer is
// copied first, to the same bytes. Also DigestStream and FlushBehind, which it uses.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "core/flush_behind.hpp"
#include "io/safetensors.hpp"
#include "sync/checkpoint.hpp"
#include "sync/file_apply.hpp"
#include "sync/patch.hpp"
#include "sync/streamed_state.hpp"

using namespace pulse;
using namespace pulse::sync;
namespace fs = std::filesystem;

namespace {

struct Tensor {
  std::string name;
  io::DType dtype;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> bytes;
};

std::vector<std::byte> random_bytes(std::mt19937& rng, std::size_t n) {
  std::vector<std::byte> out(n);
  for (auto& b : out) b = std::byte(rng() & 0xFF);
  return out;
}

// In file order, which is not name order. "a.big" spans several of apply_file's 4 MiB chunks.
std::vector<Tensor> make_base(std::mt19937& rng) {
  std::vector<Tensor> t = {{"b.mid", io::DType::BF16, {1000, 37}, {}}, {"d.step", io::DType::I64, {1}, {}},
                           {"a.big", io::DType::BF16, {5, 1 << 20}, {}},  {"f.same", io::DType::BF16, {512}, {}},
                           {"c.f32", io::DType::F32, {4096}, {}},         {"e.empty", io::DType::BF16, {0}, {}}};
  for (auto& x : t) {
    std::int64_t n = 1;
    for (auto d : x.shape) n *= d;
    x.bytes = random_bytes(rng, std::size_t(n) * io::dtype_size(x.dtype));
  }
  return t;
}

// About 1% of the floating-point elements of a.big, b.mid and c.f32 changed; d.step changed
// (carried whole); e.empty and f.same as they were.
std::vector<Tensor> make_target(std::vector<Tensor> t, std::mt19937& rng) {
  for (auto& x : t) {
    if (x.name == "d.step") x.bytes[0] ^= std::byte(1);
    if (x.name != "a.big" && x.name != "b.mid" && x.name != "c.f32") continue;
    const std::size_t width = io::dtype_size(x.dtype);
    for (std::size_t i = 0; i < x.bytes.size() / width; ++i)
      if (rng() % 100 == 0) x.bytes[i * width] ^= std::byte(1 + rng() % 255);
  }
  return t;
}

std::vector<TensorRef> refs(const std::vector<Tensor>& s) {
  std::vector<TensorRef> out;
  for (const auto& t : s) out.push_back({t.name, io::dtype_name(t.dtype), t.shape, t.bytes.data(), t.bytes.size()});
  return out;
}

void write(const std::string& path, const std::vector<Tensor>& s) {
  std::vector<io::TensorToWrite> w;
  for (const auto& t : s) w.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  io::write_safetensors(path, w, {{"format", "pt"}});
}

std::string read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

void rechecksum(std::vector<std::uint8_t>& patch) {  // unsigned: the checksum is the last 16 bytes
  const Digest d = digest_bytes(patch.data(), patch.size() - sizeof(Digest));
  std::memcpy(patch.data() + patch.size() - d.size(), d.data(), d.size());
}

std::uint64_t u64_at(const std::vector<std::uint8_t>& bytes, std::size_t at) {
  std::uint64_t v = 0;
  std::memcpy(&v, bytes.data() + at, sizeof v);  // little-endian, as the format and this machine
  return v;
}

class StreamApply : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("pulse_stream_apply_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::mt19937 rng(16);
    base_ = make_base(rng);
    target_ = make_target(base_, rng);
    write(path("base.safetensors"), base_);
    write(path("target.safetensors"), target_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::vector<std::uint8_t> encode(const EncodeOptions& o) const {
    return encode_patch(refs(base_), refs(target_), o, nullptr, nullptr, {{"format", "pt"}}, {{"format", "pt"}});
  }
  // Applying fails with pulse::Error (whose message contains `says`), writes no output, leaves
  // an existing one as it was and no temporary file.
  void expect_refused(const std::string& base, const std::vector<std::uint8_t>& bytes, const std::string& says) {
    const ParsedPatch patch = parse_patch(bytes.data(), bytes.size());
    for (unsigned threads : {1u, 3u}) {
      try {
        apply_file(base, patch, path("absent.safetensors"), threads);
        ADD_FAILURE() << "applied, threads " << threads;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      }
      EXPECT_FALSE(fs::exists(path("absent.safetensors")));
      { std::ofstream(path("existing.safetensors")) << "the old output"; }
      EXPECT_THROW(apply_file(base, patch, path("existing.safetensors"), threads), Error);
      EXPECT_EQ(read(path("existing.safetensors")), "the old output");
      for (const auto& entry : fs::directory_iterator(dir_))
        EXPECT_EQ(entry.path().filename().string().find(".tmp."), std::string::npos) << entry.path();
    }
  }
  fs::path dir_;
  std::vector<Tensor> base_, target_;
};

TEST_F(StreamApply, OutputIsTheTargetFileOnEveryThreadCount) {
  EncodeOptions raw;
  raw.values = ValueCoding::raw;
  for (const EncodeOptions& options : {raw, EncodeOptions{}, exponent_class_options()}) {
    const auto bytes = encode(options);
    const ParsedPatch patch = parse_patch(bytes.data(), bytes.size());
    for (unsigned threads : {1u, 2u, 3u, 8u}) {
      const std::uint64_t written = apply_file(path("base.safetensors"), patch, path("out.safetensors"), threads);
      EXPECT_EQ(read(path("out.safetensors")), read(path("target.safetensors")))
          << value_coding_name(options.values) << ", threads " << threads;
      EXPECT_EQ(written, patch.header.total_changed + 8);  // the changed elements and d.step's bytes
    }
  }
}

TEST_F(StreamApply, InPlaceGivesTheTarget) {
  const auto bytes = encode(exponent_class_options());
  const ParsedPatch patch = parse_patch(bytes.data(), bytes.size());
  fs::copy_file(path("base.safetensors"), path("model.safetensors"));
  apply_file(path("model.safetensors"), patch, path("model.safetensors"), 2);
  EXPECT_EQ(read(path("model.safetensors")), read(path("target.safetensors")));
}

// Parts of 4096 elements: a.big in 1280 parts, b.mid in 10 (its last with c.f32's first ...).
// The bytes at 2 and 3 threads are those at 1; the streamed encode's are the in-memory one's;
// every apply gives the target, file and folder alike.
TEST_F(StreamApply, ManyPartsGiveTheSameBytesOnEveryThreadCount) {
  // The folders: the tensors in two shards, an index and a config file.
  auto folder = [&](const std::string& name, const std::vector<Tensor>& s) {
    const fs::path d = dir_ / name;
    fs::create_directories(d);
    std::vector<Tensor> first(s.begin(), s.begin() + 3), second(s.begin() + 3, s.end());
    write((d / "model-00001-of-00002.safetensors").string(), first);
    write((d / "model-00002-of-00002.safetensors").string(), second);
    std::string map;
    for (std::size_t i = 0; i < s.size(); ++i)
      map += (i ? ", \"" : "\"") + s[i].name + "\": \"model-0000" + (i < 3 ? "1" : "2") + "-of-00002.safetensors\"";
    std::ofstream(d / "model.safetensors.index.json") << "{\"metadata\": {}, \"weight_map\": {" + map + "}}";
    std::ofstream(d / "config.json") << "{\"hidden_size\": 3}";
    return d.string();
  };
  const std::string base_dir = folder("base_dir", base_), target_dir = folder("target_dir", target_);
  const OpenState base_whole = open_state(base_dir), target_whole = open_state(target_dir);
  const StreamedState base_streamed = StreamedState::open(base_dir), target_streamed = StreamedState::open(target_dir);
  EncodeOptions raw;
  raw.values = ValueCoding::raw;
  for (EncodeOptions options : {raw, EncodeOptions{}, exponent_class_options()}) {
    options.part_elements = 4096;
    const std::string coding = value_coding_name(options.values);
    options.threads = 1;
    const auto file_patch = encode(options);
    const auto folder_patch = encode_patch(base_whole.flat.tensors, target_whole.flat.tensors, options, nullptr, nullptr,
                                           base_whole.flat.metadata, target_whole.flat.metadata);
    const ParsedPatch parsed = parse_patch(file_patch.data(), file_patch.size());
    ASSERT_GT(parsed.parts.size(), 1000u) << coding;
    const ParsedPatch folder_parsed = parse_patch(folder_patch.data(), folder_patch.size());
    for (unsigned threads : {1u, 2u, 3u}) {
      const std::string at = coding + ", threads " + std::to_string(threads);
      options.threads = threads;
      EXPECT_EQ(encode(options), file_patch) << at;
      EXPECT_EQ(encode_patch(base_streamed.tensors(), target_streamed.tensors(), options, nullptr, nullptr,
                             base_streamed.metadata(), target_streamed.metadata(), base_streamed.loader(),
                             target_streamed.loader()),
                folder_patch)
          << at;
      apply_file(path("base.safetensors"), parsed, path("out.safetensors"), threads);
      EXPECT_EQ(read(path("out.safetensors")), read(path("target.safetensors"))) << at;
      fs::copy_file(path("base.safetensors"), path("model.safetensors"), fs::copy_options::overwrite_existing);
      apply_file(path("model.safetensors"), parsed, path("model.safetensors"), threads);
      EXPECT_EQ(read(path("model.safetensors")), read(path("target.safetensors"))) << at;
      const std::string out_dir = (dir_ / "out_dir").string();
      apply_folder(open_state(base_dir, io::ShardBytes::header_only), folder_parsed, out_dir,
                   ReplaceFolder::any_model, threads);
      for (const char* file : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                               "model.safetensors.index.json", "config.json"})
        EXPECT_EQ(read(out_dir + "/" + file), read(target_dir + "/" + file)) << at << ", " << file;
    }
  }
}

// A changed tensor with a segment longer than the apply reads into a buffer (64 MiB; an older or
// another encoder's parts) is copied into the output first and patched there, while the other
// changed tensors of the same part are read from the base segment by segment: g.long, 66 MiB of
// BF16, in one part with the rest. The output is the target file on 1 and 2 threads, and in place.
TEST_F(StreamApply, SegmentOverTheBufferIsCopiedFirstToTheSameBytes) {
  std::mt19937 rng(26);
  std::vector<Tensor> base = base_, target = target_;
  Tensor long_tensor{"g.long", io::DType::BF16, {33, 1 << 20}, std::vector<std::byte>(std::size_t(33) << 21)};
  for (std::size_t i = 0; i < long_tensor.bytes.size(); i += 4) {
    const std::uint32_t r = rng();
    std::memcpy(long_tensor.bytes.data() + i, &r, 4);
  }
  base.push_back(long_tensor);
  for (std::size_t i = 0; i < long_tensor.bytes.size(); i += 2)
    if (i % 200 == 0) long_tensor.bytes[i] ^= std::byte(1 + i % 255);  // 1% of the elements
  target.push_back(long_tensor);
  write(path("long_base.safetensors"), base);
  write(path("long_target.safetensors"), target);
  EncodeOptions options;
  options.part_elements = std::uint64_t(1) << 26;
  const auto bytes =
      encode_patch(refs(base), refs(target), options, nullptr, nullptr, {{"format", "pt"}}, {{"format", "pt"}});
  const ParsedPatch patch = parse_patch(bytes.data(), bytes.size());
  ASSERT_EQ(patch.parts.size(), 1u);  // g.long's segment is the whole tensor
  for (unsigned threads : {1u, 2u}) {
    apply_file(path("long_base.safetensors"), patch, path("out.safetensors"), threads);
    EXPECT_EQ(read(path("out.safetensors")), read(path("long_target.safetensors"))) << "threads " << threads;
    fs::copy_file(path("long_base.safetensors"), path("model.safetensors"), fs::copy_options::overwrite_existing);
    apply_file(path("model.safetensors"), patch, path("model.safetensors"), threads);
    EXPECT_EQ(read(path("model.safetensors")), read(path("long_target.safetensors"))) << "threads " << threads;
  }
}

// The last byte of the keydiff value stream (uncompressed) made a varint that runs past the
// stream's end, checksum fixed: parse_patch accepts it; the decoder fails at c.f32, the last
// sparse entry by name, after a.big and b.mid were decoded and written.
// A streamed state's segment is read in 1 MiB pieces where it is not ranked (raw, keydiff):
// a.big's one segment of 5 Mi elements in 10. The bytes and the target's digests are the
// in-memory encode's, with the base's digests hashed or known, on 1 and 2 threads.
TEST_F(StreamApply, StreamedEncodeReadsLongSegmentsInPiecesToTheSameBytes) {
  const StreamedState base = StreamedState::open(path("base.safetensors")),
                      target = StreamedState::open(path("target.safetensors"));
  const StateDigests base_digests = compute_digests(refs(base_));
  EncodeOptions raw;
  raw.values = ValueCoding::raw;
  for (EncodeOptions options : {raw, EncodeOptions{}, exponent_class_options()})
    for (const StateDigests* known : {static_cast<const StateDigests*>(nullptr), &base_digests})
      for (unsigned threads : {1u, 2u}) {
        const std::string at = std::string(value_coding_name(options.values)) + (known ? ", digests known" : "") +
                               ", threads " + std::to_string(threads);
        options.threads = threads;
        StateDigests in_memory, streamed;
        const auto expected = encode_patch(refs(base_), refs(target_), options, known, &in_memory, {{"format", "pt"}},
                                           {{"format", "pt"}});
        EXPECT_EQ(encode_patch(base.tensors(), target.tensors(), options, known, &streamed, base.metadata(),
                               target.metadata(), base.loader(), target.loader()),
                  expected)
            << at;
        EXPECT_EQ(streamed.tensors, in_memory.tensors) << at;
        EXPECT_EQ(streamed.state, state_digest(refs(target_), {{"format", "pt"}})) << at;
      }
}

TEST_F(StreamApply, PatchFailingMidStreamLeavesNothing) {
  EncodeOptions options;
  options.compressor = Compressor::none;
  auto bytes = encode(options);
  const std::size_t table_end = pulse::sync::patch_fixed_header_bytes + u64_at(bytes, 128);
  const std::size_t value_end = table_end + u64_at(bytes, 80) + u64_at(bytes, 96);
  bytes[value_end - 1] = 0xFF;
  rechecksum(bytes);
  expect_refused(path("base.safetensors"), bytes, "patch stream ends inside a varint");
}

// A byte near the end of the expclass value stream flipped, checksum fixed: every tensor
// decodes (into other values) and is written; the target digest refuses the output.
TEST_F(StreamApply, PatchFailingAfterTheLastTensorLeavesNothing) {
  auto bytes = encode(exponent_class_options());
  const std::size_t table_end = pulse::sync::patch_fixed_header_bytes + u64_at(bytes, 128);
  const std::size_t value_begin = table_end + u64_at(bytes, 80);
  const std::size_t value_size = u64_at(bytes, 96);
  bytes[value_begin + value_size - 4] ^= 0x5A;
  rechecksum(bytes);
  expect_refused(path("base.safetensors"), bytes, "target state digest");
}

// A base with the patch's layout but other bytes in its last tensor by name (no entry reads
// it), or in a tensor the decoder reads: refused as not the patch's base, whatever the decoder
// made of it.
TEST_F(StreamApply, WrongBaseIsNamedAndLeavesNothing) {
  const auto bytes = encode(EncodeOptions{});
  for (const std::string changed : {"f.same", "c.f32"}) {
    auto other = base_;
    for (auto& t : other)
      if (t.name == changed)
        for (auto& b : t.bytes) b ^= std::byte(0x40);
    write(path("other.safetensors"), other);
    expect_refused(path("other.safetensors"), bytes, "not the patch's base");
  }
}

// The writers hash tensors in pieces: any split gives digest_bytes of the whole.
TEST(DigestStream, PiecesHashAsTheirConcatenation) {
  std::mt19937 rng(3);
  const std::vector<std::byte> bytes = random_bytes(rng, (std::size_t(1) << 20) + 37);
  for (std::size_t piece : {std::size_t(1), std::size_t(240), std::size_t(128) << 10, bytes.size()}) {
    DigestStream stream;
    for (std::size_t at = 0; at < bytes.size(); at += piece)
      stream.update(bytes.data() + at, std::min(piece, bytes.size() - at));
    EXPECT_EQ(stream.finish(), digest_bytes(bytes.data(), bytes.size())) << "pieces of " << piece;
  }
  EXPECT_EQ(DigestStream().finish(), digest_bytes(nullptr, 0));
}

// Flushing behind a writer leaves the file's bytes as written, whether it flushed (more than
// FlushBehind::kFlushBytes finished), stopped with ranges left, or had no folder to sync.
TEST_F(StreamApply, FlushBehindLeavesTheBytesWritten) {
  std::mt19937 rng(5);
  const std::vector<std::byte> bytes = random_bytes(rng, std::size_t(FlushBehind::kFlushBytes) + (3 << 20));
  for (const std::string folder : {dir_.string(), path("absent")}) {
    const std::string file = path("flushed");
    {
      AtomicFile out(file);
      FlushBehind flush(out.fd(), folder);
      for (std::size_t at = 0, piece = 1 << 20; at < bytes.size(); at += piece) {
        const std::size_t length = std::min(piece, bytes.size() - at);
        ASSERT_EQ(::pwrite(out.fd(), bytes.data() + at, length, off_t(at)), ssize_t(length));
        flush.finished(at, length);
      }
      out.commit();
    }
    const std::string written = read(file);
    ASSERT_EQ(written.size(), bytes.size());
    EXPECT_EQ(std::memcmp(written.data(), bytes.data(), bytes.size()), 0) << folder;
  }
}

}  // namespace
