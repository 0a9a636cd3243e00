// The gated activations of the expert FFNs, shared by the elementwise GLU kernel (norm_rope.cu)
// and the GEMV kernels that apply one to their input (GemvGlu, gemv_dp4a.cuh), so that
// both compute the same f32 values.
#pragma once

#include <cuda_runtime.h>

namespace ep::backend::cuda {

/// act(g)·u: kind 0 is SwiGLU, g·sigmoid(g)·u, with g clamped above and u to [−limit, limit] when
/// limit > 0 (DeepSeek-V4); kind 1 is SiTU, bg·tanh(g/bg)·sigmoid(g)·bu·tanh(u/bu) (Kimi-K3).
__device__ __forceinline__ float glu_activation(float g, float u, int kind, float limit, float bg, float bu) {
  if (kind == 1) {
    const float sig = 1.0f / (1.0f + expf(-g));
    return bg * tanhf(g / bg) * sig * (bu * tanhf(u / bu));
  }
  if (limit > 0.0f) {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
  }
  return g / (1.0f + expf(-g)) * u;
}

}  // namespace ep::backend::cuda
