# Finds Kokkos >= 3.4 and repairs Debian's package; used by pulse's own build and by
# downstream projects through pulseConfig.cmake. Sets PULSE_KOKKOS_CUDA.
if(NOT TARGET Kokkos::kokkos)
  find_package(Kokkos 3.4 REQUIRED)
endif()
# Debian's KokkosConfig.cmake (Trilinos build) points Kokkos::kokkos at a folder that does not
# exist (/usr/lib/include), while the headers live in /usr/include/trilinos. Keep the folders
# that exist and add the one that holds Kokkos_Core.hpp.
get_target_property(_pulse_kokkos_inc Kokkos::kokkos INTERFACE_INCLUDE_DIRECTORIES)
set(_pulse_kokkos_ok FALSE)
foreach(_dir IN LISTS _pulse_kokkos_inc)
  if(EXISTS "${_dir}/Kokkos_Core.hpp")
    set(_pulse_kokkos_ok TRUE)
  endif()
endforeach()
if(NOT _pulse_kokkos_ok)
  find_path(PULSE_KOKKOS_INCLUDE_DIR Kokkos_Core.hpp
    HINTS ${_pulse_kokkos_inc} "${Kokkos_DIR}/../../../../include" "${Kokkos_DIR}/../../../include"
    PATHS /usr/include
    PATH_SUFFIXES trilinos kokkos)
  if(NOT PULSE_KOKKOS_INCLUDE_DIR)
    message(FATAL_ERROR "pulse: Kokkos found at ${Kokkos_DIR} but Kokkos_Core.hpp is not in its include folders; set Kokkos_ROOT to a complete Kokkos install")
  endif()
  set(_pulse_kokkos_existing "")
  foreach(_dir IN LISTS _pulse_kokkos_inc)
    if(IS_DIRECTORY "${_dir}")
      list(APPEND _pulse_kokkos_existing "${_dir}")
    endif()
  endforeach()
  set_property(TARGET Kokkos::kokkos PROPERTY INTERFACE_INCLUDE_DIRECTORIES
    ${_pulse_kokkos_existing} "${PULSE_KOKKOS_INCLUDE_DIR}")
  message(STATUS "pulse: Kokkos headers taken from ${PULSE_KOKKOS_INCLUDE_DIR}")
endif()
# Kokkos >= 3.4 lists its backends in Kokkos_DEVICES.
set(PULSE_KOKKOS_CUDA OFF)
if("CUDA" IN_LIST Kokkos_DEVICES)
  set(PULSE_KOKKOS_CUDA ON)
endif()
message(STATUS "pulse: Kokkos ${Kokkos_VERSION}, devices: ${Kokkos_DEVICES}")

