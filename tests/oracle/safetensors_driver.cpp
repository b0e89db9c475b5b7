// Driver for test_safetensors_torch.py: pulse's safetensors reader and writer on files the
// Python reference wrote or will read.
//   safetensors_driver dump FILE                  JSON (metadata, tensors in file order, hex bytes) to stdout
//   safetensors_driver rewrite IN OUT ORDER.json  read IN, write OUT with the tensors in ORDER's name order
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.hpp"
#include "io/safetensors.hpp"

namespace {

std::string hex(const std::byte* data, std::size_t n) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto b = std::to_integer<unsigned>(data[i]);
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

void dump(const std::string& path) {
  const auto file = pulse::io::SafetensorsFile::open(path);
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& t : file.tensors())
    tensors.push_back({{"name", t.name}, {"dtype", pulse::io::dtype_name(t.dtype)}, {"shape", t.shape},
                       {"hex", hex(t.data, t.bytes)}});
  std::cout << nlohmann::json{{"metadata", file.metadata()}, {"tensors", tensors}}.dump() << "\n";
}

void rewrite(const std::string& in, const std::string& out, const std::string& order_path) {
  const auto file = pulse::io::SafetensorsFile::open(in);
  std::ifstream order_file(order_path);
  PULSE_CHECK(order_file, "cannot open " + order_path);
  std::vector<pulse::io::TensorToWrite> tensors;
  for (const auto& name : nlohmann::json::parse(order_file)) {
    const auto* t = file.find(name.get<std::string>());
    PULSE_CHECK(t, in + " has no tensor " + name.get<std::string>());
    tensors.push_back({t->name, t->dtype, t->shape, t->data, t->bytes});
  }
  pulse::io::write_safetensors(out, tensors, file.metadata());
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "dump" && argc == 3) {
      dump(argv[2]);
    } else if (mode == "rewrite" && argc == 5) {
      rewrite(argv[2], argv[3], argv[4]);
    } else {
      std::fprintf(stderr, "usage: %s dump FILE | rewrite IN OUT ORDER.json\n", argv[0]);
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "safetensors_driver: %s\n", e.what());
    return 1;
  }
  return 0;
}
