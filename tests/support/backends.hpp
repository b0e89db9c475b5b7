#pragma once
// The backends a kernel test runs on: every execution space this Kokkos enables on the host
// (Kokkos::Serial, Kokkos::OpenMP), each on its own code paths and with the device paths forced
// (kernels/segments.hpp), then the default execution space where it is a device (whose only path
// is the device one). So one build runs each kernel test on Serial, on OpenMP and down the
// device paths, and a test compares the results of all of them bit for bit.
//
//   template <class B> using AdamW = pulse::test::OnBackend<B>;
//   TYPED_TEST_SUITE(AdamW, pulse::test::BackendTypes, pulse::test::BackendNames);
//   TYPED_TEST(AdamW, Case) { const typename TypeParam::ExecSpace space; ... }  // AdamW/SerialHostPath.Case, ...
//
// Execution space instances are made inside test bodies only: one made at namespace scope or in
// a static outlives Kokkos::finalize (an abort on OpenMP and CUDA).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/segments.hpp"

namespace pulse::test {

// Sets the process's code path setting for a scope and restores it after.
class ForcedDevicePaths {
 public:
  explicit ForcedDevicePaths(bool forced) : before_(device_paths_forced()) { set_device_paths_forced(forced); }
  ~ForcedDevicePaths() { set_device_paths_forced(before_); }
  ForcedDevicePaths(const ForcedDevicePaths&) = delete;
  ForcedDevicePaths& operator=(const ForcedDevicePaths&) = delete;

 private:
  bool before_;
};

// An execution space and whether its launches are sent down the device paths.
template <class Space, bool DevicePathsForced>
struct Backend {
  using ExecSpace = Space;
  using Mem = typename Space::memory_space;
  static constexpr bool device_paths_forced = DevicePathsForced;
  static std::string name() { return std::string(Space::name()) + (DevicePathsForced ? "DevicePath" : "HostPath"); }
};

template <class... Backends>
struct BackendList {
  template <class... More>
  using With = BackendList<Backends..., More...>;
  template <class Space>
  static constexpr bool has_space = (std::is_same_v<Space, typename Backends::ExecSpace> || ...);
  using GtestTypes = ::testing::Types<Backends...>;

  // run(backend) on each backend in turn, with its code path set and its name in failures.
  template <class Run>
  static void for_each(const Run& run) {
    (for_one(Backends{}, run), ...);
  }

 private:
  template <class B, class Run>
  static void for_one(B backend, const Run& run) {
    const ForcedDevicePaths path(B::device_paths_forced);
    SCOPED_TRACE("on " + B::name());
    run(backend);
  }
};

template <class Space>
using BothCodePaths = BackendList<Backend<Space, false>, Backend<Space, true>>;

namespace detail {
#ifdef KOKKOS_ENABLE_SERIAL
using WithSerial = BothCodePaths<Kokkos::Serial>;
#else
using WithSerial = BackendList<>;
#endif
#ifdef KOKKOS_ENABLE_OPENMP
using HostBackends = WithSerial::With<Backend<Kokkos::OpenMP, false>, Backend<Kokkos::OpenMP, true>>;
#else
using HostBackends = WithSerial;
#endif
}  // namespace detail

using Backends = std::conditional_t<is_host_space<DefaultExec>, detail::HostBackends,
                                    detail::HostBackends::With<Backend<DefaultExec, true>>>;
static_assert(Backends::has_space<DefaultExec>, "the kernel tests must run on the default execution space");

// For TYPED_TEST_SUITE: the backends as types, named by Backend::name().
using BackendTypes = Backends::GtestTypes;
struct BackendNames {
  template <class B>
  static std::string GetName(int) {
    return B::name();
  }
};

// The fixture of a typed kernel test: TypeParam is the Backend, whose code path is set for the test.
template <class B>
class OnBackend : public ::testing::Test {
 private:
  ForcedDevicePaths path_{B::device_paths_forced};
};

// A computation's outputs by name, as bytes: equal means the same bits (NaN payloads, -0).
using Outputs = std::map<std::string, std::vector<unsigned char>>;

template <class T>
std::vector<unsigned char> bytes_of(const std::vector<T>& v) {
  std::vector<unsigned char> bytes(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(bytes.data(), v.data(), bytes.size());
  return bytes;
}

// run(backend): fresh inputs in the backend's memory space in, host-side Outputs out; run on
// every backend from scratch. Returns each backend's name with its outputs.
template <class Run>
std::vector<std::pair<std::string, Outputs>> on_every_backend(const Run& run) {
  std::vector<std::pair<std::string, Outputs>> results;
  Backends::for_each([&](auto backend) { results.emplace_back(decltype(backend)::name(), run(backend)); });
  return results;
}

// Every backend's outputs are the first one's, bit for bit.
inline void expect_same_outputs(const std::vector<std::pair<std::string, Outputs>>& results) {
  ASSERT_FALSE(results.empty());
  const auto& [first_name, first] = results.front();
  EXPECT_FALSE(first.empty());
  for (const auto& [backend, outputs] : results) {
    for (const auto& [name, bytes] : first) {
      const auto it = outputs.find(name);
      ASSERT_NE(it, outputs.end()) << name << " missing on " << backend;
      EXPECT_TRUE(it->second == bytes) << name << " differs between " << first_name << " and " << backend;
    }
    EXPECT_EQ(outputs.size(), first.size()) << backend;
  }
}

}  // namespace pulse::test
