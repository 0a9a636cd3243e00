// CUDA error checking: every runtime call and every kernel launch is checked, and a failure
// becomes an ep::Error naming the call and the CUDA error. Safe to include from .cu files.
#pragma once

#include <cuda_runtime.h>

#include "core/status.hpp"

namespace ep::gpu {

/// Maps a CUDA error to the C API status (no driver / no device → Status::no_device).
Status status_of(cudaError_t error) noexcept;

/// Throws ep::Error describing @p error; @p what names the call or kernel.
[[noreturn]] void throw_error(cudaError_t error, const char *what);

/// Throws ep::Error when @p error is not cudaSuccess.
inline void check(cudaError_t error, const char *what) {
  if (error != cudaSuccess) throw_error(error, what);
}

}  // namespace ep::gpu

/// Checks a CUDA runtime call, naming it in the error message.
#define EP_CUDA_CHECK(call) ::ep::gpu::check((call), #call)
/// Checks the last kernel launch (launch configuration errors); @p name names the kernel.
#define EP_CUDA_CHECK_LAUNCH(name) ::ep::gpu::check(cudaGetLastError(), name)
