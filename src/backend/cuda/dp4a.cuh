// dp4a, host-callable: c + Σ_i a.byte_i · b.byte_i over the four bytes of two words, each word's
// bytes read as signed or unsigned. On the device the instruction; on the host an exact emulation,
// so that CPU tests (tests/backend/cuda/iq2xxs_dot_test.cpp) check the kernels' lane arithmetic
// with the same function the kernels call.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define EP_DP4A_HD __host__ __device__ __forceinline__
#else
#define EP_DP4A_HD inline
#endif

namespace ep::backend::cuda {

/// dp4a with a's bytes signed if ASigned, b's if BSigned (dp4a.{s32,u32}.{s32,u32}).
template <bool ASigned, bool BSigned>
EP_DP4A_HD int32_t dp4a(uint32_t a, uint32_t b, int32_t c) {
#if defined(__CUDA_ARCH__)
  int32_t d;
  if constexpr (ASigned && BSigned) {
    d = __dp4a(static_cast<int>(a), static_cast<int>(b), c);
  } else if constexpr (ASigned) {
    asm("dp4a.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  } else if constexpr (BSigned) {
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  } else {
    asm("dp4a.u32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  }
  return d;
#else
  auto byte = [](uint32_t w, int i, bool is_signed) {
    const uint32_t v = (w >> (8 * i)) & 0xFFu;
    return is_signed ? static_cast<int32_t>(static_cast<int8_t>(v)) : static_cast<int32_t>(v);
  };
  for (int i = 0; i < 4; ++i) c += byte(a, i, ASigned) * byte(b, i, BSigned);
  return c;
#endif
}

}  // namespace ep::backend::cuda
