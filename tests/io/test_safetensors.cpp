// safetensors reader and writer: round trips of every dtype, bit-exact BF16, header layout,
// every validation failure of an untrusted header, truncations, and atomic writes.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "core/error.hpp"
#include "io/safetensors.hpp"

namespace fs = std::filesystem;
using pulse::io::DType;

namespace {

// Every dtype of safetensors' Dtype enum, with its size in bits (safetensors/src/tensor.rs).
const std::vector<DType> kAllDTypes{DType::BOOL,    DType::F4,          DType::F6_E2M3,     DType::F6_E3M2,
                                    DType::U8,      DType::I8,          DType::F8_E5M2,     DType::F8_E4M3,
                                    DType::F8_E8M0, DType::F8_E4M3FNUZ, DType::F8_E5M2FNUZ, DType::I16,
                                    DType::U16,     DType::F16,         DType::BF16,        DType::I32,
                                    DType::U32,     DType::F32,         DType::C64,         DType::F64,
                                    DType::I64,     DType::U64};
const std::vector<std::size_t> kBits{8, 4, 6, 6, 8, 8, 8, 8, 8, 8, 8, 16, 16, 16, 16, 32, 32, 32, 64, 64, 64, 64};

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "pulse_safetensors_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A file from a header text and a data section, with the header padded as writers do.
std::string make_file(std::string header, const std::string& data, bool pad = true) {
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(std::uint64_t(header.size()) >> (8 * i));
  return out + header + data;
}

pulse::io::ParsedHeader parse(const std::string& file, const pulse::io::SafetensorsLimits& limits = {}) {
  return pulse::io::parse_header(reinterpret_cast<const std::byte*>(file.data()), file.size(), limits, "t.st");
}

// The header must be rejected with a one-line pulse::Error naming the source and the problem.
void expect_rejected(const std::string& file, const std::string& problem,
                     const pulse::io::SafetensorsLimits& limits = {}) {
  try {
    parse(file, limits);
    ADD_FAILURE() << "accepted; expected an error containing '" << problem << "'";
  } catch (const pulse::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(problem), std::string::npos) << what;
    EXPECT_NE(what.find("'t.st'"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

std::vector<std::byte> random_bytes(std::size_t n, std::mt19937& rng) {
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

const std::string kEntry = R"({"dtype":"BF16","shape":[2],"data_offsets":[0,4]})";

}  // namespace

TEST(SafetensorsDType, NamesAndSizes) {
  for (std::size_t i = 0; i < kAllDTypes.size(); ++i) {
    EXPECT_EQ(pulse::io::parse_dtype(pulse::io::dtype_name(kAllDTypes[i])), kAllDTypes[i]);
    EXPECT_EQ(pulse::io::dtype_bits(kAllDTypes[i]), kBits[i]) << pulse::io::dtype_name(kAllDTypes[i]);
  }
  EXPECT_STREQ(pulse::io::dtype_name(DType::F8_E4M3), "F8_E4M3");
  EXPECT_STREQ(pulse::io::dtype_name(DType::F8_E8M0), "F8_E8M0");
  EXPECT_STREQ(pulse::io::dtype_name(DType::F6_E2M3), "F6_E2M3");
  EXPECT_THROW(pulse::io::parse_dtype("bf16"), pulse::Error);
  EXPECT_THROW(pulse::io::dtype_size(DType::F4), pulse::Error);
  // Sub-byte tensors fill whole bytes: 2 F4 per byte, 4 F6 per 3 bytes; anything else is refused.
  std::size_t bytes = 0;
  EXPECT_TRUE(pulse::io::tensor_bytes(DType::F4, 6, bytes) && bytes == 3);
  EXPECT_TRUE(pulse::io::tensor_bytes(DType::F6_E3M2, 8, bytes) && bytes == 6);
  EXPECT_FALSE(pulse::io::tensor_bytes(DType::F4, 5, bytes));
  EXPECT_FALSE(pulse::io::tensor_bytes(DType::F6_E2M3, 6, bytes));
}

TEST(SafetensorsHeader, SubByteTensorThatDoesNotFillWholeBytesIsRejected) {
  // 3 F4 elements are 12 bits: safetensors refuses such a tensor (MisalignedSlice); so does pulse.
  expect_rejected(make_file(R"({"x":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", std::string(2, '\0')),
                  "do not fill whole bytes");
  EXPECT_NO_THROW(parse(make_file(R"({"x":{"dtype":"F6_E3M2","shape":[4],"data_offsets":[0,3]}})", std::string(3, '\0'))));
}

TEST_F(Safetensors, RoundTripEveryDTypeWithMetadata) {
  std::mt19937 rng(1);
  std::vector<std::vector<std::byte>> data;
  std::vector<pulse::io::TensorToWrite> tensors;
  for (DType d : kAllDTypes) {
    data.push_back(random_bytes(2 * 4 * pulse::io::dtype_bits(d) / 8, rng));
    tensors.push_back({std::string("t.") + pulse::io::dtype_name(d), d, {2, 4}, data.back().data(), data.back().size()});
  }
  const std::map<std::string, std::string> meta{{"format", "pt"}, {"step", "12"}, {"ünï", "cödé \"q\"\n"}};
  pulse::io::write_safetensors(path("all.safetensors"), tensors, meta);

  const auto file = pulse::io::SafetensorsFile::open(path("all.safetensors"));
  EXPECT_EQ(file.metadata(), meta);
  ASSERT_EQ(file.tensors().size(), tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = file.tensors()[i];  // written order is data-offset order
    EXPECT_EQ(t.name, tensors[i].name);
    EXPECT_EQ(t.dtype, tensors[i].dtype);
    EXPECT_EQ(t.shape, (std::vector<std::int64_t>{2, 4}));
    ASSERT_EQ(t.bytes, data[i].size());
    EXPECT_EQ(std::memcmp(t.data, data[i].data(), t.bytes), 0) << t.name;
    EXPECT_EQ(file.find(t.name), &t);
  }
  EXPECT_EQ(file.find("t.nope"), nullptr);
}

TEST_F(Safetensors, EmptyScalarAndZeroTensors) {
  const float scalar = -0.0f;
  pulse::io::write_safetensors(path("e.safetensors"), {{"empty", DType::BF16, {0}, nullptr, 0},
                                                        {"scalar", DType::F32, {}, &scalar, 4},
                                                        {"empty2", DType::F16, {3, 0, 2}, nullptr, 0},
                                                        {"empty3", DType::U8, {0}, nullptr, 0}});
  const auto file = pulse::io::SafetensorsFile::open(path("e.safetensors"));
  ASSERT_EQ(file.tensors().size(), 4u);
  // Empty tensors at the same offset keep the order they were written in.
  EXPECT_EQ(file.tensors()[0].name, "empty");
  EXPECT_EQ(file.tensors()[1].name, "scalar");
  EXPECT_EQ(file.tensors()[2].name, "empty2");
  EXPECT_EQ(file.tensors()[3].name, "empty3");
  EXPECT_TRUE(file.tensors()[1].shape.empty());
  EXPECT_EQ(std::memcmp(file.tensors()[1].data, &scalar, 4), 0);
  EXPECT_EQ(file.tensors()[2].shape, (std::vector<std::int64_t>{3, 0, 2}));
  EXPECT_EQ(file.tensors()[2].bytes, 0u);

  pulse::io::write_safetensors(path("none.safetensors"), {});
  const auto none = pulse::io::SafetensorsFile::open(path("none.safetensors"));
  EXPECT_TRUE(none.tensors().empty());
  EXPECT_TRUE(none.metadata().empty());
  EXPECT_EQ(read_file(path("none.safetensors")), make_file("{}", ""));
}

TEST_F(Safetensors, ManyTensors) {
  constexpr int n = 20000;
  std::vector<std::uint16_t> values(n);
  std::vector<pulse::io::TensorToWrite> tensors;
  for (int i = 0; i < n; ++i) {
    values[i] = static_cast<std::uint16_t>(i * 7);
    tensors.push_back({"layer." + std::to_string(n - i) + ".w", DType::BF16, {1}, &values[i], 2});
  }
  pulse::io::write_safetensors(path("many.safetensors"), tensors);
  const auto file = pulse::io::SafetensorsFile::open(path("many.safetensors"));
  ASSERT_EQ(file.tensors().size(), std::size_t(n));
  for (int i = 0; i < n; i += 997) {
    const auto* t = file.find(tensors[i].name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t, &file.tensors()[i]);
    std::uint16_t v;
    std::memcpy(&v, t->data, 2);
    EXPECT_EQ(v, values[i]);
  }
  pulse::io::SafetensorsLimits limits;
  limits.max_tensors = n - 1;
  EXPECT_THROW(pulse::io::SafetensorsFile::open(path("many.safetensors"), limits), pulse::Error);
}

TEST_F(Safetensors, EveryBF16BitPatternSurvives) {
  std::vector<std::uint16_t> bits(1 << 16);
  for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<std::uint16_t>(i);  // NaN payloads, -0, subnormals
  pulse::io::write_safetensors(path("bf16.safetensors"), {{"w", DType::BF16, {256, 256}, bits.data(), bits.size() * 2}});
  const auto file = pulse::io::SafetensorsFile::open(path("bf16.safetensors"));
  const auto* w = file.find("w");
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(w->bytes, bits.size() * 2);
  EXPECT_EQ(std::memcmp(w->data, bits.data(), w->bytes), 0);
}

TEST_F(Safetensors, HeaderLayoutIsHuggingFaces) {
  const std::uint16_t a[3] = {1, 2, 3};
  const std::uint8_t b[1] = {9};
  pulse::io::write_safetensors(path("l.safetensors"),
                               {{"z", DType::BF16, {3}, a, 6}, {"a", DType::U8, {1, 1}, b, 1}}, {{"k", "v"}});
  const std::string expected_header =
      R"({"__metadata__":{"k":"v"},"z":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]},)"
      R"("a":{"dtype":"U8","shape":[1,1],"data_offsets":[6,7]}})";
  const std::string data("\x01\x00\x02\x00\x03\x00\x09", 7);
  const std::string file = read_file(path("l.safetensors"));
  EXPECT_EQ(file, make_file(expected_header, data));
  EXPECT_EQ((file.size() - data.size()) % 8, 0u);  // data section starts 8-aligned
}

TEST_F(Safetensors, ReaderAcceptsAnyKeyOrderUnpaddedHeadersAndNullMetadata) {
  // Keys not in offset order, metadata last and null, an unknown field, no padding.
  const std::string header =
      R"({"b":{"data_offsets":[2,4],"shape":[1],"dtype":"F16","extra":[1]},)"
      R"("a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"__metadata__":null})";
  write_file(path("o.safetensors"), make_file(header, "ABCD", false));
  const auto file = pulse::io::SafetensorsFile::open(path("o.safetensors"));
  ASSERT_EQ(file.tensors().size(), 2u);
  EXPECT_EQ(file.tensors()[0].name, "a");
  EXPECT_EQ(file.tensors()[1].name, "b");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(file.tensors()[1].data), 2), "CD");
  EXPECT_TRUE(file.metadata().empty());
}

