// Pieces every decode-GEMV family (gemv_*.cu) builds on: launch helpers (occupancy, one wave of
// resident blocks, programmatic dependent launch), streaming and bounded 16-byte loads, cp.async,
// the bulk copies of sm_90 that complete on an mbarrier, and the 16-byte granule spans of the
// per-lane kernels. Everything is in an anonymous namespace: each including .cu file has its own
// copy.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "backend/cuda/kernels.hpp"
#include "gpu/check.hpp"

namespace ep::backend::cuda {
namespace {

// Lets Kernel use up to the device's opt-in shared memory per block, once per device. A launcher
// whose shared memory depends on k must not set the attribute to its own size per launch: two
// threads launching one kernel with different k could leave it below what one of them needs.
template <auto Kernel>
void allow_max_dynamic_smem(int device) {
  static std::atomic<uint64_t> done{0};  // bit d: device d (mod 64) set
  const uint64_t bit = uint64_t{1} << (device & 63);
  if ((done.load(std::memory_order_acquire) & bit) != 0) return;
  int optin = 0;
  cudaFuncAttributes attr{};
  EP_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  EP_CUDA_CHECK(cudaFuncGetAttributes(&attr, Kernel));
  EP_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     optin - static_cast<int>(attr.sharedSizeBytes)));
  done.fetch_or(bit, std::memory_order_release);
}

// How many blocks of Kernel (at its block size and `smem` bytes of dynamic shared memory) an SM
// holds, the device's SMs, and whether it has programmatic dependent launch (sm_90+). The
// occupancy query and the shared-memory attribute cost microseconds of host time, about as long
// as a decode GEMV runs: they are done once per kernel, device and shared-memory size (a cache of
// a pure function; the last key asked is kept).
struct Residency {
  int sms, per_sm;
  bool pdl;
};
template <auto Kernel>
Residency residency(int threads, int64_t smem) {
  int device = 0;
  EP_CUDA_CHECK(cudaGetDevice(&device));
  static std::atomic<uint64_t> cached{0};  // sm_90+:1 | valid:1 | device:8 | smem:20 | sms:16 | per_sm:8
  const uint64_t key = (uint64_t{1} << 52) | (static_cast<uint64_t>(device & 0xFF) << 44) | (static_cast<uint64_t>(smem) << 24);
  constexpr uint64_t kKeyMask = ((uint64_t{1} << 53) - 1) & ~uint64_t{0xFFFFFF};
  uint64_t hit = cached.load(std::memory_order_relaxed);
  if ((hit & kKeyMask) != key) {
    int sms = 0, per_sm = 0, major = 0;
    allow_max_dynamic_smem<Kernel>(device);
    EP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    EP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, Kernel, threads, static_cast<size_t>(smem)));
    EP_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    hit = key | (static_cast<uint64_t>(major >= 9) << 53) | (static_cast<uint64_t>(sms & 0xFFFF) << 8) |
          static_cast<uint64_t>(per_sm < 1 ? 1 : per_sm > 255 ? 255 : per_sm);
    cached.store(hit, std::memory_order_relaxed);
  }
  return {static_cast<int>((hit >> 8) & 0xFFFF), static_cast<int>(hit & 0xFF), ((hit >> 53) & 1) != 0};
}

__device__ __forceinline__ uint4 load_stream(const uint4 *p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// The 16 bytes at p, or only those below end (zeros after): a row's staged bytes start at a
// 16-byte boundary at or before the row, so the row's last 16-byte chunk can reach up to 15
// bytes past the last row's end, which is past the end of the weights' allocation.
__device__ __forceinline__ uint4 load16_bounded(const uint4 *p, uintptr_t end) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  if (at + 16 <= end) return load_stream(p);
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  uint8_t *vb = reinterpret_cast<uint8_t *>(&v);
  const uint8_t *pb = reinterpret_cast<const uint8_t *>(p);
  for (uintptr_t j = 0; at + j < end; ++j) vb[j] = pb[j];
  return v;
}

// s + Σ v[i]·x[i] over 32 values, x 16-byte aligned, in index order.
__device__ __forceinline__ float dot32(const float (&v)[32], const float *x, float s) {
  const float4 *xp = reinterpret_cast<const float4 *>(x);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float4 f = __ldg(xp + i);
    s = fmaf(v[4 * i], f.x, s);
    s = fmaf(v[4 * i + 1], f.y, s);
    s = fmaf(v[4 * i + 2], f.z, s);
    s = fmaf(v[4 * i + 3], f.w, s);
  }
  return s;
}

