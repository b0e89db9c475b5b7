#pragma once
// Host backends run the kernels' host code paths or, forced, the device ones (kernels/segments.hpp).
// on_both_code_paths runs a computation on each and returns both results, so a test asserts that
// they are the same bits; the process's setting (from PULSE_FORCE_DEVICE_PATHS) is restored
// after. On a device backend both runs take the device path.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kernels/segments.hpp"

namespace pulse::test {

class ForcedDevicePaths {
 public:
  explicit ForcedDevicePaths(bool forced) : before_(device_paths_forced()) { set_device_paths_forced(forced); }
  ~ForcedDevicePaths() { set_device_paths_forced(before_); }
  ForcedDevicePaths(const ForcedDevicePaths&) = delete;
  ForcedDevicePaths& operator=(const ForcedDevicePaths&) = delete;

 private:
  bool before_;
};

// run(): fresh inputs in, host-side results out (run again from scratch for the second path).
template <class Run>
auto on_both_code_paths(const Run& run) {
  auto host = [&] {
    const ForcedDevicePaths path(false);
    return run();
  }();
  auto device = [&] {
    const ForcedDevicePaths path(true);
    return run();
  }();
  return std::make_pair(std::move(host), std::move(device));
}

// A computation's outputs by name, as bytes: equal means the same bits (NaN payloads, -0).
using Outputs = std::map<std::string, std::vector<unsigned char>>;

template <class T>
std::vector<unsigned char> bytes_of(const std::vector<T>& v) {
  std::vector<unsigned char> bytes(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(bytes.data(), v.data(), bytes.size());
  return bytes;
}

inline void expect_same_outputs(const std::pair<Outputs, Outputs>& paths) {
  const auto& [host, device] = paths;
  EXPECT_FALSE(host.empty());
  for (const auto& [name, bytes] : host) {
    const auto it = device.find(name);
    ASSERT_NE(it, device.end()) << name << " missing on the device code paths";
    EXPECT_TRUE(it->second == bytes) << name << " differs between the host and device code paths";
  }
  EXPECT_EQ(host.size(), device.size());
}

}  // namespace pulse::test
