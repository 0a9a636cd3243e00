// Shape checks of the Kimi ops of backend::Backend (backend.hpp, "Kimi-Linear / Kimi-K3 ops"),
// the same on every backend: they throw Error(Status::shape / unsupported) naming the op, and
// return the dimensions the op runs with.
#pragma once

#include "backend/backend.hpp"

#include <cstdint>

namespace ep::backend {

struct ShortConvDims {
  int64_t channels = 0, n_tokens = 0, kernel = 0;
};
/// The largest convolution width short_conv_silu accepts.
inline constexpr int64_t kShortConvMaxKernel = 16;
ShortConvDims check_short_conv_silu(const Tensor &x, const Tensor &w, const Tensor &state, const Tensor &y, Device device);
/// Both f32 on @p device, contiguous, the same shape (l2_normalize, sigmoid).
void check_kimi_elementwise(const Tensor &x, const Tensor &y, const char *op, Device device);

struct KdaDims {
  int64_t dk = 0, dv = 0, n_heads = 0, n_tokens = 0;
};
KdaDims check_kda_gate(const Tensor &x, const Tensor &bias, const Tensor &a, const Tensor &g, Device device);
KdaDims check_kda_recurrence(const Tensor &q, const Tensor &k, const Tensor &v, const Tensor &g, const Tensor &beta,
                             const Tensor &state, const Tensor &out, Device device);
void check_gated_rms_norm(const Tensor &x, const Tensor &w, const Tensor &gate, const Tensor &y, Device device);

struct CausalAttentionDims {
  int64_t dqk = 0, dv = 0, n_heads = 0, n_tokens = 0, n_keys = 0;
};
CausalAttentionDims check_causal_attention(const Tensor &q, const Tensor &keys, const Tensor &values, int64_t n_past,
                                           const Tensor &out, Device device);

struct AttnResDims {
  int64_t d = 0, n_tokens = 0, n_banked = 0;
};
AttnResDims check_attn_res_mix(const Tensor *banked, const Tensor &cur, const Tensor &w, const Tensor &out, Device device);

}  // namespace ep::backend
