# Test helpers: one executable per test file group, registered with CTest.
# A test that exits 77 is reported as skipped (GPU tests without a GPU).
include_guard(GLOBAL)

find_package(Catch2 REQUIRED)
set(EP_CATCH_TARGET Catch2::Catch2)
if(Catch2_VERSION VERSION_GREATER_EQUAL 3)
  set(EP_CATCH_DEFINITIONS EP_CATCH_V3=1)
endif()
message(STATUS "Catch2 ${Catch2_VERSION} (${Catch2_DIR})")

add_library(ep_test_main STATIC ${PROJECT_SOURCE_DIR}/tests/support/catch_main.cpp)
target_link_libraries(ep_test_main PUBLIC ${EP_CATCH_TARGET} ep_internal)
target_include_directories(ep_test_main PUBLIC ${PROJECT_SOURCE_DIR}/tests)
target_compile_definitions(ep_test_main PUBLIC ${EP_CATCH_DEFINITIONS} EP_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data"
                                                 EP_SHARED_DIR="${PROJECT_SOURCE_DIR}/../shared")
ep_apply_sanitizers(ep_test_main)

add_library(ep_gpu_test_main STATIC ${PROJECT_SOURCE_DIR}/tests/support/gpu_main.cpp)
target_link_libraries(ep_gpu_test_main PUBLIC ${EP_CATCH_TARGET} ep_internal)
target_include_directories(ep_gpu_test_main PUBLIC ${PROJECT_SOURCE_DIR}/tests)
target_compile_definitions(ep_gpu_test_main PUBLIC ${EP_CATCH_DEFINITIONS} EP_TEST_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data"
                                                     EP_SHARED_DIR="${PROJECT_SOURCE_DIR}/../shared")
ep_apply_sanitizers(ep_gpu_test_main)

# ep_add_test(NAME <name> SOURCES <files...> [LABELS <labels...>] [TIMEOUT <s>])
# A Catch2 executable tests/<name> registered as one CTest test with label "cpu".
function(ep_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  ep_configure_target(${T_NAME})
  target_link_libraries(${T_NAME} PRIVATE ep_test_main)
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} --order rand --warn NoAssertions)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  set_tests_properties(${T_NAME} PROPERTIES LABELS "cpu;${T_LABELS}" TIMEOUT ${T_TIMEOUT}
                       SKIP_RETURN_CODE 77)
endfunction()

# ep_add_gpu_test(NAME <name> SOURCES <files...> [LABELS ...]): like ep_add_test, but the
# executable skips (exit 77) without a CUDA device. Only built with the CUDA backend.
function(ep_add_gpu_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LABELS" ${ARGN})
  if(NOT EP_HAVE_CUDA)
    return()
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  ep_configure_target(${T_NAME})
  target_link_libraries(${T_NAME} PRIVATE ep_gpu_test_main)
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} --warn NoAssertions)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  set_tests_properties(${T_NAME} PROPERTIES LABELS "gpu;${T_LABELS}" TIMEOUT ${T_TIMEOUT}
                       SKIP_RETURN_CODE 77)
endfunction()
