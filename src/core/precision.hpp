#pragma once
// How the trainer keeps weights and Adam state, in plain C++ so that settings (train_config) need
// no Kokkos; the kernels take it as a parameter (kernels/adamw.hpp).
#include "core/enum_names.hpp"

namespace pulse {

enum class Precision {
  mixed,  // FP32 master weights, FP32 Adam moments, BF16 copy written in the same pass
  bf16,   // weights and Adam moments stored in BF16, as PyTorch does for a .bfloat16() model
};
inline constexpr NamedValue<Precision> precision_names[] = {{Precision::mixed, "mixed"}, {Precision::bf16, "bf16"}};

}  // namespace pulse
