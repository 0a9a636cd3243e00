// Block-wide reductions for kernels launched with a multiple of 32 threads (<= 1024).
#pragma once

#include <cstdint>

namespace ep::backend::cuda {

template <typename V, typename Op>
__device__ __forceinline__ V warp_reduce(V v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Reduces v over the block; every thread gets the result. Uses 32 V of shared memory.
template <typename V, typename Op>
__device__ __forceinline__ V block_reduce(V v, Op op, V identity) {
  __shared__ V partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
  v = warp_reduce(v, op);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < n_warps ? partial[lane] : identity;
  return warp_reduce(v, op);
}

struct SumOp {
  template <typename V>
  __device__ V operator()(V a, V b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

/// (value, index) pairs ordered by value descending then index ascending; index INT32_MAX = none.
struct Best {
  float v;
  int32_t i;
};
__device__ __forceinline__ bool better(Best a, Best b) { return a.v > b.v || (a.v == b.v && a.i < b.i); }

__device__ __forceinline__ Best block_best(Best b) {
  __shared__ float pv[32];
  __shared__ int32_t pi[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Best other{__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.i, o)};
    if (other.i != INT32_MAX && (b.i == INT32_MAX || better(other, b))) b = other;
  }
  __syncthreads();
  if (lane == 0) {
    pv[warp] = b.v;
    pi[warp] = b.i;
  }
  __syncthreads();
  b = lane < n_warps ? Best{pv[lane], pi[lane]} : Best{0.0f, INT32_MAX};
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Best other{__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.i, o)};
    if (other.i != INT32_MAX && (b.i == INT32_MAX || better(other, b))) b = other;
  }
  return b;
}

}  // namespace ep::backend::cuda
