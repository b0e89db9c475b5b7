// libFuzzer entry: the input is one rank's pulse-train checkpoint file (rank_checkpoint.hpp).
// parse_rank_checkpoint must accept it or throw pulse::Error; a crash, a sanitizer report or any
// other exception escaping is a bug. An accepted file must carry the checksum of what was read,
// and its buffers must read back through the accessors pulse-train uses on resume.
// With PULSE_FUZZ_RECHECKSUM the stored checksum is rewritten over each mutated input first (in
// place: same length), so that mutations reach the checks behind it.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "train/rank_checkpoint.hpp"
#include "train/train_config.hpp"

namespace {

constexpr std::int64_t seed_step = 3;  // the step of every seed file

#ifdef PULSE_FUZZ_RECHECKSUM
void rewrite_checksum(std::vector<std::byte>& file) {
  try {
    const pulse::io::ParsedHeader header = pulse::io::parse_header(file.data(), file.size(), {});
    pulse::RankCheckpoint state;
    state.metadata = header.metadata;
    for (const auto& t : header.tensors) state.add(t.name, t.dtype, file.data() + header.data_offset + t.begin, t.end - t.begin);
    const std::string sum = pulse::checkpoint_checksum(state);
    const std::string prefix = "xxh3-128:";
    const char* begin = reinterpret_cast<const char*>(file.data());
    const std::string text(begin, std::min(file.size(), header.data_offset));
    const auto at = text.find(prefix);
    if (at != std::string::npos && at + sum.size() <= text.size()) std::memcpy(file.data() + at, sum.data(), sum.size());
  } catch (const pulse::Error&) {
  }
}
#endif

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::byte> file(size);
  if (size) std::memcpy(file.data(), data, size);
#ifdef PULSE_FUZZ_RECHECKSUM
  rewrite_checksum(file);
#endif
  pulse::RankCheckpoint state;
  try {
    state = pulse::parse_rank_checkpoint(file.data(), file.size(), seed_step, "fuzz input");
  } catch (const pulse::Error&) {
    return 0;
  }
  if (state.meta("checksum") != pulse::checkpoint_checksum(state)) __builtin_trap();
  for (const auto& b : state.buffers) {
    if (!state.has(b.name)) __builtin_trap();
    try {
      const auto values = state.get<float>(b.name);
      if (values.size() * sizeof(float) != b.bytes.size()) __builtin_trap();
    } catch (const pulse::Error&) {
      if (b.bytes.size() % sizeof(float) == 0) __builtin_trap();  // whole elements must read
    }
  }
  if (state.metadata.count("config")) (void)pulse::differing_keys(state.meta("config"), pulse::to_toml({}));
  return 0;
}
