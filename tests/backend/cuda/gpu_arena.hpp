// Helpers of the CUDA op tests: device tensors freed together (outputs poisoned with 0xFF bytes,
// NaN for f32), host views, and the relative difference that never lets a non-finite output pass.
#pragma once

#include "support/catch.hpp"

#include "backend/tensor.hpp"
#include "gpu/check.hpp"
#include "backend/cuda/cuda_backend.hpp"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <vector>

namespace ep::test::gpu {

/// Device tensors for one test, freed together.
class Arena {
 public:
  explicit Arena(backend::cuda::CudaBackend &be) : be_(be) {}
  ~Arena() {
    for (void *p : owned_) be_.deallocate(p);
  }
  Arena(const Arena &) = delete;
  Arena &operator=(const Arena &) = delete;

  /// A device tensor filled with 0xFF bytes (NaN for f32).
  backend::Tensor poisoned(format::GgmlType type, std::initializer_list<int64_t> shape) {
    backend::Tensor t = backend::Tensor::make(nullptr, type, backend::Device::cuda, shape);
    t.data = be_.allocate(t.n_bytes());
    owned_.push_back(t.data);
    EP_CUDA_CHECK(cudaMemsetAsync(t.data, 0xFF, t.n_bytes(), be_.stream()));
    return t;
  }
  template <typename T>
  backend::Tensor put(const std::vector<T> &v, format::GgmlType type, std::initializer_list<int64_t> shape) {
    backend::Tensor t = poisoned(type, shape);
    REQUIRE(t.n_bytes() == v.size() * sizeof(T));
    be_.upload(t.data, v.data(), t.n_bytes());
    return t;
  }
  template <typename T>
  std::vector<T> get(const backend::Tensor &t) {
    std::vector<T> v(t.n_bytes() / sizeof(T));
    be_.download(v.data(), t.data, t.n_bytes());
    return v;
  }

 private:
  backend::cuda::CudaBackend &be_;
  std::vector<void *> owned_;
};

template <typename T>
backend::Tensor host(std::vector<T> &v, format::GgmlType type, std::initializer_list<int64_t> shape) {
  backend::Tensor t = backend::Tensor::make(v.data(), type, backend::Device::cpu, shape);
  REQUIRE(t.n_bytes() == v.size() * sizeof(T));
  return t;
}

/// max |got − want| / max |want| over the entries where want is finite; +inf when got is not
/// finite there or differs from a non-finite want.
inline double rel_diff(const std::vector<float> &got, const std::vector<float> &want) {
  REQUIRE(got.size() == want.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(want[i])) {
      if (got[i] != want[i]) return INFINITY;
      continue;
    }
    if (!std::isfinite(got[i])) return INFINITY;
    worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  return scale > 0 ? worst / scale : worst;
}

}  // namespace ep::test::gpu
