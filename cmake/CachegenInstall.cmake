# Install rules: what `cmake --install` puts under the prefix (docs/INSTALL.md).
include(CMakePackageConfigHelpers)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/cachegen DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

get_property(cachegen_export_targets GLOBAL PROPERTY CACHEGEN_LAYER_TARGETS)
get_property(CACHEGEN_INSTALLED_COMPONENTS GLOBAL PROPERTY CACHEGEN_COMPONENTS)
if(TARGET cachegen_llama_dep)
  list(APPEND cachegen_export_targets cachegen_llama_dep)
endif()
if(CACHEGEN_HAVE_CUDA)
  set_target_properties(cachegen_cuda PROPERTIES EXPORT_NAME cuda_static)
  list(APPEND cachegen_export_targets cachegen_cuda)
  list(APPEND CACHEGEN_INSTALLED_COMPONENTS cuda)
endif()
install(TARGETS ${cachegen_export_targets} EXPORT cachegenTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET cachegen_cli)
  install(TARGETS cachegen_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

set(cachegen_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/cachegen)
install(EXPORT cachegenTargets NAMESPACE cachegen:: DESTINATION ${cachegen_cmake_dir})
# Whether the llama layer's llama.cpp came as a CMake package (found again by
# the consumer) or as library paths (recorded in the exported target).
if(TARGET llama)
  set(CACHEGEN_LLAMA_PACKAGE ON)
else()
  set(CACHEGEN_LLAMA_PACKAGE OFF)
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/cachegenConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/cachegenConfig.cmake INSTALL_DESTINATION ${cachegen_cmake_dir})
# 0.x: a minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cachegenConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cachegenConfig.cmake ${PROJECT_BINARY_DIR}/cachegenConfigVersion.cmake
        DESTINATION ${cachegen_cmake_dir})

# pkg-config for the core (the C API's users): relocatable, the prefix found
# from the .pc file's own folder.
file(RELATIVE_PATH cachegen_pc_to_prefix /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
set(CACHEGEN_PC_PREFIX "\${pcfiledir}/${cachegen_pc_to_prefix}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/cachegen-core.pc.in ${PROJECT_BINARY_DIR}/cachegen-core.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/cachegen-core.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
