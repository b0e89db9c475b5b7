#include "sync/codec_choice.hpp"

#include <chrono>
#include <cmath>
#include <cstring>

#include "core/error.hpp"

namespace pulse::sync {

std::vector<CodecMeasurement> codec_candidates() {
  auto make = [](const char* name, ValueCoding v, Compressor c, int level) {
    CodecMeasurement m;
    m.name = name;
    m.options.values = v;
    m.options.indices = v == ValueCoding::exponent_class ? IndexCoding::exponent_class : IndexCoding::gap_varint;
    m.options.compressor = c;
    m.options.level = level;
    return m;
  };
  return {make("keydiff+none", ValueCoding::keydiff, Compressor::none, 0),
          make("keydiff+lz4", ValueCoding::keydiff, Compressor::lz4, 0),
          make("keydiff+zstd-1", ValueCoding::keydiff, Compressor::zstd, 1),
          make("keydiff+zstd-3", ValueCoding::keydiff, Compressor::zstd, 3),
          make("keydiff+zstd-9", ValueCoding::keydiff, Compressor::zstd, 9),
          make("raw+zstd-3", ValueCoding::raw, Compressor::zstd, 3),
          // Range-coded streams: only tensors carried whole would compress further.
          make("expclass+none", ValueCoding::exponent_class, Compressor::none, 0),
          make("expclass+zstd-3", ValueCoding::exponent_class, Compressor::zstd, 3)};
}

std::vector<CodecMeasurement> measure_codecs(const std::vector<TensorRef>& base, const std::vector<TensorRef>& target) {
  using clock = std::chrono::steady_clock;
  auto seconds = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  // The receiver's copy, restored between candidates; digests are known to both sides.
  std::vector<std::vector<std::byte>> copy;
  for (const auto& t : base) copy.emplace_back(t.data, t.data + t.bytes);
  std::vector<MutableTensor> receiver;
  for (std::size_t i = 0; i < base.size(); ++i)
    receiver.push_back({base[i].name, base[i].dtype, base[i].shape, copy[i].data(), copy[i].size()});
  const StateDigests base_digests = compute_digests(base);
  auto measured = codec_candidates();
  for (auto& m : measured) {
    const auto t0 = clock::now();
    const auto patch = encode_patch(base, target, m.options, &base_digests);
    const auto t1 = clock::now();
    apply_patch(parse_patch(patch.data(), patch.size()), receiver, {}, &base_digests);
    const auto t2 = clock::now();
    m.patch_bytes = patch.size();
    m.encode_seconds = seconds(t0, t1);
    m.apply_seconds = seconds(t1, t2);
    for (std::size_t i = 0; i < base.size(); ++i) std::memcpy(copy[i].data(), base[i].data, base[i].bytes);
  }
  return measured;
}

std::size_t best_codec(const std::vector<CodecMeasurement>& measured, double bits_per_second) {
  PULSE_CHECK(!measured.empty(), "no codec measured");
  std::size_t best = 0;
  for (std::size_t i = 1; i < measured.size(); ++i)
    if (measured[i].total_seconds(bits_per_second) < measured[best].total_seconds(bits_per_second)) best = i;
  return best;
}

double parse_bandwidth(const std::string& text) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  if (unit.size() > 2 && unit.compare(unit.size() - 2, 2, "/s") == 0) unit.resize(unit.size() - 2);
  double scale = 0;
  const std::pair<const char*, double> units[] = {{"bit", 1},  {"kbit", 1e3}, {"Mbit", 1e6}, {"Gbit", 1e9}, {"Tbit", 1e12},
                                                  {"B", 8},    {"kB", 8e3},   {"MB", 8e6},   {"GB", 8e9},   {"TB", 8e12}};
  for (const auto& [name, s] : units)
    if (unit == name) scale = s;
  PULSE_CHECK(used > 0 && scale > 0 && value > 0 && std::isfinite(value),
              "bandwidth '" + text + "' is not a positive number with a unit (bit, kbit, Mbit, Gbit, Tbit, B, kB, MB, GB, TB)");
  return value * scale;
}

}  // namespace pulse::sync
