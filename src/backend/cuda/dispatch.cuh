// Type dispatch for the quantized kernels: calls f(std::integral_constant<int, T>{}) for the
// ggml type id, or throws Error(Status::unsupported) naming @p what (try_dispatch_type: returns
// false instead).
#pragma once

#include <string>
#include <type_traits>
#include <utility>

#include "core/status.hpp"
#include "backend/cuda/quant_unit.cuh"

namespace ep::backend::cuda::quant {

/// Calls f(std::integral_constant<int, T>{}) for a ggml type id the GEMV kernels run; false
/// (nothing called) for any other id.
template <typename F>
bool try_dispatch_type(uint32_t type, F &&f) {
  switch (static_cast<int>(type)) {
    case kF32: f(std::integral_constant<int, kF32>{}); return true;
    case kF16: f(std::integral_constant<int, kF16>{}); return true;
    case kBF16: f(std::integral_constant<int, kBF16>{}); return true;
    case kQ8_0: f(std::integral_constant<int, kQ8_0>{}); return true;
    case kMXFP4: f(std::integral_constant<int, kMXFP4>{}); return true;
    case kQ2_K: f(std::integral_constant<int, kQ2_K>{}); return true;
    case kQ3_K: f(std::integral_constant<int, kQ3_K>{}); return true;
    case kQ4_K: f(std::integral_constant<int, kQ4_K>{}); return true;
    case kQ5_K: f(std::integral_constant<int, kQ5_K>{}); return true;
    case kQ6_K: f(std::integral_constant<int, kQ6_K>{}); return true;
    case kIQ2_XXS: f(std::integral_constant<int, kIQ2_XXS>{}); return true;
    default: return false;
  }
}

template <typename F>
void dispatch_type(uint32_t type, const char *what, F &&f) {
  if (!try_dispatch_type(type, std::forward<F>(f)))
    throw Error(Status::unsupported, std::string(what) + ": ggml type id " + std::to_string(type) + " has no CUDA kernel");
}

}  // namespace ep::backend::cuda::quant
