// libFuzzer entry: the input is a pulse-train TOML config (--config). Parsing must accept it or
// throw CLI::Error, validate() must accept the settings or throw pulse::Error; a crash, a
// sanitizer report or any other exception escaping is a bug. Settings validate() accepts must
// survive the round trip through to_toml() (what the HDF5 file and checkpoints record) exactly.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "train/train_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  pulse::TrainConfig config;
  try {
    config = pulse::parse_toml(text);
  } catch (const CLI::Error&) {
    return 0;
  }
  (void)pulse::differing_keys(text, pulse::to_toml(config));
  try {
    pulse::validate(config, 4);
  } catch (const pulse::Error&) {
    return 0;
  }
  const std::string recorded = pulse::to_toml(config);
  try {
    if (pulse::to_toml(pulse::parse_toml(recorded)) != recorded) __builtin_trap();
  } catch (const CLI::Error&) {
    __builtin_trap();  // what pulse-train records, it cannot read back
  }
  if (!pulse::differing_keys(recorded, recorded).empty()) __builtin_trap();
  return 0;
}