// open_header reads the header only: the same tensors and metadata, no data, and file offsets
// at which the file's own bytes are the tensors' bytes; a header past the file's end is refused.
TEST_F(Safetensors, HeaderOnlyOpenGivesOffsetsIntoTheFile) {
  std::mt19937 rng(2);
  const auto a = random_bytes(24, rng), b = random_bytes(6, rng);
  pulse::io::write_safetensors(path("h.safetensors"), {{"a", DType::F32, {2, 3}, a.data(), a.size()},
                                                       {"b", DType::BF16, {3}, b.data(), b.size()}},
                               {{"format", "pt"}});
  const auto whole = pulse::io::SafetensorsFile::open(path("h.safetensors"));
  const auto head = pulse::io::SafetensorsFile::open_header(path("h.safetensors"));
  EXPECT_EQ(head.metadata(), whole.metadata());
  std::ifstream in(path("h.safetensors"), std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(head.tensors().size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    const auto &h = head.tensors()[i], &w = whole.tensors()[i];
    EXPECT_EQ(h.name, w.name);
    EXPECT_EQ(h.dtype, w.dtype);
    EXPECT_EQ(h.shape, w.shape);
    EXPECT_EQ(h.bytes, w.bytes);
    EXPECT_EQ(h.data, nullptr);
    EXPECT_EQ(h.file_offset, w.file_offset);
    ASSERT_LE(h.file_offset + h.bytes, file.size());
    EXPECT_EQ(std::memcmp(file.data() + h.file_offset, w.data, w.bytes), 0) << h.name;
  }
  std::ofstream(path("short.safetensors"), std::ios::binary) << file.substr(0, 20);
  EXPECT_THROW(pulse::io::SafetensorsFile::open_header(path("short.safetensors")), pulse::Error);
}

TEST_F(Safetensors, MovedFileKeepsItsViews) {
  const std::uint16_t v[2] = {0x7FC1, 0xFFFF};
  pulse::io::write_safetensors(path("m.safetensors"), {{"w", DType::BF16, {2}, v, 4}});
  auto first = pulse::io::SafetensorsFile::open(path("m.safetensors"));
  const std::byte* data = first.tensors()[0].data;
  pulse::io::SafetensorsFile second = std::move(first);
  EXPECT_EQ(second.tensors()[0].data, data);
  EXPECT_EQ(std::memcmp(second.find("w")->data, v, 4), 0);
  second = pulse::io::SafetensorsFile::open(path("m.safetensors"));
  EXPECT_EQ(std::memcmp(second.find("w")->data, v, 4), 0);
}

TEST(SafetensorsValidation, LengthField) {
  for (std::size_t n = 0; n < 8; ++n) expect_rejected(std::string(n, '\0'), "shorter than the 8-byte header length");
  std::string file = make_file(kEntry, "abcd");
  file[0] = static_cast<char>(file[0] + 8);  // header length past the end of the file
  expect_rejected(file, "runs past the end of the file");
  file[7] = '\x80';
  expect_rejected(file, "exceeds the limit");
  pulse::io::SafetensorsLimits small;
  small.max_header_bytes = 16;
  expect_rejected(make_file(kEntry, "abcd"), "exceeds the limit of 16 bytes", small);
}

TEST(SafetensorsValidation, JsonAndStructure) {
  expect_rejected(make_file("{\"a\xff\":" + kEntry + "}", "abcd"), "UTF-8");
  expect_rejected(make_file("{\"a\":", ""), "not valid UTF-8 JSON");
  expect_rejected(make_file("{}\x01", ""), "JSON");
  expect_rejected(make_file("[]", ""), "not a JSON object");
  expect_rejected(make_file("\"x\"", ""), "not a JSON object");
  expect_rejected(make_file(R"({"a":1})", ""), "tensor 'a': entry is not an object");
  expect_rejected(make_file(R"({"a":{"dtype":"U8","shape":[[1]],"data_offsets":[0,1]}})", "x"), "nests deeper");
  expect_rejected(make_file(R"({"a":)" + kEntry + R"(,"a":)" + kEntry + "}", "abcd"), "duplicate key 'a'");
  expect_rejected(make_file(R"({"a":{"dtype":"BF16","dtype":"BF16","shape":[2],"data_offsets":[0,4]}})", "abcd"),
                  "duplicate key 'dtype'");
  expect_rejected(make_file(R"({"__metadata__":{"k":1}})", ""), "__metadata__ value of 'k' is not a string");
  expect_rejected(make_file(R"({"__metadata__":["k"]})", ""), "__metadata__ is not an object");
  expect_rejected(make_file(R"({"__metadata__":{"k":"a","k":"b"}})", ""), "duplicate key 'k'");
  // A name with a newline is escaped, so the error stays one line.
  expect_rejected(make_file(R"({"a\nb":1})", ""), "tensor 'a\\x0Ab': entry is not an object");
}

TEST(SafetensorsValidation, EntryFields) {
  auto entry = [](const std::string& fields) { return make_file("{\"a\":{" + fields + "}}", "abcd"); };
  expect_rejected(entry(R"("shape":[2],"data_offsets":[0,4])"), "tensor 'a': missing \"dtype\"");
  expect_rejected(entry(R"("dtype":"BF16","data_offsets":[0,4])"), "missing \"shape\"");
  expect_rejected(entry(R"("dtype":"BF16","shape":[2])"), "missing \"data_offsets\"");
  expect_rejected(entry(R"("dtype":2,"shape":[2],"data_offsets":[0,4])"), "dtype is not a string");
  expect_rejected(entry(R"("dtype":"BF17","shape":[2],"data_offsets":[0,4])"), "unknown dtype 'BF17'");
  expect_rejected(entry(R"("dtype":"BF16","shape":2,"data_offsets":[0,4])"), "shape is not an array");
  expect_rejected(entry(R"("dtype":"BF16","shape":[-2],"data_offsets":[0,4])"), "negative dimension");
  expect_rejected(entry(R"("dtype":"BF16","shape":[2.0],"data_offsets":[0,4])"), "dimension 2.0 is not an integer");
  expect_rejected(entry(R"("dtype":"BF16","shape":["2"],"data_offsets":[0,4])"), "is not an integer");
  expect_rejected(entry(R"("dtype":"BF16","shape":[9223372036854775808],"data_offsets":[0,4])"), "too large");
  expect_rejected(entry(R"("dtype":"BF16","shape":[4294967296,4294967296,2],"data_offsets":[0,4])"),
                  "shape product overflows");
  expect_rejected(entry(R"("dtype":"BF16","shape":[4611686018427387904,2],"data_offsets":[0,4])"),
                  "shape product overflows");  // the element count fits, the byte count does not
  expect_rejected(entry(R"("dtype":"BF16","shape":[1,1,1,1,1,1,1,1,2],"data_offsets":[0,4])"),
                  "rank 9 exceeds the limit 8");
  expect_rejected(entry(R"("dtype":"BF16","shape":[2],"data_offsets":{"b":0})"), "data_offsets is not [begin, end]");
  expect_rejected(entry(R"("dtype":"BF16","shape":[2],"data_offsets":[0,4,4])"), "data_offsets is not [begin, end]");
  expect_rejected(entry(R"("dtype":"BF16","shape":[2],"data_offsets":[0,"4"])"),
                  "data_offsets end is not a non-negative integer");
  expect_rejected(entry(R"("dtype":"BF16","shape":[2],"data_offsets":[-1,4])"),
                  "data_offsets begin is not a non-negative integer");
  expect_rejected(entry(R"("dtype":"U8","shape":[0],"data_offsets":[4,0])"), "has begin > end");
  expect_rejected(entry(R"("dtype":"BF16","shape":[4],"data_offsets":[0,8])"), "ends beyond the data section of 4 bytes");
  expect_rejected(entry(R"("dtype":"BF16","shape":[3],"data_offsets":[0,4])"), "hold 4 bytes but dtype and shape need 6");
}

TEST(SafetensorsValidation, Coverage) {
  const std::string a = R"("a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]})";
  expect_rejected(make_file("{" + a + R"(,"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", "abcd"),
                  "tensor 'b' overlaps tensor 'a'");
  expect_rejected(make_file("{" + a + R"(,"b":{"dtype":"U8","shape":[0],"data_offsets":[2,2]}})", "abcd"),
                  "tensor 'b' overlaps tensor 'a'");
  expect_rejected(make_file("{" + a + R"(,"b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}})", "abcdefgh"),
                  "hole in the data section: bytes [4, 6) belong to no tensor");
  expect_rejected(make_file(R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", "abcd"),
                  "bytes [0, 2) belong to no tensor");
  expect_rejected(make_file("{" + a + "}", "abcdef"), "its last 2 bytes belong to no tensor");
  expect_rejected(make_file("{}", "x"), "its last 1 bytes belong to no tensor");
}

