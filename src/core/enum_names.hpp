#pragma once
// An enum's text names (command-line choices, TOML values, file attributes) stated once, as a
// table of {value, name} beside the enum; name_of and value_named read it both ways.
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pulse {

template <class E>
struct NamedValue {
  E value;
  const char* name;
};

// The name of a value the table lists ("" for one it does not).
template <class E, std::size_t N>
constexpr const char* name_of(const NamedValue<E> (&names)[N], E value) {
  for (const NamedValue<E>& n : names)
    if (n.value == value) return n.name;
  return "";
}

template <class E, std::size_t N>
std::optional<E> value_named(const NamedValue<E> (&names)[N], std::string_view name) {
  for (const NamedValue<E>& n : names)
    if (name == n.name) return n.value;
  return std::nullopt;
}

template <class E, std::size_t N>
std::vector<std::string> names_of(const NamedValue<E> (&names)[N]) {
  std::vector<std::string> out;
  for (const NamedValue<E>& n : names) out.push_back(n.name);
  return out;
}

// "a, b, c", for messages that list the choices.
template <class E, std::size_t N>
std::string names_text(const NamedValue<E> (&names)[N]) {
  std::string out;
  for (const NamedValue<E>& n : names) out += (out.empty() ? "" : ", ") + std::string(n.name);
  return out;
}

}  // namespace pulse
