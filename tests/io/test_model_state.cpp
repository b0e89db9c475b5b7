// io::ModelState: a .safetensors file or a Hugging Face folder (shards + index, or one file).
// Tensors are matched by name across shards with their dtype, shape and bytes; each shard keeps
// its __metadata__; the folder's other files are listed with their sizes; file_offset locates
// every tensor in its file. Bad layouts throw one line naming the file (the app test covers the
// messages end to end).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.hpp"
#include "io/model_state.hpp"

namespace fs = std::filesystem;
using namespace pulse::io;

namespace {

class ModelStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "pulse_model_state_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write_text(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  // Two shards: a (BF16 2x3) and c (F32 2) in the first, b (F16 4) in the second.
  void write_sharded() {
    write_safetensors((dir_ / "model-00001-of-00002.safetensors").string(),
                      {{"a", DType::BF16, {2, 3}, bf16_, 12}, {"c", DType::F32, {2}, f32_, 8}}, {{"format", "pt"}});
    write_safetensors((dir_ / "model-00002-of-00002.safetensors").string(), {{"b", DType::F16, {4}, f16_, 8}},
                      {{"format", "pt"}, {"step", "7"}});
    write_text("model.safetensors.index.json",
               R"({"metadata": {"total_size": 28}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                   "c": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})");
    write_text("config.json", R"({"hidden_size": 3})");
    write_text("tokenizer.json", "{}");
  }
  fs::path dir_;
  std::uint16_t bf16_[6] = {1, 2, 3, 4, 5, 6};
  float f32_[2] = {1.5f, -2.0f};
  std::uint16_t f16_[4] = {7, 8, 9, 10};
};

std::vector<char> file_bytes(const std::string& path, std::uint64_t offset, std::size_t n) {
  std::ifstream in(path, std::ios::binary);
  in.seekg(std::streamoff(offset));
  std::vector<char> out(n);
  in.read(out.data(), std::streamsize(n));
  return out;
}

}  // namespace

TEST_F(ModelStateTest, ShardedFolderMatchesTensorsByName) {
  write_sharded();
  const ModelState state = ModelState::open(dir_.string());
  EXPECT_TRUE(state.is_folder());
  ASSERT_EQ(state.shards().size(), 2u);
  ASSERT_EQ(state.tensors().size(), 3u);
  EXPECT_EQ(state.tensors()[0].view.name, "a");
  EXPECT_EQ(state.tensors()[1].view.name, "b");
  EXPECT_EQ(state.tensors()[2].view.name, "c");
  const StateTensor* b = state.find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->view.dtype, DType::F16);
  EXPECT_EQ(b->view.shape, (std::vector<std::int64_t>{4}));
  EXPECT_EQ(std::memcmp(b->view.data, f16_, 8), 0);
  EXPECT_EQ(state.shards()[b->shard].metadata().at("step"), "7");
  EXPECT_EQ(state.find("x"), nullptr);
  for (const StateTensor& t : state.tensors()) {
    const auto bytes = file_bytes(state.shards()[t.shard].path(), t.file_offset, t.view.bytes);
    EXPECT_EQ(std::memcmp(bytes.data(), t.view.data, t.view.bytes), 0) << t.view.name;
  }
  EXPECT_EQ(state.index_metadata().at("total_size"), "28");
  ASSERT_EQ(state.other_files().size(), 3u);
  EXPECT_EQ(state.other_files()[0].name, "config.json");
  EXPECT_EQ(state.other_files()[0].bytes, fs::file_size(dir_ / "config.json"));
  EXPECT_EQ(state.other_files()[1].name, "model.safetensors.index.json");
  EXPECT_EQ(state.other_files()[2].name, "tokenizer.json");
}

TEST_F(ModelStateTest, FileAndSingleFileFolder) {
  write_safetensors((dir_ / "model.safetensors").string(), {{"w", DType::BF16, {6}, bf16_, 12}});
  write_text("config.json", "{}");
  const ModelState folder = ModelState::open(dir_.string());
  ASSERT_EQ(folder.tensors().size(), 1u);
  EXPECT_EQ(folder.other_files().size(), 1u);
  const ModelState file = ModelState::open((dir_ / "model.safetensors").string());
  EXPECT_FALSE(file.is_folder());
  EXPECT_TRUE(file.other_files().empty());
  EXPECT_EQ(std::memcmp(file.find("w")->view.data, bf16_, 12), 0);
}

TEST_F(ModelStateTest, BadLayoutsNameTheFile) {
  write_sharded();
  auto message = [&](const fs::path& path) {
    try {
      ModelState::open(path.string());
    } catch (const pulse::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(dir_ / "model.safetensors.index.json").find("index"), std::string::npos);
  EXPECT_NE(message(dir_ / "nowhere").find("no such file"), std::string::npos);
  write_safetensors((dir_ / "model.safetensors").string(), {{"w", DType::BF16, {6}, bf16_, 12}});
  EXPECT_NE(message(dir_).find("model.safetensors: not named in"), std::string::npos);
  fs::remove(dir_ / "model.safetensors");
  fs::remove(dir_ / "model-00002-of-00002.safetensors");
  EXPECT_NE(message(dir_).find("model-00002-of-00002.safetensors: named in"), std::string::npos);
}

TEST(SafetensorsIndexParse, RejectsWhatIsNotAWeightMap) {
  EXPECT_THROW(parse_safetensors_index("", "i"), pulse::Error);
  EXPECT_THROW(parse_safetensors_index("[]", "i"), pulse::Error);
  EXPECT_THROW(parse_safetensors_index(R"({"metadata": {}})", "i"), pulse::Error);
  EXPECT_THROW(parse_safetensors_index(R"({"weight_map": {"a": 3}})", "i"), pulse::Error);
  EXPECT_THROW(parse_safetensors_index(R"({"weight_map": {"a": "../x.safetensors"}})", "i"), pulse::Error);
  EXPECT_THROW(parse_safetensors_index(R"({"weight_map": {"a": ".."}})", "i"), pulse::Error);
  const SafetensorsIndex index = parse_safetensors_index(R"({"weight_map": {"a": "s.safetensors"}})", "i");
  EXPECT_EQ(index.weight_map.at("a"), "s.safetensors");
  EXPECT_TRUE(index.metadata.empty());
}
