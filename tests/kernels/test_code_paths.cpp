// The kernels' code path setting (kernels/segments.hpp): PULSE_FORCE_DEVICE_PATHS gives its
// starting value (ctest runs this binary without the variable and, as test_code_paths_forced,
// with it set to 1), and a launch on a host backend follows the setting. The kernel tests'
// backends (tests/support/backends.hpp): every enabled host space on both paths.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/segments.hpp"
#include "support/backends.hpp"

namespace {

// First in this file, before any test changes the setting.
TEST(CodePaths, StartFromTheEnvironment) {
  const char* value = std::getenv("PULSE_FORCE_DEVICE_PATHS");
  if (value == nullptr)
    EXPECT_FALSE(pulse::device_paths_forced());
  else
    EXPECT_EQ(pulse::device_paths_forced(), std::string(value) != "0") << "PULSE_FORCE_DEVICE_PATHS=" << value;
}

TEST(CodePaths, EnvironmentValues) {
  EXPECT_FALSE(pulse::detail::forced_by_environment(nullptr));
  EXPECT_FALSE(pulse::detail::forced_by_environment("0"));
  EXPECT_TRUE(pulse::detail::forced_by_environment("1"));
  EXPECT_TRUE(pulse::detail::forced_by_environment("yes"));
  EXPECT_TRUE(pulse::detail::forced_by_environment(""));  // set, and not "0"
}

TEST(CodePaths, LaunchesFollowTheSetting) {
  const bool before = pulse::device_paths_forced();
  {
    const pulse::test::ForcedDevicePaths path(true);
    EXPECT_TRUE(pulse::device_paths_forced());
    EXPECT_FALSE(pulse::takes_host_path(pulse::DefaultExec()));
  }
  EXPECT_EQ(pulse::device_paths_forced(), before);
  {
    const pulse::test::ForcedDevicePaths path(false);
    EXPECT_FALSE(pulse::device_paths_forced());
    EXPECT_EQ(pulse::takes_host_path(pulse::DefaultExec()), pulse::is_host_space<pulse::DefaultExec>);
  }
  EXPECT_EQ(pulse::device_paths_forced(), before);
#ifdef KOKKOS_ENABLE_SERIAL
  const pulse::test::ForcedDevicePaths path(false);
  EXPECT_TRUE(pulse::takes_host_path(Kokkos::Serial()));
#endif
}

// Names built here from the enabled backends, not from the list being checked.
TEST(Backends, EveryEnabledHostSpaceOnBothPathsThenTheDevice) {
  std::vector<std::string> expected;
#ifdef KOKKOS_ENABLE_SERIAL
  expected.insert(expected.end(), {"SerialHostPath", "SerialDevicePath"});
#endif
#ifdef KOKKOS_ENABLE_OPENMP
  expected.insert(expected.end(), {"OpenMPHostPath", "OpenMPDevicePath"});
#endif
  if (!pulse::is_host_space<pulse::DefaultExec>) expected.push_back(pulse::DefaultExec::name() + std::string("DevicePath"));
  std::vector<std::string> visited;
  const bool before = pulse::device_paths_forced();
  pulse::test::Backends::for_each([&](auto backend) {
    using B = decltype(backend);
    visited.push_back(B::name());
    EXPECT_EQ(pulse::device_paths_forced(), B::device_paths_forced) << B::name();
  });
  EXPECT_EQ(visited, expected);
  EXPECT_EQ(pulse::device_paths_forced(), before);
}

template <class B>
using Backends = pulse::test::OnBackend<B>;
TYPED_TEST_SUITE(Backends, pulse::test::BackendTypes, pulse::test::BackendNames);

TYPED_TEST(Backends, TestsRunOnTheirBackendsCodePath) {
  using Space = typename TypeParam::ExecSpace;
  EXPECT_EQ(pulse::takes_host_path(Space()), pulse::is_host_space<Space> && !TypeParam::device_paths_forced);
}

}  // namespace
