#pragma once
// Raw little-endian arrays exchanged with the Python oracles (numpy tofile/fromfile).
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace pulse::oracle {

constexpr std::size_t any_count = std::numeric_limits<std::size_t>::max();

// Reads the whole file; with a count, the file must hold exactly that many values.
template <class T>
std::vector<T> read_raw(const std::string& path, std::size_t count = any_count) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  PULSE_CHECK(in, "cannot open " + path);
  const auto bytes = static_cast<std::size_t>(in.tellg());
  PULSE_CHECK(bytes % sizeof(T) == 0, path + ": size is not a multiple of the element size");
  PULSE_CHECK(count == any_count || bytes == count * sizeof(T),
              path + " does not hold exactly " + std::to_string(count) + " values");
  std::vector<T> out(bytes / sizeof(T));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(bytes));
  return out;
}

template <class T>
void write_raw(const std::string& path, const std::vector<T>& data) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * sizeof(T)));
  PULSE_CHECK(out, "cannot write " + path);
}

}  // namespace pulse::oracle
