#pragma once
// The MPI datatype of a C++ element type. Unknown types fail at compile time, so a collective
// can never silently reinterpret memory with the wrong element size.
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace pulse {

namespace detail {
template <class T>
inline constexpr bool no_mpi_type = false;
}  // namespace detail

template <class T>
MPI_Datatype mpi_type() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<U, double>) return MPI_DOUBLE;
  else if constexpr (std::is_same_v<U, std::int32_t>) return MPI_INT32_T;
  else if constexpr (std::is_same_v<U, std::int64_t>) return MPI_INT64_T;
  else if constexpr (std::is_same_v<U, std::uint8_t>) return MPI_UINT8_T;
  else if constexpr (std::is_same_v<U, std::uint16_t>) return MPI_UINT16_T;  // BF16 bit patterns
  else if constexpr (std::is_same_v<U, std::uint32_t>) return MPI_UINT32_T;
  else if constexpr (std::is_same_v<U, std::uint64_t>) return MPI_UINT64_T;
  else if constexpr (std::is_same_v<U, char>) return MPI_CHAR;
  else if constexpr (std::is_same_v<U, std::byte>) return MPI_BYTE;
  else static_assert(detail::no_mpi_type<U>,
                     "pulse::mpi_type: no MPI datatype for this element type");
}

}  // namespace pulse
