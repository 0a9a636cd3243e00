# Test helpers: one executable per test file group, registered with CTest.
# A test that exits 77 is reported as skipped (GPU tests without a GPU).
include_guard(GLOBAL)

find_package(Catch2 REQUIRED)
if(Catch2_VERSION VERSION_GREATER_EQUAL 3)
  set(EP_CATCH_DEFINITIONS EP_CATCH_V3=1)
endif()
message(STATUS "Catch2 ${Catch2_VERSION} (${Catch2_DIR})")

# Test data: EP_TEST_DATA_DIR is tests/data as committed; EP_TEST_BUILD_DATA_DIR holds what the
# build unpacks from it. The DeepSeek-V3 tokenizer is committed as a tar.xz (1.3 MB instead of
# 7.8 MB) and unpacked with CMake's own tar, so no xz program is needed.
set(EP_TEST_BUILD_DATA_DIR ${PROJECT_BINARY_DIR}/tests/data)
set(_ep_tok_src ${PROJECT_SOURCE_DIR}/tests/data/tokenizer/deepseek-v3)
set(_ep_tok_dir ${EP_TEST_BUILD_DATA_DIR}/tokenizer/deepseek-v3)
add_custom_command(
  OUTPUT ${_ep_tok_dir}/tokenizer.json ${_ep_tok_dir}/tokenizer_config.json
  COMMAND ${CMAKE_COMMAND} -E make_directory ${_ep_tok_dir}
  COMMAND ${CMAKE_COMMAND} -E chdir ${_ep_tok_dir} ${CMAKE_COMMAND} -E tar xf ${_ep_tok_src}/tokenizer.tar.xz --touch
  DEPENDS ${_ep_tok_src}/tokenizer.tar.xz
  COMMENT "Unpacking the DeepSeek-V3 tokenizer for the tests"
  VERBATIM)
add_custom_target(ep_test_data ALL DEPENDS ${_ep_tok_dir}/tokenizer.json ${_ep_tok_dir}/tokenizer_config.json)

# The precompiled header of the tests: on with clang (the asan preset) by default. Not with gcc 12:
# through a precompiled header it reports -Warray-bounds inside libstdc++'s std::string, inlined
# into a test (tokenizer_corpus_test), which it does not without one: an error under EP_WERROR.
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  set(_ep_test_pch_default ON)
else()
  set(_ep_test_pch_default OFF)
endif()
option(EP_TEST_PCH "Compile the headers most test sources include (tests/support/test_pch.hpp) once per build"
       ${_ep_test_pch_default})

# The test code's own compile settings (the test mains, the test executables): in Release at -O1,
# which compiles a test source in about a quarter less time than -O3 (docs/testing.md, "CI"); the
# library, testkit and the programs the tests run stay at the build's level.
function(_ep_test_compile_options target)
  target_compile_options(${target} PRIVATE $<$<AND:$<CONFIG:Release>,$<COMPILE_LANGUAGE:CXX>>:-O1>)
endfunction()

