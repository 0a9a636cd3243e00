#include "gpu/stream_order.hpp"

#include "gpu/check.hpp"

namespace ep::gpu {

DeviceScope::DeviceScope(int device) {
  EP_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) EP_CUDA_CHECK(cudaSetDevice(device));
}

DeviceScope::~DeviceScope() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
}

struct StreamOrder::Impl {
  int device = 0;
  cudaEvent_t event = nullptr;
};

StreamOrder::StreamOrder(int device) : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
  DeviceScope scope(device);
  EP_CUDA_CHECK(cudaEventCreateWithFlags(&impl_->event, cudaEventDisableTiming));
}

StreamOrder::~StreamOrder() {
  if (impl_ && impl_->event) {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != impl_->device) cudaSetDevice(impl_->device);
    cudaEventDestroy(impl_->event);
    if (now >= 0 && now != impl_->device) cudaSetDevice(now);
  }
}

void StreamOrder::order(void *waiter, void *signaler) {
  EP_CUDA_CHECK(cudaEventRecord(impl_->event, static_cast<cudaStream_t>(signaler)));
  EP_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(waiter), impl_->event, 0));
}

}  // namespace ep::gpu
