// A model folder's flat form (sync/model_folder) and the atomic folder swap (io/folder_swap):
// flatten -> plan -> write -> flatten gives the same state digest; the tensors' digest does not
// depend on sharding; plan_folder refuses every state that cannot be a folder (paths leaving the
// folder, an index that disagrees with the tensors, metadata naming no shard or not canonical);
// replace_folder swaps whole folders, leaves the old one on failure, puts back a folder left
// missing between two renames, and removes killed writers' folders but never a live one's;
// StreamedState reads the same state lazily.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.hpp"
#include "io/folder_swap.hpp"
#include "sync/checkpoint.hpp"
#include "sync/model_folder.hpp"
#include "sync/streamed_state.hpp"

namespace fs = std::filesystem;
using namespace pulse;
using namespace pulse::sync;

namespace {

class ModelFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "pulse_model_folder_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  static void write_text(const fs::path& path, const std::string& text) {
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  static std::string read_text(const fs::path& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // Two shards (a, c | b), metadata "format" in both and "step" in the second, config files.
  fs::path sharded(const std::string& name) {
    const fs::path d = dir_ / name;
    fs::create_directories(d);
    io::write_safetensors((d / "model-00001-of-00002.safetensors").string(),
                          {{"a", io::DType::BF16, {2, 3}, bf16_, 12}, {"c", io::DType::F32, {2}, f32_, 8}},
                          {{"format", "pt"}});
    io::write_safetensors((d / "model-00002-of-00002.safetensors").string(), {{"b", io::DType::F16, {4}, f16_, 8}},
                          {{"format", "pt"}, {"step", "7"}});
    write_text(d / "model.safetensors.index.json",
               R"({"metadata": {"total_size": 28}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                   "c": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})");
    write_text(d / "config.json", R"({"hidden_size": 3})");
    write_text(d / "tokenizer/vocab.txt", "a\nb\n");
    return d;
  }
  fs::path dir_;
  std::uint16_t bf16_[6] = {1, 2, 3, 4, 5, 6};
  float f32_[2] = {1.5f, -2.0f};
  std::uint16_t f16_[4] = {7, 8, 9, 10};
};

std::string plan_error(const std::vector<TensorRef>& tensors, const Metadata& metadata) {
  try {
    plan_folder(tensors, metadata, "s");
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TensorRef file_tensor(const std::string& rel, const std::string& bytes) {
  return {kFileTensorPrefix + rel, "U8", {std::int64_t(bytes.size())},
          reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()};
}

}  // namespace

TEST_F(ModelFolderTest, FlatFormHoldsTensorsFilesAndShardMetadata) {
  const OpenState s = open_state(sharded("m").string());
  std::map<std::string, const TensorRef*> by_name;
  for (const auto& t : s.flat.tensors) by_name[t.name] = &t;
  ASSERT_EQ(by_name.size(), 6u);
  for (const char* name : {"a", "b", "c", "__file__/config.json", "__file__/model.safetensors.index.json",
                           "__file__/tokenizer/vocab.txt"})
    EXPECT_TRUE(by_name.count(name)) << name;
  const TensorRef& vocab = *by_name.at("__file__/tokenizer/vocab.txt");
  EXPECT_EQ(vocab.dtype, "U8");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(vocab.data), vocab.bytes), "a\nb\n");
  EXPECT_EQ(s.flat.metadata, (Metadata{{"format", "pt"}, {"__shard__/model-00002-of-00002.safetensors/step", "7"}}));
}

TEST_F(ModelFolderTest, WrittenFolderReadsBackAsTheState) {
  const Checkpoint c = load_checkpoint(sharded("m").string());
  ASSERT_TRUE(c.folder);
  const fs::path out = dir_ / "out";
  ASSERT_TRUE(save_state(out.string(), c));
  const OpenState back = open_state(out.string());
  EXPECT_EQ(state_digest(back.flat.tensors, back.flat.metadata), state_digest(c.layout, c.metadata));
  EXPECT_EQ(back.model.shards().size(), 2u);
  EXPECT_EQ(back.model.shards()[1].metadata(), (Metadata{{"format", "pt"}, {"step", "7"}}));
  EXPECT_EQ(read_text(out / "tokenizer/vocab.txt"), "a\nb\n");
}

