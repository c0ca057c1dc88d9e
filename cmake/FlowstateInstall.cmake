# An installable, find_package-able flowstate: `find_package(flowstate CONFIG REQUIRED)`, then
# link flowstate::flowstate (or a layer: flowstate::core, ::serialization, ::nodes, ::graph,
# ::config; ::tools, above ::graph, holds verify, the bench harness, the save/restore oracle and
# GradientAccumulator). tests/package/ is a consumer project that CI builds against an
# installed tree.
include(CMakePackageConfigHelpers)
# Headers as the build tree has them: <flowstate/core/tensor.h>, <flowstate/flowstate.h>.
# config/yaml_support.h (it includes yaml-cpp, a private dependency), graph/loader_runtime*.h
# (the Loader's TBB graph) and serialization/checkpoint_internal.h (what the checkpoint
# protocol's files share) are internal.
install(DIRECTORY core serialization nodes graph tools config
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/flowstate
        FILES_MATCHING PATTERN "*.h" PATTERN "yaml_support.h" EXCLUDE
        PATTERN "loader_runtime.h" EXCLUDE
        PATTERN "loader_runtime_parts.h" EXCLUDE
        PATTERN "checkpoint_internal.h" EXCLUDE)
install(FILES flowstate.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/flowstate)
if(FLOWSTATE_HAVE_MPI)
  install(DIRECTORY mpi DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/flowstate FILES_MATCHING PATTERN "*.h")
endif()
install(EXPORT flowstateTargets NAMESPACE flowstate:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flowstate)
configure_package_config_file(cmake/flowstateConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/flowstateConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flowstate)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/flowstateConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/flowstateConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/flowstateConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flowstate)