TEST(SafetensorsValidation, Limits) {
  pulse::io::SafetensorsLimits limits;
  limits.max_tensors = 2;
  const std::string t = R"({"dtype":"U8","shape":[0],"data_offsets":[0,0]})";
  EXPECT_NO_THROW(parse(make_file(R"({"__metadata__":{},"a":)" + t + R"(,"b":)" + t + "}", ""), limits));
  expect_rejected(make_file(R"({"a":)" + t + R"(,"b":)" + t + R"(,"c":)" + t + "}", ""), "more than 2 tensors", limits);
  limits.max_rank = 1;
  expect_rejected(make_file(R"({"a":{"dtype":"U8","shape":[1,1],"data_offsets":[0,1]}})", "x"), "rank 2 exceeds the limit 1",
                  limits);
}

TEST(SafetensorsValidation, EveryTruncationAndByteFlipIsHandled) {
  const std::string file = make_file(
      R"({"__metadata__":{"m":"n"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("e":{"dtype":"BF16","shape":[0],"data_offsets":[8,8]},"b":{"dtype":"U16","shape":[],"data_offsets":[8,10]}})",
      "0123456789");
  ASSERT_EQ(parse(file).tensors.size(), 3u);
  // The tensors must tile the data section exactly, so every shorter file is invalid.
  for (std::size_t n = 0; n < file.size(); ++n) EXPECT_THROW(parse(file.substr(0, n)), pulse::Error) << n;
  // Any single corrupted byte either is rejected or still yields a header that tiles the file.
  for (std::size_t i = 0; i < file.size(); ++i) {
    for (int x : {0x01, 0x20, 0x80, 0xFF}) {
      std::string bad = file;
      bad[i] = static_cast<char>(bad[i] ^ x);
      try {
        const auto h = parse(bad);
        std::size_t covered = 0;
        for (const auto& t : h.tensors) {
          EXPECT_EQ(t.begin, covered);
          covered = t.end;
        }
        EXPECT_EQ(h.data_offset + covered, bad.size());
      } catch (const pulse::Error&) {
      }
    }
  }
}

