# An installable, find_package-able flowstate: `find_package(flowstate)` then link
# flowstate::graph (which brings the lower layers).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
install(DIRECTORY core serialization nodes graph DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/flowstate
        FILES_MATCHING PATTERN "*.h")
install(EXPORT flowstateTargets NAMESPACE flowstate:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flowstate)
configure_package_config_file(cmake/flowstateConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/flowstateConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flowstate)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/flowstateConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/flowstateConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/flowstateConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flowstate)
