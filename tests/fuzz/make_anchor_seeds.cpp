// Writes seed inputs for fuzz_compressed_anchor into the folder given as argument: zstd frames
// (pulse's own compressor) of safetensors files from pulse's own writer, with and without
// metadata, and one frame of zeros that declares more than it should hold.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "io/safetensors.hpp"
#include "coding/compress.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s FOLDER\n", argv[0]);
    return 2;
  }
  using namespace pulse;
  const std::string dir = argv[1];
  const std::vector<std::uint16_t> w(64, 0x3F80);
  const std::vector<float> b{1.0f, -2.0f, 0.5f};
  const std::vector<io::TensorToWrite> tensors{
      {"w", io::DType::BF16, {8, 8}, reinterpret_cast<const std::byte*>(w.data()), 128},
      {"b", io::DType::F32, {3}, reinterpret_cast<const std::byte*>(b.data()), 12}};
  struct Seed {
    std::string name;
    std::vector<io::TensorToWrite> tensors;
    std::map<std::string, std::string> metadata;
  };
  const std::vector<Seed> seeds{{"anchor-plain", tensors, {}},
                                {"anchor-metadata", tensors, {{"format", "pt"}, {"step", "12"}}},
                                {"anchor-empty", {}, {}}};
  for (const Seed& s : seeds) {
    const std::string plain = dir + "/" + s.name + ".safetensors";
    io::write_safetensors(plain, s.tensors, s.metadata);
    std::ifstream in(plain, std::ios::binary);
    const std::vector<std::uint8_t> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::remove(plain.c_str());
    const auto coded = sync::compress(sync::Compressor::zstd, 3, raw);
    std::ofstream(dir + "/" + s.name + ".zst", std::ios::binary).write(reinterpret_cast<const char*>(coded.data()),
                                                                     std::streamsize(coded.size()));
  }
  const auto zeros = sync::compress(sync::Compressor::zstd, 19, std::vector<std::uint8_t>(1 << 20));
  std::ofstream(dir + "/zeros.zst", std::ios::binary).write(reinterpret_cast<const char*>(zeros.data()),
                                                           std::streamsize(zeros.size()));
  return 0;
}