TEST_F(Safetensors, OpenNamesTheFile) {
  auto expect_open_error = [&](const std::string& p, const std::string& problem) {
    try {
      pulse::io::SafetensorsFile::open(p);
      ADD_FAILURE() << p << " opened";
    } catch (const pulse::Error& e) {
      EXPECT_NE(std::string(e.what()).find("'" + p + "': " + problem), std::string::npos) << e.what();
    }
  };
  expect_open_error(path("missing.safetensors"), "cannot open");
  expect_open_error(dir_.string(), "not a regular file");
  write_file(path("empty.safetensors"), "");
  expect_open_error(path("empty.safetensors"), "file is 0 bytes");
  write_file(path("bad.safetensors"), make_file("{}", "x"));
  expect_open_error(path("bad.safetensors"), "hole in the data section");
}

TEST_F(Safetensors, FailedWriteLeavesTheOldFile) {
  const std::uint16_t v[4] = {1, 2, 3, 4};
  pulse::io::write_safetensors(path("w.safetensors"), {{"w", DType::BF16, {4}, v, 8}});
  const std::string before = read_file(path("w.safetensors"));
  auto expect_write_error = [&](const std::vector<pulse::io::TensorToWrite>& tensors, const std::string& problem) {
    try {
      pulse::io::write_safetensors(path("w.safetensors"), tensors);
      ADD_FAILURE() << "written; expected '" << problem << "'";
    } catch (const pulse::Error& e) {
      EXPECT_NE(std::string(e.what()).find(problem), std::string::npos) << e.what();
    }
    EXPECT_EQ(read_file(path("w.safetensors")), before);
    EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);  // no temporary left
  };
  expect_write_error({{"w", DType::BF16, {4}, v, 8}, {"x", DType::BF16, {3}, v, 8}}, "8 bytes given, dtype and shape need 3 x 16 bits");
  expect_write_error({{"w", DType::BF16, {4}, v, 8}, {"w", DType::BF16, {4}, v, 8}}, "duplicate name");
  expect_write_error({{"w", DType::BF16, {-4}, v, 8}}, "negative dimension");
  expect_write_error({{"__metadata__", DType::BF16, {4}, v, 8}}, "invalid name");
  expect_write_error({{"", DType::BF16, {4}, v, 8}}, "invalid name");
  expect_write_error({{"w", DType::BF16, {4}, nullptr, 8}}, "no data");
  expect_write_error({{"w\xff", DType::BF16, {4}, v, 8}}, "not valid UTF-8");
  expect_write_error({{"w", DType::BF16, {1LL << 62, 4}, v, 8}}, "shape product overflows");

  EXPECT_THROW(pulse::io::write_safetensors(path("no/such/folder/w.safetensors"), {}), pulse::Error);
  // Overwriting publishes the new content in one step.
  pulse::io::write_safetensors(path("w.safetensors"), {{"w", DType::BF16, {2}, v, 4}});
  EXPECT_EQ(pulse::io::SafetensorsFile::open(path("w.safetensors")).find("w")->bytes, 4u);
}
