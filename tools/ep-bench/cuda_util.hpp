// CUDA helpers shared by the ep-bench subcommands that run on a GPU (CUDA builds only): device
// memory and event pairs as RAII, and the HBM copy bandwidth every GPU bound is measured against.
#pragma once

#include "gpu/check.hpp"

#include <cuda_runtime.h>

#include <cstdint>

namespace ep::bench {

/// A cudaMalloc'd buffer, freed on destruction.
struct DeviceMem {
  void *p = nullptr;
  explicit DeviceMem(uint64_t bytes) { EP_CUDA_CHECK(cudaMalloc(&p, bytes)); }
  ~DeviceMem() { cudaFree(p); }
  DeviceMem(const DeviceMem &) = delete;
  DeviceMem &operator=(const DeviceMem &) = delete;
};

/// A start / stop event pair; ms() waits for stop and returns the time between them.
struct Events {
  cudaEvent_t start{}, stop{};
  Events() {
    EP_CUDA_CHECK(cudaEventCreate(&start));
    EP_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~Events() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  Events(const Events &) = delete;
  Events &operator=(const Events &) = delete;
  double ms() const {
    float v = 0;
    EP_CUDA_CHECK(cudaEventSynchronize(stop));
    EP_CUDA_CHECK(cudaEventElapsedTime(&v, start, stop));
    return v;
  }
};

/// The current device's HBM device-to-device copy bandwidth in GB/s, counting the bytes read
/// and the bytes written: 20 cudaMemcpyAsync of 1 GiB on @p stream after one warm-up copy. It
/// allocates 2 GiB of device memory while it runs.
double hbm_copy_gbps(cudaStream_t stream);

}  // namespace ep::bench
