// CudaBackend: the elementwise/copy ops and the DeepSeek-V4 ops (kernels in cuda/deepseek_v4_ops.cu).
// Shapes are checked by the shared backend::check_* functions, as on the CPU.
#include "backend/cuda/cuda_backend.hpp"

#include "core/error.hpp"
#include "gpu/check.hpp"
#include "backend/cuda/deepseek_v4_kernels.hpp"

namespace ep::backend::cuda {

using backend::Device;
using backend::Tensor;

namespace {
constexpr unsigned kWsAttention = 12;  // workspace slot (cuda_backend.cpp lists them)

void check_elementwise(const Tensor &x, const Tensor &y, const char *op) {
  backend::check_f32(x, op, "x", Device::cuda);
  backend::check_f32(y, op, "y", Device::cuda);
  backend::check_same_shape(x, y, op);
}
}  // namespace

void CudaBackend::mul(const Tensor &a, const Tensor &b, const Tensor &y) {
  check_elementwise(a, y, "mul");
  check_elementwise(b, y, "mul");
  launch_mul(a.as<float>(), b.as<float>(), y.n_elems(), y.as<float>(), stream());
}

void CudaBackend::scale(const Tensor &x, float s, const Tensor &y) {
  check_elementwise(x, y, "scale");
  launch_scale(x.as<float>(), s, y.n_elems(), y.as<float>(), stream());
}

void CudaBackend::copy(const Tensor &src, const Tensor &dst) {
  backend::check_copy(src, dst, Device::cuda);
  if (src.n_bytes() == 0 || src.data == dst.data) return;
  EP_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.n_bytes(), cudaMemcpyDeviceToDevice, stream()));
}

void CudaBackend::copy_2d(void *dst, uint64_t dst_pitch, const void *src, uint64_t src_pitch, uint64_t row_bytes,
                          uint64_t rows) {
  backend::check_copy_2d(dst, dst_pitch, src, src_pitch, row_bytes, rows);
  if (rows == 0 || row_bytes == 0) return;
  EP_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows, cudaMemcpyDeviceToDevice, stream()));
}

void CudaBackend::hc_weights(const Tensor &mix, const Tensor &scale, const Tensor &base, float eps, int32_t iters,
                             const Tensor &pre, const Tensor *post, const Tensor *comb) {
  const int64_t hc = backend::check_hc_weights(mix, scale, base, pre, post, comb, Device::cuda);
  launch_hc_weights(mix.as<float>(), scale.as<float>(), base.as<float>(), eps, iters, hc, pre.n_rows(), pre.as<float>(),
                    post ? post->as<float>() : nullptr, comb ? comb->as<float>() : nullptr, stream());
}

void CudaBackend::hc_collapse(const Tensor &x, const Tensor &pre, const Tensor &y) {
  const int64_t hc = backend::check_hc_collapse(x, pre, y, Device::cuda);
  launch_hc_collapse(x.as<float>(), pre.as<float>(), hc, y.ne[0], y.n_rows(), y.as<float>(), stream());
}

void CudaBackend::hc_expand(const Tensor &x, const Tensor &f, const Tensor &post, const Tensor &comb, const Tensor &y) {
  const int64_t hc = backend::check_hc_expand(x, f, post, comb, y, Device::cuda);
  launch_hc_expand(x.as<float>(), f.as<float>(), post.as<float>(), comb.as<float>(), hc, x.ne[0], post.n_rows(),
                   y.as<float>(), stream());
}

void CudaBackend::attention_sinks(const Tensor &q, const Tensor &kv, const Tensor &visible, const Tensor &sinks,
                                  float scale, const Tensor &out) {
  backend::check_attention_sinks(q, kv, visible, sinks, out, Device::cuda);
  const int64_t hd = q.ne[0], n_heads = q.ne[1], n_tok = q.ne[2] * q.ne[3], n_kv = kv.n_rows();
  const uint64_t partial_bytes = attention_sinks_workspace_bytes(hd, n_heads, n_tok, n_kv);
  auto *partial = partial_bytes ? static_cast<float *>(workspace(kWsAttention, partial_bytes)) : nullptr;
  launch_attention_sinks(q.as<float>(), kv.as<float>(), visible.as<int8_t>(), sinks.as<float>(), scale, hd, n_heads, n_tok,
                         n_kv, out.as<float>(), partial, stream());
}

void CudaBackend::pool_windows(const Tensor &kv, const Tensor &gate, const Tensor &out) {
  backend::check_pool_windows(kv, gate, out, Device::cuda);
  launch_pool_windows(kv.as<float>(), gate.as<float>(), kv.ne[0], kv.ne[1], kv.ne[2], out.as<float>(), stream());
}

void CudaBackend::indexer_scores(const Tensor &q, const Tensor &w, const Tensor &keys, const Tensor &visible, float scale,
                                 const Tensor &scores) {
  backend::check_indexer_scores(q, w, keys, visible, scores, Device::cuda);
  launch_indexer_scores(q.as<float>(), w.as<float>(), keys.as<float>(), visible.as<int8_t>(), scale, q.ne[0], q.ne[1],
                        q.ne[2] * q.ne[3], keys.n_rows(), scores.as<float>(), stream());
}

void CudaBackend::set_visible(const Tensor &indices, const Tensor &values, int64_t offset, const Tensor &mask) {
  backend::check_set_visible(indices, values, offset, mask, Device::cuda);
  launch_set_visible(indices.as<int32_t>(), values.as<float>(), indices.ne[0], indices.n_rows(), offset, mask.ne[0],
                     mask.as<int8_t>(), stream());
}

}  // namespace ep::backend::cuda