// sync/streamed_state: the same flat state as open_state's, the shards' bytes read only when asked
// (whole, in pieces, hashed), and a shard that shrinks after the open is an error naming it.
TEST_F(ModelFolderTest, StreamedStateReadsWhatTheFilesHold) {
  const fs::path d = sharded("m");
  const OpenState whole = open_state(d.string());
  const StreamedState streamed = StreamedState::open(d.string());
  ASSERT_EQ(streamed.tensors().size(), whole.flat.tensors.size());
  EXPECT_EQ(streamed.metadata(), whole.flat.metadata);
  EXPECT_TRUE(streamed.folder());
  std::uint64_t largest = 0;  // the index file, here
  for (const auto& t : whole.flat.tensors) largest = std::max<std::uint64_t>(largest, t.bytes);
  EXPECT_EQ(streamed.largest_tensor_bytes(), largest);
  ByteBuffer buffer;
  for (std::size_t i = 0; i < streamed.tensors().size(); ++i) {
    const TensorRef& t = streamed.tensors()[i];
    const TensorRef& w = whole.flat.tensors[i];
    ASSERT_EQ(t.name, w.name);
    EXPECT_EQ(t.data == nullptr, !is_file_tensor(t.name)) << t.name;  // shards not read at open
    EXPECT_EQ(std::memcmp(streamed.read(i, buffer), w.data, w.bytes), 0) << t.name;
    EXPECT_EQ(streamed.digest(i), tensor_digest(w)) << t.name;
    if (w.bytes > 2) EXPECT_EQ(std::memcmp(streamed.read_piece(i, 2, w.bytes - 2, buffer), w.data + 2, w.bytes - 2), 0);
  }
  // The same patch from both (encode_patch reads the streamed states through their loaders).
  const OpenState other_whole = open_state(d.string());
  EncodeOptions options;
  EXPECT_EQ(encode_patch(streamed.tensors(), streamed.tensors(), options, nullptr, nullptr, streamed.metadata(),
                         streamed.metadata(), streamed.loader(), streamed.loader()),
            encode_patch(whole.flat.tensors, other_whole.flat.tensors, options, nullptr, nullptr, whole.flat.metadata,
                         other_whole.flat.metadata));
  std::size_t b = 0;
  while (streamed.tensors()[b].name != "b") ++b;
  fs::resize_file(d / "model-00002-of-00002.safetensors", fs::file_size(d / "model-00002-of-00002.safetensors") - 4);
  try {
    streamed.read(b, buffer);
    ADD_FAILURE() << "a shard that shrank was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model-00002-of-00002.safetensors: the file shrank"), std::string::npos)
        << e.what();
  }
}

TEST_F(ModelFolderTest, TensorsDigestDoesNotDependOnSharding) {
  const OpenState two = open_state(sharded("m").string());
  std::vector<TensorRef> tensors;
  for (const auto& t : two.flat.tensors)
    if (!is_file_tensor(t.name)) tensors.push_back(t);
  const fs::path one = dir_ / "one";
  fs::create_directories(one);
  std::vector<io::TensorToWrite> all;
  for (const auto& t : tensors) all.push_back({t.name, io::parse_dtype(t.dtype), t.shape, t.data, t.bytes});
  io::write_safetensors((one / "model.safetensors").string(), all);
  std::vector<TensorRef> single;
  for (const auto& t : open_state(one.string()).flat.tensors) single.push_back(t);
  EXPECT_EQ(state_digest(single), state_digest(tensors));
}

