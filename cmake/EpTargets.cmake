# Helpers shared by every target: warnings, sanitizers, and the per-layer source hook.
include_guard(GLOBAL)

# Compile flags for every target of the project (C, C++ and CUDA host code).
function(ep_configure_target target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX,C>:-Wall -Wextra -Wshadow -Wno-missing-field-initializers>
    $<$<AND:$<COMPILE_LANGUAGE:CXX,C>,$<BOOL:${EP_WERROR}>>:-Werror>
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xcompiler=-Wall>)
  ep_apply_sanitizers(${target})
endfunction()

function(ep_apply_sanitizers target)
  if(EP_SANITIZE)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=${EP_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all>)
    target_link_options(${target} PRIVATE -fsanitize=${EP_SANITIZE})
    # clang links UBSan's C++ part (the vptr and function-type checks the library's code calls)
    # and the C++ library only into programs it links as C++: a C program on the library (the
    # C API's header and layout tests, examples/minimal.c) is linked as C++ too.
    if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
      set_property(TARGET ${target} PROPERTY LINKER_LANGUAGE CXX)
    endif()
  endif()
endfunction()

# Adds sources of one layer (src/<layer>) to the library. CUDA sources are only added when
# the CUDA backend is built.
function(ep_add_library_sources)
  target_sources(ep_objects PRIVATE ${ARGN})
endfunction()

# A command-line tool or example linked against the internal static library.
function(ep_add_executable name)
  add_executable(${name} ${ARGN})
  ep_configure_target(${name})
  target_link_libraries(${name} PRIVATE ep_internal)
endfunction()
