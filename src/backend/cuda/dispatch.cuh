// Type dispatch for the CUDA kernels, made from the one type table (format/ggml_type.hpp): calls
// f(std::integral_constant<int, T>{}) for a ggml type id whose row has the kernels asked for, or
// throws Error(Status::unsupported) naming @p what (the try_ forms return false instead). No type
// list lives here: a row's `compute` and `gemv` columns decide which kernels are instantiated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "backend/cuda/quant_unit.cuh"
#include "core/status.hpp"
#include "format/ggml_type.hpp"

namespace ep::backend::cuda::quant {

namespace detail {
template <format::GgmlCompute Need, uint8_t Family>
constexpr bool row_runs(const format::GgmlTypeInfo &row) {
  return static_cast<int>(row.compute) >= static_cast<int>(Need) && (Family == 0 || (row.gemv & Family) != 0);
}
template <format::GgmlCompute Need, uint8_t Family, size_t I, typename F>
bool dispatch_row(uint32_t type, F &f) {
  constexpr format::GgmlTypeInfo row = format::kGgmlTypes[I];
  if constexpr (row_runs<Need, Family>(row)) {
    if (type == static_cast<uint32_t>(row.type)) {
      f(std::integral_constant<int, static_cast<int>(row.type)>{});
      return true;
    }
  }
  return false;
}
template <format::GgmlCompute Need, uint8_t Family, typename F, size_t... I>
bool dispatch_rows(uint32_t type, F &f, std::index_sequence<I...>) {
  return (dispatch_row<Need, Family, I>(type, f) || ...);
}
inline void unsupported(uint32_t type, const char *what, const char *kernels) {
  throw Error(Status::unsupported, std::string(what) + ": ggml type id " + std::to_string(type) + " has no " + kernels);
}
}  // namespace detail

/// Calls f(std::integral_constant<int, T>{}) when the table row of @p type has compute kernels of
/// at least @p Need and, with @p Family (format::GemvFamily bits; 0 = any), that GEMV family;
/// returns false (nothing called) otherwise.
template <format::GgmlCompute Need, uint8_t Family = 0, typename F>
bool try_dispatch(uint32_t type, F &&f) {
  return detail::dispatch_rows<Need, Family>(type, f, std::make_index_sequence<format::kGgmlTypeCount>{});
}

/// The GEMV types (GgmlCompute::gemv: the types the per-lane GEMV families decode).
template <typename F>
bool try_dispatch_type(uint32_t type, F &&f) {
  return try_dispatch<format::GgmlCompute::gemv>(type, f);
}
template <typename F>
void dispatch_type(uint32_t type, const char *what, F &&f) {
  if (!try_dispatch<format::GgmlCompute::gemv>(type, f)) detail::unsupported(type, what, "CUDA GEMV kernel");
}

/// Every type with a CUDA dequantization kernel (GgmlCompute::dequant and gemv); the unit
/// decoders of the dequantization-only types are in dequant_unit.cuh, which the caller includes.
template <typename F>
void dispatch_dequant_type(uint32_t type, const char *what, F &&f) {
  if (!try_dispatch<format::GgmlCompute::dequant>(type, f)) detail::unsupported(type, what, "CUDA dequantization kernel");
}

/// The types of one GEMV family (a format::GemvFamily bit).
template <uint8_t Family, typename F>
void dispatch_gemv_family(uint32_t type, const char *what, F &&f) {
  if (!try_dispatch<format::GgmlCompute::gemv, Family>(type, f)) detail::unsupported(type, what, "kernel of this GEMV family");
}

}  // namespace ep::backend::cuda::quant
