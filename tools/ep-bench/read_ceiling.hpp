// The read ceilings of a decode GEMV launch shape for `ep-bench kernels`: kernels that only read
// the same matrices, launched the same way — independently of the previous launch, or after it
// as a GEMV must (its input is the previous kernel's output). CUDA builds only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ep::bench {

/// How a ReadProbe launch relates to the launch before it on the stream.
enum class ReadOrder {
  /// Reads the weights at once, waits for the previous launch only before its one possible write:
  /// what the bytes of a launch shape allow when nothing depends on the previous launch.
  independent,
  /// As a decode GEMV: the first loads of each thread are issued before `griddepcontrol.wait`,
  /// then every block reads the whole input x (k floats, as a GEMV block reads its input), folds
  /// it into the value it combines the rest of its weights with, and the launch writes n outputs
  /// per matrix. No arithmetic on the weights beyond an XOR: what the dependency chain and the
  /// bytes alone allow a GEMV launch of that shape.
  dependent,
};

/// A kernel that reads `batch` matrices of `bytes` each per launch (whole 16-byte granules; the
/// last < 16 bytes of a matrix are not read) and does nothing else (ReadOrder): one wave of
/// blocks, 16-byte streaming loads, programmatic dependent launch on sm_90+ — what a GEMV launch of
/// that shape could move at best. kernels_bench times it with the GEMV's own loop.
class ReadProbe {
 public:
  /// `k` and `n` (the GEMV's input and output length per matrix; k a multiple of 4) are used by
  /// ReadOrder::dependent, whose kernel the environment variable EP_DEP_READ_VARIANT (bits 0-2, a
  /// measurement knob) can give parts of the stream GEMV's structure: 1 a block barrier after x,
  /// 2 half of the first loads after x, 4 arithmetic on x.
  ReadProbe(int batch, uint64_t bytes, ReadOrder order = ReadOrder::independent, int64_t k = 0, int64_t n = 0);
  ~ReadProbe();
  ReadProbe(const ReadProbe &) = delete;
  ReadProbe &operator=(const ReadProbe &) = delete;
  /// Bytes one launch reads per matrix.
  uint64_t bytes_per_matrix() const { return granules_ * 16; }
  /// Reads mats[0 .. batch) (device array of matrix addresses) on `stream`; ReadOrder::dependent
  /// also reads x (k floats, 16-byte aligned) after the previous launch and writes batch·n floats
  /// to its own buffer.
  void launch(const void *const *mats, const float *x, cudaStream_t stream) const;

 private:
  int batch_, blocks_per_matrix_ = 1;
  ReadOrder order_;
  int64_t k_, n_;
  bool dependent_launch_ = false;
  int64_t granules_;
  int variant_ = 0;  // ReadOrder::dependent: EP_DEP_READ_VARIANT (bits: see dependent_read_kernel)
  unsigned *sink_ = nullptr;
  float *y_ = nullptr;
};

}  // namespace ep::bench
