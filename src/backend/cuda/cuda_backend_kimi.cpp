// CudaBackend: the Kimi-Linear / Kimi-K3 ops (kernels in cuda/kimi_ops.cu). Shapes are checked
// by the shared backend/kimi_checks.hpp functions, as on the CPU.
#include "backend/cuda/cuda_backend.hpp"

#include "backend/kimi_checks.hpp"
#include "core/error.hpp"
#include "backend/cuda/kimi_kernels.hpp"

namespace ep::backend::cuda {

using backend::Device;
using backend::Tensor;

void CudaBackend::short_conv_silu(const Tensor &x, const Tensor &w, const Tensor &state, const Tensor &y) {
  const backend::ShortConvDims d = backend::check_short_conv_silu(x, w, state, y, Device::cuda);
  launch_short_conv_silu(x.as<float>(), w.as<float>(), d.channels, d.n_tokens, d.kernel, state.as<float>(), y.as<float>(),
                         stream());
}

void CudaBackend::l2_normalize(const Tensor &x, float eps, float s, const Tensor &y) {
  backend::check_kimi_elementwise(x, y, "l2_normalize", Device::cuda);
  launch_l2_normalize(x.as<float>(), x.ne[0], x.n_rows(), eps, s, y.as<float>(), stream());
}

void CudaBackend::sigmoid(const Tensor &x, const Tensor &y) {
  backend::check_kimi_elementwise(x, y, "sigmoid", Device::cuda);
  launch_sigmoid(x.as<float>(), x.n_elems(), y.as<float>(), stream());
}

void CudaBackend::kda_gate(const Tensor &x, const Tensor &bias, const Tensor &a, float lower_bound, const Tensor &g) {
  const backend::KdaDims d = backend::check_kda_gate(x, bias, a, g, Device::cuda);
  launch_kda_gate(x.as<float>(), bias.as<float>(), a.as<float>(), lower_bound, d.dk, d.n_heads, d.n_tokens, g.as<float>(),
                  stream());
}

void CudaBackend::kda_recurrence(const Tensor &q, const Tensor &k, const Tensor &v, const Tensor &g, const Tensor &beta,
                                 const Tensor &state, const Tensor &out) {
  const backend::KdaDims d = backend::check_kda_recurrence(q, k, v, g, beta, state, out, Device::cuda);
  launch_kda_recurrence(q.as<float>(), k.as<float>(), v.as<float>(), g.as<float>(), beta.as<float>(), d.dk, d.dv, d.n_heads,
                        d.n_tokens, state.as<float>(), out.as<float>(), stream());
}

void CudaBackend::gated_rms_norm(const Tensor &x, const Tensor &w, const Tensor &gate, float eps, const Tensor &y) {
  backend::check_gated_rms_norm(x, w, gate, y, Device::cuda);
  launch_gated_rms_norm(x.as<float>(), w.as<float>(), gate.as<float>(), x.ne[0], x.n_rows(), eps, y.as<float>(), stream());
}

void CudaBackend::causal_attention(const Tensor &q, const Tensor &keys, const Tensor &values, int64_t n_past, float scale,
                                   const Tensor &out) {
  const backend::CausalAttentionDims d = backend::check_causal_attention(q, keys, values, n_past, out, Device::cuda);
  launch_causal_attention(q.as<float>(), keys.as<float>(), values.as<float>(), d.dqk, d.dv, d.n_heads, d.n_tokens, n_past,
                          scale, out.as<float>(), stream());
}

void CudaBackend::attn_res_mix(const Tensor *banked, const Tensor &cur, const Tensor &w, float eps, const Tensor &out) {
  const backend::AttnResDims d = backend::check_attn_res_mix(banked, cur, w, out, Device::cuda);
  launch_attn_res_mix(banked ? banked->as<float>() : nullptr, d.n_banked, cur.as<float>(), w.as<float>(), d.d, d.n_tokens,
                      eps, out.as<float>(), stream());
}

}  // namespace ep::backend::cuda
