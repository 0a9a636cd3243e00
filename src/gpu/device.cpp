#include "gpu/device.hpp"

#include "gpu/check.hpp"
#include "core/error.hpp"

#include <fmt/format.h>

namespace ep::gpu {

Status status_of(cudaError_t error) noexcept {
  switch (error) {
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
      return Status::no_device;
    case cudaErrorMemoryAllocation:
      return Status::out_of_memory;
    default:
      return Status::cuda;
  }
}

void throw_error(cudaError_t error, const char *what) {
  fail(status_of(error), "{}: {} ({}, {})", what, cudaGetErrorString(error), cudaGetErrorName(error),
       static_cast<int>(error));
}

int device_count(std::string *why) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    if (why) {
      *why = fmt::format("no CUDA device: cudaGetDeviceCount returned {} ({}, {})",
                         cudaGetErrorString(error), cudaGetErrorName(error), static_cast<int>(error));
    }
    cudaGetLastError();  // clear the sticky non-fatal error
    return 0;
  }
  if (count == 0 && why) *why = "no CUDA device: the driver reports 0 devices";
  return count;
}

uint64_t free_memory_bytes(int index) {
  size_t free = 0, total = 0;
  EP_CUDA_CHECK(cudaSetDevice(index));
  EP_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

std::string describe_device(int index) {
  cudaDeviceProp prop{};
  EP_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  return fmt::format("device {}: {} (sm_{}{}), {:.1f} GiB, {} SMs, L2 {} MiB", index, prop.name,
                     prop.major, prop.minor, static_cast<double>(prop.totalGlobalMem) / (1ull << 30),
                     prop.multiProcessorCount, prop.l2CacheSize >> 20);
}

bool enable_peer_access(int from, int to) {
  int can = 0;
  EP_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, from, to));
  if (!can) return false;
  int current = 0;
  EP_CUDA_CHECK(cudaGetDevice(&current));
  EP_CUDA_CHECK(cudaSetDevice(from));
  const cudaError_t error = cudaDeviceEnablePeerAccess(to, 0);
  cudaSetDevice(current);
  if (error == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();  // not sticky: enabled by an earlier model
    return true;
  }
  if (error != cudaSuccess) throw_error(error, "cudaDeviceEnablePeerAccess");
  return true;
}

}  // namespace ep::gpu
