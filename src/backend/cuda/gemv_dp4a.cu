// The dp4a decode-GEMV kernel (mxfp4, q2_K, q3_K; one token; k a multiple of 256): x quantized
// per block into int8 hi + lo parts, the packed weights read into registers through the
// read-only cache and multiplied with dp4a (gemv_dp4a.cuh); persistent blocks, a warp reuses
// each piece of x for 1-4 rows. launch_gemv (gemv.cu) runs it for one token where the stream
// kernel (gemv_stream.cu, the same arithmetic) does not fit or does not take the alignment.
#include "backend/cuda/dispatch.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/gemv_dp4a.cuh"
#include "backend/cuda/gemv_families.hpp"
#include "backend/cuda/kernels.hpp"
#include "backend/cuda/reduce.cuh"
#include "core/status.hpp"
#include "gpu/check.hpp"

#include <cstdint>
#include <string>

namespace ep::backend::cuda {
namespace {

using namespace quant;

// Persistent over row tiles: block (bx, m) takes tiles bx, bx + gridDim.x, .. of matrix m (a tile
// = kDpWarps·RW rows), so x is quantized once per block and the weight loads of the next step
// (next item, or the first item of the next tile) are in flight while the current one computes.
template <typename D, int RW, bool GLU>
__global__ void __launch_bounds__(kDpWarps * 32, 1) gemv_dp4a_kernel(GemvArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  const XQuant xq = x_smem_view<D>(smem, a.k);
  const int ipr = xq.ipr;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, m = blockIdx.y;
  const uint8_t *w = static_cast<const uint8_t *>(a.w_ptrs ? a.w_ptrs[m] : a.w);
  float *y = a.y + static_cast<int64_t>(m) * a.n;
  const int64_t row_bytes = a.k / 256 * D::kBytes256;
  const int64_t tiles = (a.n + kDpWarps * RW - 1) / (kDpWarps * RW);
  const int my_tiles = static_cast<int>((tiles - blockIdx.x + gridDim.x - 1) / gridDim.x);
  const int spt = (ipr + 31) / 32;  // steps (32 items) per row of a tile
  auto first_row = [&](int kt) { return ((blockIdx.x + static_cast<int64_t>(kt) * gridDim.x) * kDpWarps + warp) * RW; };
  auto rows_of = [&](int kt, const uint8_t *(&rp)[RW]) {
    const int64_t r0 = first_row(kt);
#pragma unroll
    for (int rr = 0; rr < RW; ++rr) rp[rr] = r0 + rr < a.n ? w + (r0 + rr) * row_bytes : nullptr;
  };
  auto load_step = [&](auto &dst, int kt, int q) {
    const int ii = lane + 32 * q;
    if (kt < my_tiles && ii < ipr) {
      const uint8_t *rp[RW];
      rows_of(kt, rp);
#pragma unroll
      for (int rr = 0; rr < RW; ++rr)
        if (rp[rr] != nullptr) D::load(rp[rr], ii, dst[rr]);
    }
  };

  uint32_t cur[RW][D::kWords], nxt[RW][D::kWords];
  load_step(cur, 0, 0);  // in flight while x is quantized
  quantize_input_smem<D, GLU>(a, m, smem);
  __syncthreads();

  float acc[RW];
#pragma unroll
  for (int rr = 0; rr < RW; ++rr) acc[rr] = 0.0f;
  for (int kt = 0, q = 0; kt < my_tiles;) {
    const bool tile_end = q + 1 == spt;
    const int kt2 = tile_end ? kt + 1 : kt, q2 = tile_end ? 0 : q + 1;
    load_step(nxt, kt2, q2);
    const uint8_t *rp[RW];
    rows_of(kt, rp);
    const int ii = lane + 32 * q;
    if (ii < ipr) D::template dot<RW>(cur, rp, ii, xq, acc);
    if (tile_end) {
      const int64_t r0 = first_row(kt);
#pragma unroll
      for (int rr = 0; rr < RW; ++rr) {
        const float sum = warp_reduce(acc[rr], SumOp{});
        if (lane == 0 && rp[rr] != nullptr) y[r0 + rr] = sum;
        acc[rr] = 0.0f;
      }
    }
#pragma unroll
    for (int rr = 0; rr < RW; ++rr)
#pragma unroll
      for (int i = 0; i < D::kWords; ++i) cur[rr][i] = nxt[rr][i];
    kt = kt2;
    q = q2;
  }
}

// Rows per warp, the fastest measured: 4 for q2_K (7-word items), 2 for
// q3_K (15 words), 1 for mxfp4 (17 words).
template <int T, bool GLU>
void launch_dp4a_variant(const GemvArgs &args, cudaStream_t stream) {
  using D = typename DpOf<T>::type;
  constexpr int RW = T == kQ2_K ? 4 : T == kQ3_K ? 2 : 1;
  auto *kernel = gemv_dp4a_kernel<D, RW, GLU>;
  const int64_t smem = dp4a_smem_bytes(args.k);
  // one wave of resident blocks over all matrices (at least one block per matrix)
  const Residency r = residency<gemv_dp4a_kernel<D, RW, GLU>>(kDpWarps * 32, smem);
  const int64_t tiles = (args.n + kDpWarps * RW - 1) / (kDpWarps * RW);
  const int64_t slots = static_cast<int64_t>(r.sms) * r.per_sm;
  const int64_t per_mat = (slots + args.n_mat - 1) / args.n_mat;
  const dim3 grid(static_cast<unsigned>(tiles < per_mat ? tiles : per_mat), static_cast<unsigned>(args.n_mat));
  kernel<<<grid, kDpWarps * 32, static_cast<size_t>(smem), stream>>>(args);
  EP_CUDA_CHECK_LAUNCH("gemv_dp4a_kernel");
}
template <int T>
void launch_dp4a(const GemvArgs &args, cudaStream_t stream) {
  if (args.glu.up != nullptr) {
    launch_dp4a_variant<T, true>(args, stream);
  } else {
    launch_dp4a_variant<T, false>(args, stream);
  }
}

}  // namespace

// dp4a loads weight words: matrices must start 4-byte aligned (q3_K: 2-byte); only a single `w`
// can be checked here (w_ptrs entries are pack slots + tensor offsets, aligned by construction).
bool gemv_dp4a_covers(uint32_t type, const GemvArgs &args) {
  const int t = static_cast<int>(type);
  const uintptr_t align = t == kQ3_K ? 1 : 3;
  return format::ggml_gemv_family(type, format::kGemvDp4a) && args.k % 256 == 0 && args.n_tok == 1 &&
         dp4a_smem_bytes(args.k) <= kDp4aMaxSmem &&
         (args.w_ptrs != nullptr || (reinterpret_cast<uintptr_t>(args.w) & align) == 0);
}

void launch_gemv_dp4a(uint32_t type, const GemvArgs &args, cudaStream_t stream) {
  dispatch_gemv_family<format::kGemvDp4a>(type, "launch_gemv_dp4a",
                                          [&](auto tag) { launch_dp4a<decltype(tag)::value>(args, stream); });
}

}  // namespace ep::backend::cuda