// The 32-bit shared-memory address of a generic pointer into shared memory (PTX's [addr] operands).
__device__ __forceinline__ unsigned smem_addr(const void *p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(smem)), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void cp_async_wait1() { cp_async_wait<1>(); }
// Bulk copies (sm_90's TMA unit, cp.async.bulk) completing on an mbarrier in shared memory: the
// stream kernel's weight chunks on sm_90+ (StreamWarp: one instruction per chunk instead of a
// 16-byte cp.async per lane and granule; measured 3-16 % faster).
__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Arrives on bar expecting `bytes` more from bulk copies, then copies bytes (a multiple of 16;
// 16-byte aligned ends) from global src to shared dst, completing on bar. (An L2 evict-first cache
// hint measured no faster.)
__device__ __forceinline__ void bulk_copy_g2s(void *dst, const void *src, unsigned bytes, uint64_t *bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
#endif
}
// One granule of a RowSpan into shared memory: cp.async, or a bounded load for a granule that
// reaches past the span's end (only the last row's tail: never read past the weights).
__device__ __forceinline__ void copy16_async(uint8_t *dst, const uint4 *src, uintptr_t end) {
  if (reinterpret_cast<uintptr_t>(src) + 16 <= end) {
    cp_async16(dst, src);
  } else {
    *reinterpret_cast<uint4 *>(dst) = load16_bounded(src, end);
  }
}

__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *reinterpret_cast<const uint32_t *>(&h); }
__device__ __forceinline__ __half2 bits_h2(uint32_t u) { return *reinterpret_cast<const __half2 *>(&u); }

// Block shape of the per-lane kernels (gemv_generic.cu, gemv_pipe.cu).
constexpr int kWarps = 4;           // warps per block
constexpr int kRows = 2;            // rows per warp

// The token counts the quantized families (generic, pipe, mma) are instantiated for: 1, 2, 4 and
// 8 (kGemvMaxTokens). A launch of n_tok tokens runs the kernel for the next count at or above it,
// whose lanes skip the tokens past n_tok: eight instantiations per type and family would double
// the CUDA build for the 3, 5, 6 and 7 token launches only.
constexpr int gemv_tokens_rounded(int n_tok) { return n_tok <= 1 ? 1 : n_tok == 2 ? 2 : n_tok <= 4 ? 4 : kGemvMaxTokens; }
static_assert(kGemvMaxTokens == 8, "gemv_tokens_rounded's counts");

// Launches a per-lane kernel over tiles of kWarps·kRows rows per matrix: K1, K2, K4 or K8, the
// kernel instantiated for gemv_tokens_rounded(args.n_tok) tokens.
template <auto K1, auto K2, auto K4, auto K8>
void launch_per_lane(const char *name, const GemvArgs &args, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((args.n + kWarps * kRows - 1) / (kWarps * kRows)), static_cast<unsigned>(args.n_mat));
  switch (gemv_tokens_rounded(args.n_tok)) {
    case 1: K1<<<grid, kWarps * 32, 0, stream>>>(args); break;
    case 2: K2<<<grid, kWarps * 32, 0, stream>>>(args); break;
    case 4: K4<<<grid, kWarps * 32, 0, stream>>>(args); break;
    default: K8<<<grid, kWarps * 32, 0, stream>>>(args); break;
  }
  EP_CUDA_CHECK_LAUNCH(name);
}

// The 16-byte granules that hold `bytes` bytes at src: a row's staged bytes start at the
// 16-byte boundary at or before src, so the data sits at offset `off` of its shared-memory copy.
struct RowSpan {
  const uint4 *start = nullptr;
  uintptr_t end = 0;  // one past the last byte of the span
  int off = 0;
  int n16 = 0;        // granules to copy (0 for a row past the matrix)
};
__device__ __forceinline__ RowSpan row_span(const uint8_t *src, int64_t bytes, bool valid) {
  RowSpan s;
  const uintptr_t at = reinterpret_cast<uintptr_t>(src);
  const uintptr_t start = at & ~uintptr_t(15);
  s.start = reinterpret_cast<const uint4 *>(start);
  s.end = at + static_cast<uintptr_t>(bytes);
  s.off = static_cast<int>(at - start);
  s.n16 = valid ? static_cast<int>((s.end - start + 15) / 16) : 0;
  return s;
}

// Launches Kernel once over one wave of resident blocks shared by the launch's matrices: per
// matrix (blockIdx.y) min(most, SMs · blocks per SM / matrices) blocks, at least one. Rounded
// down: rounding up leaves a few blocks for a second wave whenever the matrices do not divide the
// slots (3 blocks per SM: 50 x 8 = 400 blocks for 396 slots), which measured twice as slow for
// such configurations. With programmatic dependent launch on sm_90+ and a created stream (the
// legacy default stream serializes).
template <auto Kernel, typename... Args>
void launch_one_wave(const char *name, int threads, int64_t smem, int64_t n_mat, int64_t most, cudaStream_t stream,
                     Args... args) {
  const Residency r = residency<Kernel>(threads, smem);
  const int64_t slots = static_cast<int64_t>(r.sms) * r.per_sm;
  const int64_t per_mat = slots / n_mat > 0 ? slots / n_mat : 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(most < per_mat ? most : per_mat), static_cast<unsigned>(n_mat));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = stream != nullptr && r.pdl ? 1 : 0;
  EP_CUDA_CHECK(cudaLaunchKernelEx(&cfg, Kernel, args...));
  EP_CUDA_CHECK_LAUNCH(name);
}

}  // namespace
}  // namespace ep::backend::cuda
