# Installs the build into a scratch prefix, then builds and runs out-of-tree consumers:
# with find_package(expertpack) (C, C++, shared and static) and with pkg-config (C).
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()

run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer/project -B ${WORK_DIR}/build
    -G ${CMAKE_GENERATOR} -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
foreach(exe consumer_c consumer_cxx consumer_cxx_static)
  run(${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${prefix}/lib:${prefix}/lib/x86_64-linux-gnu:$ENV{LD_LIBRARY_PATH}
      ${WORK_DIR}/build/${exe})
endforeach()

# pkg-config
file(GLOB pc_dir LIST_DIRECTORIES true ${prefix}/lib*/pkgconfig ${prefix}/lib/*/pkgconfig)
find_program(PKG_CONFIG pkg-config REQUIRED)
# The distribution's own .pc files (libcrypto, ...) stay visible even where PKG_CONFIG_LIBDIR
# was narrowed (the GPU machine's .devdeps/env.sh does that).
# A sysroot (the GPU machine's env.sh sets one for its carried packages) would be prefixed to
# the scratch prefix's -I path too.
unset(ENV{PKG_CONFIG_SYSROOT_DIR})
set(ENV{PKG_CONFIG_PATH} "${pc_dir}:$ENV{PKG_CONFIG_PATH}:/usr/lib/x86_64-linux-gnu/pkgconfig:/usr/lib/pkgconfig:/usr/share/pkgconfig")
execute_process(COMMAND ${PKG_CONFIG} --cflags --libs expertpack OUTPUT_VARIABLE flags
                RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config does not know expertpack (looked in ${pc_dir})")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
run(cc -std=c99 -Wall -Werror ${SOURCE_DIR}/tests/consumer/project/main.c ${flags}
    -o ${WORK_DIR}/consumer_pkgconfig)
run(${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${prefix}/lib:${prefix}/lib/x86_64-linux-gnu:$ENV{LD_LIBRARY_PATH}
    ${WORK_DIR}/consumer_pkgconfig)
message(STATUS "install + find_package + pkg-config consumers: OK")