TEST_F(ModelFolderTest, PlanRefusesStatesThatCannotBeFolders) {
  const std::uint16_t w[2] = {1, 2};
  const TensorRef a{"a", "BF16", {2}, reinterpret_cast<const std::byte*>(w), 4};
  const std::string index = R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})";
  const std::string index_a = R"({"weight_map": {"a": "model-00001-of-00001.safetensors"}})";
  EXPECT_EQ(plan_error({a, file_tensor("config.json", "{}")}, {{"format", "pt"}}), "no error");
  for (const char* bad : {"../x", "/etc/x", "a//b", "./x", "x/..", ""})
    EXPECT_NE(plan_error({a, file_tensor(bad, "x")}, {}).find("plain relative path"), std::string::npos) << bad;
  EXPECT_NE(plan_error({a, {"__file__/c", "BF16", {1}, a.data, 2}}, {}).find("U8"), std::string::npos);
  EXPECT_NE(plan_error({a, file_tensor("x.safetensors", "x")}, {}).find("shard"), std::string::npos);
  EXPECT_NE(plan_error({a, file_tensor("d", "x"), file_tensor("d/e", "y")}, {}).find("also the folder"), std::string::npos);
  EXPECT_NE(plan_error({a, {"__shard__/x", "BF16", {2}, a.data, 4}}, {}).find("reserved"), std::string::npos);
  EXPECT_NE(plan_error({a, file_tensor("model.safetensors.index.json", index)}, {}).find("no such tensor"),
            std::string::npos);
  EXPECT_NE(plan_error({a, {"z", "BF16", {2}, a.data, 4}, file_tensor("model.safetensors.index.json", index_a)}, {})
                .find("\"z\" is not in the weight_map"),
            std::string::npos);
  EXPECT_NE(plan_error({a, file_tensor("model.safetensors.index.json", "[")}, {}).find("not valid JSON"), std::string::npos);
  EXPECT_NE(plan_error({a}, {{"__shard__/other.safetensors/k", "v"}}).find("names no shard"), std::string::npos);
  // One shard: every key is common, so a per-shard key is not the canonical form.
  EXPECT_NE(plan_error({a}, {{"__shard__/model.safetensors/k", "v"}}).find("not per shard"), std::string::npos);
  EXPECT_NE(plan_error({a}, {{"k", "v"}, {"__shard__/model.safetensors/k", "w"}}).find("both common and per shard"),
            std::string::npos);
}

TEST_F(ModelFolderTest, ReservedNamesInAShardAreRefused) {
  const fs::path d = dir_ / "r";
  fs::create_directories(d);
  const std::uint8_t x[2] = {1, 2};
  io::write_safetensors((d / "model.safetensors").string(), {{"__file__/config.json", io::DType::U8, {2}, x, 2}});
  try {
    open_state(d.string());
    FAIL() << "a reserved name in a shard must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("reserves"), std::string::npos) << e.what();
  }
  // The same file on its own is a flat state (as a relay anchor is).
  EXPECT_TRUE(carries_files(open_state((d / "model.safetensors").string()).flat.tensors));
}

TEST_F(ModelFolderTest, ReplaceFolderSwapsWholeOrNotAtAll) {
  const fs::path dest = dir_ / "m";
  io::replace_folder(dest.string(), [](const std::string& f) { write_text(fs::path(f) / "x", "1"); });
  EXPECT_EQ(read_text(dest / "x"), "1");
  io::replace_folder(dest.string(), [](const std::string& f) { write_text(fs::path(f) / "y", "2"); });
  EXPECT_FALSE(fs::exists(dest / "x"));
  EXPECT_EQ(read_text(dest / "y"), "2");
  EXPECT_THROW(io::replace_folder(dest.string(),
                                  [](const std::string& f) {
                                    write_text(fs::path(f) / "z", "3");
                                    throw Error("injected");
                                  }),
               Error);
  EXPECT_EQ(read_text(dest / "y"), "2");
  EXPECT_FALSE(fs::exists(dest / "z"));
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"m"});
}

TEST_F(ModelFolderTest, InterruptedTwoRenameSwapIsUndone) {
  const fs::path dest = dir_ / "m";
  write_text(dest / "old", "old");
  write_text(dir_ / ".m.pulse-new.abcdef" / "new", "new");
  // Killed between the renames: the old folder parked, the marker naming both.
  fs::rename(dest, dir_ / ".m.pulse-old");
  write_text(dir_ / ".m.pulse-swap", "PULSESync folder swap 1\nnew .m.pulse-new.abcdef\nold .m.pulse-old\n");
  io::recover_folder_swap(dest.string());
  EXPECT_EQ(read_text(dest / "old"), "old");
  EXPECT_FALSE(fs::exists(dir_ / ".m.pulse-old"));
  EXPECT_FALSE(fs::exists(dir_ / ".m.pulse-swap"));
  EXPECT_FALSE(fs::exists(dir_ / ".m.pulse-new.abcdef"));
}

TEST_F(ModelFolderTest, KilledWritersFoldersGoLiveOnesStay) {
  const fs::path dest = dir_ / "m", dead = dir_ / ".m.pulse-new.DEAD01", live = dir_ / ".m.pulse-new.LIVE01";
  fs::create_directories(dead);
  fs::create_directories(live);
  const int fd = ::open(live.c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);  // as a live writer holds it
  io::replace_folder(dest.string(), [](const std::string& f) { write_text(fs::path(f) / "x", "1"); });
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(live));
  ::close(fd);
}
