// Writes a few small valid safetensors files into the folder given as argument: the seed
// corpus of fuzz_safetensors_header and fuzz_model_folder (folder.safetensors: a model folder in
// flat form), a model.safetensors.index.json for fuzz_safetensors_index, and a folder swap's
// marker for fuzz_swap_marker.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "io/safetensors.hpp"
#include "io/swap_marker.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s FOLDER\n", argv[0]);
    return 2;
  }
  using pulse::io::DType;
  const std::string dir = argv[1];
  const std::vector<std::uint16_t> bf16{0x3F80, 0x7FC1, 0x8000, 0x0001, 0xFF80, 0x4049};
  const std::vector<float> f32{1.0f, -2.5f, 3.25f};
  const std::vector<std::uint8_t> u8{1, 2, 3, 4, 5};
  const double scalar = 6.5;
  try {
    pulse::io::write_safetensors(dir + "/bf16.safetensors",
                                 {{"blocks.0.attn.weight", DType::BF16, {2, 3}, bf16.data(), 12}},
                                 {{"format", "pt"}, {"step", "7"}});
    pulse::io::write_safetensors(dir + "/mixed.safetensors",
                                 {{"a", DType::F32, {3}, f32.data(), 12},
                                  {"empty", DType::F16, {0, 4}, nullptr, 0},
                                  {"s", DType::F64, {}, &scalar, 8},
                                  {"b", DType::U8, {5, 1}, u8.data(), 5}});
    pulse::io::write_safetensors(dir + "/none.safetensors", {});
    // A model folder in flat form (a relay anchor): two shards named by the carried index, a
    // config file, metadata common to both shards and one shard's own key.
    const std::string index =
        R"({"metadata": {"total_size": 24}, "weight_map": {"a": "model-00001-of-00002.safetensors", )"
        R"("b": "model-00002-of-00002.safetensors"}})";
    const std::string config = R"({"hidden_size": 3})";
    pulse::io::write_safetensors(
        dir + "/folder.safetensors",
        {{"a", DType::F32, {3}, f32.data(), 12},
         {"b", DType::BF16, {6}, bf16.data(), 12},
         {"__file__/model.safetensors.index.json", DType::U8, {std::int64_t(index.size())}, index.data(), index.size()},
         {"__file__/sub/config.json", DType::U8, {std::int64_t(config.size())}, config.data(), config.size()}},
        {{"format", "pt"}, {"__shard__/model-00002-of-00002.safetensors/step", "7"}});
    std::ofstream(dir + "/model.safetensors.index.json")
        << R"({"metadata": {"total_size": 24}, "weight_map": {"a": "model-00001-of-00002.safetensors", )"
        << R"("b": "model-00002-of-00002.safetensors"}})";
    std::ofstream(dir + "/swap-marker") << pulse::io::format_swap_marker({".model.pulse-new.a1B2c3", ".model.pulse-old"});
  } catch (const pulse::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