# A static library holding one test main (CPU: Catch2's runner; GPU: skip without a device), on
# ep_catch: Catch2 v2's implementation, compiled once for both.
add_library(ep_catch STATIC ${PROJECT_SOURCE_DIR}/tests/support/catch_session.cpp)
target_link_libraries(ep_catch PUBLIC Catch2::Catch2)
target_include_directories(ep_catch PUBLIC ${PROJECT_SOURCE_DIR}/tests)
target_compile_definitions(ep_catch PUBLIC ${EP_CATCH_DEFINITIONS})
ep_apply_sanitizers(ep_catch)
_ep_test_compile_options(ep_catch)
function(_ep_add_test_main target source)
  add_library(${target} STATIC ${PROJECT_SOURCE_DIR}/tests/support/${source})
  target_link_libraries(${target} PUBLIC ep_catch ep_internal ep_testkit)
  target_compile_definitions(${target} PUBLIC
    EP_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data" EP_TEST_BUILD_DATA_DIR="${EP_TEST_BUILD_DATA_DIR}")
  add_dependencies(${target} ep_test_data)
  ep_apply_sanitizers(${target})
  _ep_test_compile_options(${target})
endfunction()
_ep_add_test_main(ep_test_main catch_main.cpp)
_ep_add_test_main(ep_gpu_test_main gpu_main.cpp)

# The precompiled header, compiled once by ep_test_pch (an executable with the test executables'
# flags: a header compiled for a static library's -fPIC does not serve their -fPIE; it is a Catch2
# runner with no test case) and reused by every test executable (clang refuses a header made with
# other flags; gcc warns, -Winvalid-pch, an error under EP_WERROR). ccache
# (CMAKE_CXX_COMPILER_LAUNCHER) caches such compiles only with the sloppiness
# pch_defines,time_macros (its manual, "Precompiled headers"; no test uses __DATE__ or __TIME__),
# which the test targets' launcher sets.
if(EP_TEST_PCH)
  add_executable(ep_test_pch ${PROJECT_SOURCE_DIR}/tests/support/test_pch.cpp)
  target_link_libraries(ep_test_pch PRIVATE ep_test_main)
  target_precompile_headers(ep_test_pch PRIVATE ${PROJECT_SOURCE_DIR}/tests/support/test_pch.hpp)
endif()

# The settings of a test executable: the project's warnings and sanitizers, the test code's
# compile options, the precompiled header.
function(ep_configure_test_target target)
  ep_configure_target(${target})
  _ep_test_compile_options(${target})
  if(EP_TEST_PCH)
    if(NOT target STREQUAL "ep_test_pch")
      target_precompile_headers(${target} REUSE_FROM ep_test_pch)
    endif()
    if(CMAKE_CXX_COMPILER_LAUNCHER MATCHES "ccache")
      set(sloppiness "$ENV{CCACHE_SLOPPINESS}")
      list(APPEND sloppiness pch_defines time_macros)
      list(JOIN sloppiness "," sloppiness)
      set_target_properties(${target} PROPERTIES CXX_COMPILER_LAUNCHER
        "${CMAKE_COMMAND};-E;env;CCACHE_SLOPPINESS=${sloppiness};${CMAKE_CXX_COMPILER_LAUNCHER}")
    endif()
  endif()
endfunction()
if(EP_TEST_PCH)
  ep_configure_test_target(ep_test_pch)
endif()

# One Catch2 executable registered as one CTest test.
function(_ep_add_catch_test name main label default_timeout timeout labels sources extra_args)
  add_executable(${name} ${sources})
  ep_configure_test_target(${name})
  target_link_libraries(${name} PRIVATE ${main})
  add_test(NAME ${name} COMMAND ${name} ${extra_args} --warn NoAssertions)
  if(NOT timeout)
    set(timeout ${default_timeout})
  endif()
  set(all_labels ${label} ${labels})
  if(NOT "slow" IN_LIST all_labels AND NOT "fast" IN_LIST all_labels)
    list(APPEND all_labels fast)
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "${all_labels}" TIMEOUT ${timeout}
                       SKIP_RETURN_CODE 77)
endfunction()

# Every test carries `fast` or `slow` (docs/testing.md): `slow` is one that takes over about 20 s
# on the 2-core CI machine or writes a big file; the sanitizer passes of .ci/run run `fast` only.
# The helpers below label a test `fast` unless its LABELS say `slow`; tests added with add_test()
# name theirs, and tests_labelled (tests/CMakeLists.txt) fails on any test without one.

# ep_add_test(NAME <name> SOURCES <files...> [LABELS <labels...>] [TIMEOUT <s>])
# A Catch2 executable registered as one CTest test with label "cpu", test cases in random order.
function(ep_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LABELS" ${ARGN})
  _ep_add_catch_test(${T_NAME} ep_test_main cpu 300 "${T_TIMEOUT}" "${T_LABELS}" "${T_SOURCES}"
                     "--order;rand")
endfunction()

# ep_add_gpu_test(NAME <name> SOURCES <files...> [LABELS ...]): like ep_add_test, but the
# executable skips (exit 77) without a CUDA device. Only built with the CUDA backend.
function(ep_add_gpu_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LABELS" ${ARGN})
  if(EP_HAVE_CUDA)
    _ep_add_catch_test(${T_NAME} ep_gpu_test_main gpu 600 "${T_TIMEOUT}" "${T_LABELS}" "${T_SOURCES}" "")
  endif()
endfunction()
