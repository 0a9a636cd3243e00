// A plain read kernel with the GEMV's launch pattern (see read_ceiling.hpp).
#include "read_ceiling.hpp"

#include "cuda/check.hpp"

namespace ep::bench {
namespace {

constexpr int kThreads = 256, kUnroll = 4;

// Block (x, m) reads its contiguous share of matrix m with 16-byte streaming loads, kUnroll in
// flight per thread. The dependent launch may start at once (it writes nothing this one reads);
// the one possible write waits for the previous launch as a GEMV's output would.
__global__ void __launch_bounds__(kThreads) read_kernel(const uint4 *const *mats, int64_t n16, unsigned *sink) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  const uint4 *m = mats[blockIdx.y];
  const int64_t per = (n16 + gridDim.x - 1) / gridDim.x;
  const int64_t begin = blockIdx.x * per, end = begin + per < n16 ? begin + per : n16;
  unsigned acc = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads * kUnroll) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = i + static_cast<int64_t>(u) * kThreads;
      v[u] = j < end ? __ldcs(m + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  if (acc == 0x9E3779B9u) sink[blockIdx.x] = acc;  // keeps the loads; practically never taken
}

}  // namespace

ReadProbe::ReadProbe(int batch, uint64_t bytes) : batch_(batch), granules_(static_cast<int64_t>(bytes / 16)) {
  int device = 0, sms = 0, per_sm = 0, major = 0;
  EP_CUDA_CHECK(cudaGetDevice(&device));
  EP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  EP_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  EP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, read_kernel, kThreads, 0));
  const int slots = sms * (per_sm > 0 ? per_sm : 1);
  blocks_per_matrix_ = slots / batch > 0 ? slots / batch : 1;
  dependent_launch_ = major >= 9;
  EP_CUDA_CHECK(cudaMalloc(&sink_, static_cast<size_t>(blocks_per_matrix_) * sizeof(unsigned)));
}

ReadProbe::~ReadProbe() { cudaFree(sink_); }

void ReadProbe::launch(const void *const *mats, cudaStream_t stream) const {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(blocks_per_matrix_), static_cast<unsigned>(batch_));
  cfg.blockDim = dim3(kThreads);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = dependent_launch_ ? 1 : 0;
  EP_CUDA_CHECK(cudaLaunchKernelEx(&cfg, read_kernel, reinterpret_cast<const uint4 *const *>(mats), granules_, sink_));
}

}  // namespace ep::bench
