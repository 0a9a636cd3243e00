// CUDA smoke test: device query, one kernel with a checked result, an event-timed copy.
// Skips (exit 77, from gpu_main.cpp) where there is no GPU.
#include "gpu/check.hpp"
#include "gpu/device.hpp"
#include "support/catch.hpp"

#include <cstdio>
#include <cstring>
#include <vector>

namespace {
__global__ void axpy_kernel(float a, const float *x, float *y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
}  // namespace

TEST_CASE("device query reports at least one device", "[cuda]") {
  std::string why;
  const int n = ep::gpu::device_count(&why);
  REQUIRE(n > 0);
  for (int i = 0; i < n; ++i) std::printf("%s\n", ep::gpu::describe_device(i).c_str());
}

TEST_CASE("a kernel computes axpy exactly", "[cuda]") {
  const int n = 1 << 20;
  std::vector<float> x(n), y(n), out(n, -1.0f);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i % 1000) * 0.5f;
    y[i] = static_cast<float>(i % 7);
  }
  float *dx = nullptr, *dy = nullptr;
  EP_CUDA_CHECK(cudaMalloc(&dx, n * sizeof(float)));
  EP_CUDA_CHECK(cudaMalloc(&dy, n * sizeof(float)));
  EP_CUDA_CHECK(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  EP_CUDA_CHECK(cudaMemcpy(dy, y.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  axpy_kernel<<<(n + 255) / 256, 256>>>(2.0f, dx, dy, n);
  EP_CUDA_CHECK_LAUNCH("axpy_kernel");
  EP_CUDA_CHECK(cudaMemcpy(out.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost));
  EP_CUDA_CHECK(cudaFree(dx));
  EP_CUDA_CHECK(cudaFree(dy));
  int wrong = 0;
  for (int i = 0; i < n; ++i) wrong += out[i] != 2.0f * x[i] + y[i];
  CHECK(wrong == 0);
}

TEST_CASE("an event-timed pinned host-to-device copy", "[cuda]") {
  const size_t bytes = size_t{256} << 20;
  void *host = nullptr, *device = nullptr;
  EP_CUDA_CHECK(cudaHostAlloc(&host, bytes, cudaHostAllocDefault));
  EP_CUDA_CHECK(cudaMalloc(&device, bytes));
  std::memset(host, 0x5a, bytes);
  cudaEvent_t start, stop;
  EP_CUDA_CHECK(cudaEventCreate(&start));
  EP_CUDA_CHECK(cudaEventCreate(&stop));
  EP_CUDA_CHECK(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice));  // warm-up
  EP_CUDA_CHECK(cudaEventRecord(start));
  EP_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice));
  EP_CUDA_CHECK(cudaEventRecord(stop));
  EP_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  EP_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  std::vector<unsigned char> back(4096);
  EP_CUDA_CHECK(cudaMemcpy(back.data(), static_cast<char *>(device) + bytes - 4096, 4096,
                           cudaMemcpyDeviceToHost));
  CHECK(back[0] == 0x5a);
  CHECK(back[4095] == 0x5a);
  CHECK(ms > 0.0f);
  std::printf("pinned H2D copy: %zu MiB in %.3f ms = %.1f GB/s\n", bytes >> 20, ms,
              static_cast<double>(bytes) / (ms * 1e6));
  EP_CUDA_CHECK(cudaEventDestroy(start));
  EP_CUDA_CHECK(cudaEventDestroy(stop));
  EP_CUDA_CHECK(cudaFree(device));
  EP_CUDA_CHECK(cudaFreeHost(host));
}
