# `cmake --install`: the public headers, the libraries with an exported CMake package
# (sparsekvConfig.cmake, find_package(sparsekv CONFIG)) and a pkg-config file (sparsekv.pc).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set_target_properties(sparsekv_control_plane PROPERTIES EXPORT_NAME control_plane)
set_target_properties(sparsekv_attention PROPERTIES EXPORT_NAME attention)
set_target_properties(sparsekv_planner PROPERTIES EXPORT_NAME planner)
set_target_properties(sparsekv_metrics PROPERTIES EXPORT_NAME metrics)
set(sparsekv_install_targets sparsekv sparsekv_control_plane sparsekv_attention sparsekv_planner
  sparsekv_metrics)
if(TARGET sparsekv_cuda_common)
  # Header-only and private to the build; exported only because the static libraries name it
  # among their link dependencies (it brings CUDA::cudart).
  set_target_properties(sparsekv_cuda_common PROPERTIES EXPORT_NAME cuda_common)
  list(APPEND sparsekv_install_targets sparsekv_cuda_common)
endif()
install(TARGETS ${sparsekv_install_targets}
  EXPORT sparsekvTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/sparsekv DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")

set(sparsekv_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/sparsekv)
install(EXPORT sparsekvTargets NAMESPACE sparsekv:: DESTINATION ${sparsekv_cmake_dir})
configure_package_config_file(cmake/sparsekvConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/sparsekvConfig.cmake INSTALL_DESTINATION ${sparsekv_cmake_dir})
# 0.x releases are compatible only within the same minor version.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/sparsekvConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/sparsekvConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/sparsekvConfigVersion.cmake DESTINATION ${sparsekv_cmake_dir})

# pkg-config: the library is static unless BUILD_SHARED_LIBS, so its dependencies go into Libs
# (and UCX into Requires) for a plain `pkg-config --libs sparsekv`; a shared build lists them
# as private.
set(SPARSEKV_PC_CFLAGS "")
set(SPARSEKV_PC_LIBS "")
set(SPARSEKV_PC_REQUIRES "")
if(SPARSEKV_WITH_UCX)
  set(SPARSEKV_PC_REQUIRES "ucx")
endif()
if(SPARSEKV_WITH_CUDA)
  set(SPARSEKV_PC_CFLAGS "-DSPARSEKV_WITH_CUDA=1")
  foreach(dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    string(APPEND SPARSEKV_PC_CFLAGS " -I${dir}")
  endforeach()
  set(SPARSEKV_PC_LIBS "-L${CUDAToolkit_LIBRARY_DIR} -lcudart")
endif()
if(CMAKE_THREAD_LIBS_INIT)
  string(APPEND SPARSEKV_PC_LIBS " ${CMAKE_THREAD_LIBS_INIT}")
endif()
if(BUILD_SHARED_LIBS)
  set(SPARSEKV_PC_REQUIRES_KIND ".private")
else()
  set(SPARSEKV_PC_REQUIRES_KIND "")
endif()
file(RELATIVE_PATH SPARSEKV_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
configure_file(cmake/sparsekv.pc.in ${CMAKE_CURRENT_BINARY_DIR}/sparsekv.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/sparsekv.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
