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

# A static library holding one test main (CPU: Catch2's runner; GPU: skip without a device).
function(_ep_add_test_main target source)
  add_library(${target} STATIC ${PROJECT_SOURCE_DIR}/tests/support/${source})
  target_link_libraries(${target} PUBLIC Catch2::Catch2 ep_internal ep_testkit)
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR}/tests)
  target_compile_definitions(${target} PUBLIC ${EP_CATCH_DEFINITIONS}
    EP_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data" EP_TEST_BUILD_DATA_DIR="${EP_TEST_BUILD_DATA_DIR}")
  add_dependencies(${target} ep_test_data)
  ep_apply_sanitizers(${target})
endfunction()
_ep_add_test_main(ep_test_main catch_main.cpp)
_ep_add_test_main(ep_gpu_test_main gpu_main.cpp)

# One Catch2 executable registered as one CTest test.
function(_ep_add_catch_test name main label default_timeout timeout labels sources extra_args)
  add_executable(${name} ${sources})
  ep_configure_target(${name})
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
