# Decides whether the CUDA backend is built (EP_HAVE_CUDA) and for which architectures.
include_guard(GLOBAL)
include(CheckLanguage)

set(EP_HAVE_CUDA OFF)
if(NOT EP_WITH_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(EP_NVCC nvcc HINTS /usr/local/cuda/bin ENV CUDA_PATH PATH_SUFFIXES bin)
    if(EP_NVCC)
      set(CMAKE_CUDA_COMPILER "${EP_NVCC}" CACHE FILEPATH "CUDA compiler")
    endif()
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # Users get a portable set; the GPU check builds for sm_90 only (scripts/dev/gpu-check).
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "80;86;89;90" CACHE STRING "CUDA architectures")
    endif()
    enable_language(CUDA)
    # CMake 3.25 does not know nvcc 12+'s C++20 flag: teach it.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    # Rule: .cu files never include fmt (nvcc cannot compile fmt 9 in C++20 mode). They use
    # core/status.hpp and the non-template helpers of gpu/check.hpp; formatting happens in
    # .cpp files compiled by the host compiler.
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(EP_HAVE_CUDA ON)
    list(APPEND EP_DEP_TARGETS CUDA::cudart CUDA::cublas CUDA::cublasLt)
  elseif(EP_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "EP_WITH_CUDA=ON but no CUDA compiler (nvcc) was found. Install the CUDA "
                        "Toolkit and put nvcc on PATH, or configure with -DEP_WITH_CUDA=OFF.")
  else()
    message(STATUS "nvcc not found: building without the CUDA backend (EP_WITH_CUDA=AUTO)")
  endif()
endif()
