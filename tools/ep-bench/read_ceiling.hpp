// The read ceiling of a decode GEMV launch shape for `ep-bench kernels`: a kernel that only reads
// the same matrices, launched the same way. CUDA builds only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ep::bench {

/// GB/s of a kernel that reads `batch` matrices of `bytes` each per launch (whole 16-byte
/// granules; the last < 16 bytes of a matrix are not read) and does nothing else, launched back
/// to back with programmatic dependent launch over `table[0 .. pool)` (pool a multiple of batch),
/// one warm-up pass and `passes` timed passes: what a GEMV launch of this shape could move at best.
double read_ceiling_gbps(const void *const *table, int pool, int batch, uint64_t bytes, int passes, cudaStream_t stream);

}  // namespace ep::bench
