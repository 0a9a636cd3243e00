# Installs the libraries, the public headers, a CMake package (find_package(expertpack)) and a
# pkg-config file (expertpack.pc).
include_guard(GLOBAL)
include(CMakePackageConfigHelpers)

set(EP_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/expertpack)

install(TARGETS expertpack expertpack_static EXPORT expertpackTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/expertpack DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")
install(EXPORT expertpackTargets NAMESPACE expertpack:: DESTINATION ${EP_CMAKE_DIR})

configure_package_config_file(cmake/expertpackConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/expertpackConfig.cmake INSTALL_DESTINATION ${EP_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/expertpackConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES
  ${CMAKE_CURRENT_BINARY_DIR}/expertpackConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/expertpackConfigVersion.cmake
  cmake/EpDependencies.cmake
  DESTINATION ${EP_CMAKE_DIR})

# pkg-config: Requires.private lists what the static library needs.
set(EP_PC_REQUIRES_PRIVATE "fmt libxxhash libpcre2-8 libcrypto")
if(EP_HAVE_URING)
  string(APPEND EP_PC_REQUIRES_PRIVATE " liburing")
endif()
set(EP_PC_LIBS_PRIVATE "-lstdc++ -lpthread")
if(EP_HAVE_CUDA)
  string(APPEND EP_PC_LIBS_PRIVATE " -L${CUDAToolkit_LIBRARY_DIR} -lcublasLt -lcublas -lcudart")
endif()
# Relocatable: the prefix is found relative to the .pc file, so `cmake --install --prefix X` works.
file(RELATIVE_PATH EP_PC_RELATIVE_PREFIX "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
configure_file(cmake/expertpack.pc.in ${CMAKE_CURRENT_BINARY_DIR}/expertpack.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/expertpack.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
