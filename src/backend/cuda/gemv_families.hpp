// The decode-GEMV kernel families launch_gemv (gemv.cu) picks from, each in its own file with its
// kernels: generic and pipe (every type), mma (tensor cores, mxfp4 / q2_K / q3_K / iq2_xxs / q8_0), the dp4a
// family's two kernels, dp4a and stream (x quantized to int8 per block), and rows (q8_0 and the
// plain float types, lanes sharing a row). A launcher takes
// arguments launch_gemv has validated, for a type (ggml type id) and shape its covers function
// accepts; it launches on `stream` and throws ep::Error when the launch fails, or Status::unsupported
// for a type the family has no kernel for.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.hpp"

namespace ep::backend::cuda {

/// Per-lane decode of 32-value units, x through the read-only cache; every type (gemv_generic.cu).
void launch_gemv_generic(uint32_t type, const GemvArgs &args, cudaStream_t stream);
/// The generic work split with a cp.async double buffer and table-driven decoders; every type
/// (gemv_pipe.cu).
void launch_gemv_pipe(uint32_t type, const GemvArgs &args, cudaStream_t stream);

/// Whether the tensor-core kernel runs `type` with rows of k values: mxfp4, q2_K, q3_K, iq2_xxs and
/// q8_0 with k a multiple of 256, any alignment (gemv_mma.cu).
bool gemv_mma_covers(uint32_t type, int64_t k);
void launch_gemv_mma(uint32_t type, const GemvArgs &args, cudaStream_t stream);

/// Whether the dp4a kernel runs these arguments: mxfp4, q2_K, q3_K, one token, k a multiple of 256
/// whose quantized x fits shared memory, a single `w` 4-byte aligned (q3_K: 2-byte) (gemv_dp4a.cu).
bool gemv_dp4a_covers(uint32_t type, const GemvArgs &args);
void launch_gemv_dp4a(uint32_t type, const GemvArgs &args, cudaStream_t stream);

/// Whether the stream kernel runs these arguments: what dp4a covers (q3_K also with k a multiple
/// of 512 and 4-byte aligned matrices) and iq2_xxs (one token, k a multiple of 256, 2-byte aligned),
/// where x and one ring per warp fit shared memory (gemv_stream.cu).
bool gemv_stream_covers(uint32_t type, const GemvArgs &args);
void launch_gemv_stream(uint32_t type, const GemvArgs &args, cudaStream_t stream);

/// Whether the row kernel runs these arguments: q8_0 with k a multiple of 256, f32 / f16 / bf16,
/// every matrix 16-byte aligned (a single `w`, or w_ptrs with GemvArgs::w_ptrs_aligned16)
/// (gemv_rows.cu).
bool gemv_rows_covers(uint32_t type, const GemvArgs &args);
void launch_gemv_rows(uint32_t type, const GemvArgs &args, cudaStream_t stream);

}  // namespace ep::backend::cuda
