// Type dispatch for the quantized kernels: calls f(std::integral_constant<int, T>{}) for the
// ggml type id, or throws Error(Status::unsupported) naming @p what.
#pragma once

#include <string>
#include <type_traits>

#include "core/status.hpp"
#include "backend/cuda/quant_unit.cuh"

namespace ep::backend::cuda::quant {

template <typename F>
void dispatch_type(uint32_t type, const char *what, F &&f) {
  switch (static_cast<int>(type)) {
    case kF32: return f(std::integral_constant<int, kF32>{});
    case kF16: return f(std::integral_constant<int, kF16>{});
    case kBF16: return f(std::integral_constant<int, kBF16>{});
    case kQ8_0: return f(std::integral_constant<int, kQ8_0>{});
    case kMXFP4: return f(std::integral_constant<int, kMXFP4>{});
    case kQ2_K: return f(std::integral_constant<int, kQ2_K>{});
    case kQ3_K: return f(std::integral_constant<int, kQ3_K>{});
    case kQ4_K: return f(std::integral_constant<int, kQ4_K>{});
    case kQ5_K: return f(std::integral_constant<int, kQ5_K>{});
    case kQ6_K: return f(std::integral_constant<int, kQ6_K>{});
    case kIQ2_XXS: return f(std::integral_constant<int, kIQ2_XXS>{});
    default:
      throw Error(Status::unsupported, std::string(what) + ": ggml type id " + std::to_string(type) +
                                           " has no CUDA kernel");
  }
}

}  // namespace ep::backend::cuda::quant
