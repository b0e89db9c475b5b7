#pragma once
// Codec choice by link bandwidth (docs/pulse-sync.md, "--codec auto"): for each candidate coding, the time to ship one
// patch is T = encode + 8 S / B + apply, with encode and apply times measured on this machine
// for this very patch and S its size; the best codec minimises T. Between two codecs a (smaller)
// and b (faster) the crossover bandwidth is B* = 8 (S_a - S_b) / (t_b - t_a), t = encode + apply.
#include <string>
#include <vector>

#include "sync/patch.hpp"

namespace pulse::sync {

struct CodecMeasurement {
  std::string name;
  EncodeOptions options;
  std::size_t patch_bytes = 0;
  double encode_seconds = 0;
  double apply_seconds = 0;
  double total_seconds(double bits_per_second) const {
    return encode_seconds + 8.0 * double(patch_bytes) / bits_per_second + apply_seconds;
  }
};

// The candidates pulse offers: keydiff from fastest to smallest, raw values, and expclass (the
// smallest on training steps).
std::vector<CodecMeasurement> codec_candidates();

// Encodes and applies (to a copy of base) the patch with every candidate, timing both.
std::vector<CodecMeasurement> measure_codecs(const std::vector<TensorRef>& base, const std::vector<TensorRef>& target);

// Index of the candidate with the least total time at this bandwidth.
std::size_t best_codec(const std::vector<CodecMeasurement>& measured, double bits_per_second);

// "1Gbit", "100Mbit", "25Gbit/s", "1.5GB" (bytes) -> bits per second; throws on anything else.
double parse_bandwidth(const std::string& text);

}  // namespace pulse::sync
