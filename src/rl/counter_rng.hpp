#pragma once
// A counter-based random generator: the draw for (seed, stream, counter) is a pure function of
// the three, so sampling gives the same numbers whatever the batching, rank count or order of
// evaluation. Each key is folded in with SplitMix64's finaliser (Steele, Lea, Flood 2014), a
// bijective 64-bit mixer that passes BigCrush on counters.
#include <cstdint>

namespace pulse {

constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) with 53 random bits.
constexpr double counter_uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t counter) {
  const std::uint64_t x = splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ counter);
  return static_cast<double>(x >> 11) * 0x1p-53;
}

}  // namespace pulse
