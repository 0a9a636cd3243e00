#include "cuda_util.hpp"

namespace ep::bench {

double hbm_copy_gbps(cudaStream_t stream) {
  const uint64_t bytes = uint64_t{1} << 30;
  DeviceMem a(bytes), b(bytes);
  EP_CUDA_CHECK(cudaMemsetAsync(a.p, 1, bytes, stream));
  EP_CUDA_CHECK(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice, stream));  // warm-up
  Events ev;
  const int iters = 20;
  EP_CUDA_CHECK(cudaEventRecord(ev.start, stream));
  for (int i = 0; i < iters; ++i)
    EP_CUDA_CHECK(cudaMemcpyAsync(i % 2 ? a.p : b.p, i % 2 ? b.p : a.p, bytes, cudaMemcpyDeviceToDevice, stream));
  EP_CUDA_CHECK(cudaEventRecord(ev.stop, stream));
  return 2.0 * static_cast<double>(bytes) * iters / (ev.ms() * 1e6);
}

}  // namespace ep::bench
