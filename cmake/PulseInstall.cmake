# Installs the pulse library, its headers and a CMake package, so a downstream project can
#   find_package(pulse) ; target_link_libraries(app PRIVATE pulse::pulse)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS pulse ${PULSE_LAYERS} EXPORT pulseTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY kernels DESTINATION include/pulse FILES_MATCHING PATTERN "*.hpp")
install(DIRECTORY src/ DESTINATION include/pulse FILES_MATCHING PATTERN "*.hpp")
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/generated/pulse_build_info.hpp
              ${CMAKE_CURRENT_BINARY_DIR}/generated/pulse_config.hpp DESTINATION include/pulse)

set(PULSE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/pulse)
install(EXPORT pulseTargets NAMESPACE pulse:: DESTINATION ${PULSE_CMAKE_DIR})
configure_package_config_file(cmake/pulseConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/pulseConfig.cmake INSTALL_DESTINATION ${PULSE_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/pulseConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/pulseConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/pulseConfigVersion.cmake
              cmake/PulseKokkos.cmake
        DESTINATION ${PULSE_CMAKE_DIR})
