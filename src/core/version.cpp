#include "core/version.hpp"

#include "pulse_build_info.hpp"

namespace pulse {
std::string version_string() { return std::string(PULSE_VERSION_STRING) + " (git " + PULSE_GIT_COMMIT + ")"; }
}  // namespace pulse
