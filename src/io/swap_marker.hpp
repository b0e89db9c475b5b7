#pragma once
// The marker a two-rename folder swap leaves beside its destination while it runs
// (io/folder_swap.hpp): "PULSESync folder swap 1\nnew <name>\nold <name>\n", naming the new
// folder and the parked old one. A reader that finds it after a crash uses it to steer removals,
// so parsing is strict: exactly that spelling, with plain names.
#include <optional>
#include <string>

namespace pulse::io {

struct SwapMarker {
  std::string fresh;  // the new folder, complete before the marker is written
  std::string old;    // where the old folder is parked
};

// A name in the parent folder: not empty, ".", "..", and without '/', '\n' or NUL.
bool plain_file_name(const std::string& name);

std::string format_swap_marker(const SwapMarker& marker);
// nullopt for anything but what format_swap_marker writes for two plain names.
std::optional<SwapMarker> parse_swap_marker(const std::string& text);

}  // namespace pulse::io
