#pragma once
// What pulse-measure compares an FP32 tensor as: the BF16 or F16 value the forward pass reads
// (the cast of an FP32 master, round to nearest even: kernels/bf16.hpp's float_to_bf16, and
// IEEE binary16 here), or its own FP32 bits (raw). FSDP and DeepSpeed save the FP32 master, whose
// low bits change at nearly every step while its BF16 view mostly does not: the paper's sparsity is
// that of the view. BF16 and F16 tensors are what the forward pass reads already and are compared
// as stored.
#include <cstddef>
#include <cstdint>
#include <string>

namespace pulse::measure {

enum class CompareAs { raw, bf16, f16 };

// "raw", "bf16", "f16"; parse_compare_as throws pulse::Error on any other name.
std::string compare_as_name(CompareAs as);
CompareAs parse_compare_as(const std::string& name);

// IEEE binary16 bits of x, round to nearest even; overflow to infinity, every NaN the quiet NaN
// 0x7E00 (as torch's .to(torch.float16)).
std::uint16_t float_to_f16(float x);

// The 16-bit casts (as != raw) of n FP32 elements at f32 (any alignment) into out (2n bytes).
void cast_block(CompareAs as, const std::byte* f32, std::size_t n, std::byte* out);

}  // namespace pulse::measure
