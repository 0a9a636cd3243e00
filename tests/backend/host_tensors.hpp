// Host-memory tensor views and a tolerance check for the CPU backend tests.
#pragma once

#include "backend/tensor.hpp"

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <vector>

namespace ep::test::host {

inline backend::Tensor f32(std::vector<float> &v, std::initializer_list<int64_t> shape) {
  return backend::Tensor::make(v.data(), format::GgmlType::f32, backend::Device::cpu, shape);
}
inline backend::Tensor i32(std::vector<int32_t> &v, std::initializer_list<int64_t> shape) {
  return backend::Tensor::make(v.data(), format::GgmlType::i32, backend::Device::cpu, shape);
}
inline backend::Tensor i8(std::vector<int8_t> &v, std::initializer_list<int64_t> shape) {
  return backend::Tensor::make(v.data(), format::GgmlType::i8, backend::Device::cpu, shape);
}
/// |got − want| <= abs_tol + rel·|want|, and got finite.
inline bool close(double got, double want, double rel, double abs_tol = 1e-6) {
  return std::isfinite(got) && std::fabs(got - want) <= abs_tol + rel * std::fabs(want);
}

}  // namespace ep::test::host
