// The read ceiling of a decode GEMV launch shape for `ep-bench kernels`: a kernel that only reads
// the same matrices, launched the same way. CUDA builds only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ep::bench {

/// A kernel that reads `batch` matrices of `bytes` each per launch (whole 16-byte granules; the
/// last < 16 bytes of a matrix are not read) and does nothing else: one wave of blocks, 16-byte
/// streaming loads, programmatic dependent launch on sm_90+ — what a GEMV launch of that shape
/// could move at best. kernels_bench times it with the GEMV's own loop.
class ReadProbe {
 public:
  ReadProbe(int batch, uint64_t bytes);
  ~ReadProbe();
  ReadProbe(const ReadProbe &) = delete;
  ReadProbe &operator=(const ReadProbe &) = delete;
  /// Bytes one launch reads per matrix.
  uint64_t bytes_per_matrix() const { return granules_ * 16; }
  /// Reads mats[0 .. batch) (device array of matrix addresses) on `stream`.
  void launch(const void *const *mats, cudaStream_t stream) const;

 private:
  int batch_, blocks_per_matrix_ = 1;
  bool dependent_launch_ = false;
  int64_t granules_;
  unsigned *sink_ = nullptr;
};

}  // namespace ep::bench
