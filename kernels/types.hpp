#pragma once
// The one header that fixes pulse's precision and index types.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <type_traits>

#include "core/index.hpp"  // index_t, plain C++ for the Kokkos-free layers
#include "core/precision.hpp"  // Precision, plain C++ for the settings

namespace pulse {

// A BF16 value is carried as its bit pattern: comparisons are on bits, never on floats,
// so +0/-0 and NaN payloads survive exactly.
using bf16_bits = std::uint16_t;
// Accumulation type of all reductions over floats.
using accum_t = double;

// Flat buffers may exceed 2^32 elements; the default RangePolicy index on CUDA is 32-bit.
template <class ExecSpace>
using FlatPolicy = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<index_t>>;
// The kernels' flat index is core's index_t: a patch's indices are the kernels' indices.
static_assert(std::is_same_v<FlatPolicy<Kokkos::DefaultHostExecutionSpace>::index_type, index_t> &&
                  std::is_signed_v<index_t> && sizeof(index_t) == 8,
              "kernels index flat buffers with core/index.hpp's index_t (64-bit, signed)");

// Model layer kernels take unmanaged 1-D views into flat buffers with explicit dimensions, as
// llm.c's layers take pointers; the execution space fixes the memory space.
template <class ExecSpace>
using FloatSpan = Kokkos::View<float*, typename ExecSpace::memory_space, Kokkos::MemoryUnmanaged>;
template <class ExecSpace>
using ConstFloatSpan = Kokkos::View<const float*, typename ExecSpace::memory_space, Kokkos::MemoryUnmanaged>;
template <class ExecSpace>
using ConstIntSpan = Kokkos::View<const int*, typename ExecSpace::memory_space, Kokkos::MemoryUnmanaged>;

using DefaultExec = Kokkos::DefaultExecutionSpace;
using DefaultMem = DefaultExec::memory_space;

}  // namespace pulse
