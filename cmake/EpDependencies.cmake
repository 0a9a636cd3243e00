# System dependencies as imported targets named ep_dep::<name>.
#
# Used in two places: the build itself (every dependency required) and the installed
# expertpackConfig.cmake (EP_DEPS_FOR_CONSUMER set: needed only by users of the static library,
# so a missing one is not fatal there). Nothing is vendored; everything comes from the system.
include_guard(GLOBAL)
include(CMakeFindDependencyMacro)
find_package(PkgConfig QUIET)

set(_ep_required REQUIRED)
if(EP_DEPS_FOR_CONSUMER)
  set(_ep_required QUIET)
endif()

function(_ep_pkg_target name module)
  if(TARGET ep_dep::${name})
    return()
  endif()
  if(NOT PKG_CONFIG_FOUND)
    if(NOT EP_DEPS_FOR_CONSUMER)
      message(FATAL_ERROR "pkg-config is needed to find ${module}: run scripts/install-deps")
    endif()
    return()
  endif()
  pkg_check_modules(EP_PC_${name} QUIET IMPORTED_TARGET GLOBAL ${module})
  if(EP_PC_${name}_FOUND)
    add_library(ep_dep::${name} ALIAS PkgConfig::EP_PC_${name})
  elseif(NOT EP_DEPS_FOR_CONSUMER)
    message(FATAL_ERROR "${module} not found (pkg-config module '${module}'): run scripts/install-deps")
  endif()
endfunction()

find_package(fmt ${_ep_required})
find_package(OpenSSL ${_ep_required} COMPONENTS Crypto)
find_package(nlohmann_json 3 ${_ep_required})
find_package(Threads REQUIRED)
_ep_pkg_target(xxhash libxxhash)
_ep_pkg_target(pcre2 libpcre2-8)

# liburing is optional: without it the reader uses its pread thread pool.
if(NOT DEFINED EP_WITH_URING)
  set(EP_WITH_URING AUTO)
endif()
set(EP_HAVE_URING OFF)
if(NOT EP_WITH_URING STREQUAL "OFF" AND PKG_CONFIG_FOUND)
  pkg_check_modules(EP_PC_uring QUIET IMPORTED_TARGET GLOBAL liburing)
  if(EP_PC_uring_FOUND)
    if(NOT TARGET ep_dep::uring)
      add_library(ep_dep::uring ALIAS PkgConfig::EP_PC_uring)
    endif()
    set(EP_HAVE_URING ON)
  endif()
endif()
if(EP_WITH_URING STREQUAL "ON" AND NOT EP_HAVE_URING AND NOT EP_DEPS_FOR_CONSUMER)
  message(FATAL_ERROR "EP_WITH_URING=ON but liburing was not found: run scripts/install-deps")
endif()

# The list every internal target links; CUDA is appended by EpCuda.cmake.
set(EP_DEP_TARGETS fmt::fmt OpenSSL::Crypto nlohmann_json::nlohmann_json Threads::Threads
    ep_dep::xxhash ep_dep::pcre2)
if(EP_HAVE_URING)
  list(APPEND EP_DEP_TARGETS ep_dep::uring)
endif()
