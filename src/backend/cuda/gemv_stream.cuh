// The decode-GEMV pieces of the dp4a and stream kernels (gemv_quant.cu), apart from the
// kernels themselves: launch helpers (occupancy, one wave of resident blocks, programmatic
// dependent launch), cp.async, the x quantization (with an optional gated activation on the
// input, GemvGlu) and item decoders of the dp4a family, and StreamWarp, one warp's share of a
// matrix streamed through shared memory — so that a kernel built from them (e.g. the fused decode
// FFN of docs/experiments/moe-decode-fused.patch) can live in its own file. Everything is in an
// anonymous namespace: each including .cu file has its own copy.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>

#include "backend/cuda/activation.cuh"
#include "gpu/check.hpp"
#include "backend/cuda/dp4a.cuh"
#include "backend/cuda/grid_dependency.cuh"
#include "backend/cuda/iq2xxs_dot.cuh"
#include "backend/cuda/kernels.hpp"
#include "backend/cuda/mxfp4_pairs.cuh"
#include "backend/cuda/quant_unit.cuh"

namespace ep::backend::cuda {
namespace {

using namespace quant;

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
// 16-byte cp.async per lane and granule; 3-16 % faster decode GEMV, docs/benchmarks.md session 10).
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
// 16-byte aligned ends) from global src to shared dst, completing on bar. (With an L2 evict-first
// cache hint: 1.00-1.02x in session 11's A/B, not kept.)
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

// ---- the dp4a decode kernel (mxfp4, q2_K, q3_K; one token; k a multiple of 256) ----------
// Each block first quantizes its matrix's x into shared memory, per group of D::kScaleGroup values
// (32 for mxfp4 and iq2_xxs, 128 for q2_K and q3_K), as two int8 parts: hi = rint(x/s),
// lo = rint((x − hi·s)·254/s) with s = max|x|/127, so that x ≈ s/254·(254·hi + lo) (~15 bits, any
// f32 range); q2_K/q3_K also get the exact f32 sum of every 16 values (for the min / −4 offsets),
// and the q2_K stream kernel per item the integer sums of its four 16-value pieces (XQuant::xi). x is stored permuted so that the 16-byte pieces
// the lanes of a warp read at one time are consecutive (no bank conflicts). Weights stay packed:
// 2-bit fields are masked in place (value·4^j) and fed to dp4a against hi and lo; mxfp4 nibbles
// go through a byte-permute table to int8. Block scales are applied per 16 (q2_K, q3_K) or 32
// (mxfp4) values in f32. A warp owns RW consecutive rows; lane l takes work items l, l + 32, ..
// (64 or 128 values) of every one of them, so each piece of x read from shared memory serves
// RW rows; the next item's weights load while the current one is computed.
constexpr int kDpWarps = 8;

struct XQuant {
  const int8_t *hi, *lo;  // permuted: 16-byte piece p of item ii at (p·ipr + ii)·16
  const float2 *xs;       // q2_K/q3_K: (s/254, Σx of the 16 values) at p·ipr + ii; mxfp4: (s/254, -) at c·ipr + ii
  int ipr;                // items per row
  // q2_K's stream kernel (D::kItemSums): per item, the integer sums S_p = Σ(254·hi + lo) of its four 16-value
  // pieces p as bytes — x: byte p = S_p & 0xFF, y: (S_p >> 8) & 0xFF, z: S_p >> 16 (signed) — and
  // w: the bits of the item's s/254 (one x scale per 128 values, DpKq::kScaleGroup)
  const uint4 *xi = nullptr;
  const uint8_t *tab = nullptr;  // the decoder's lookup tables in shared memory (D::kTableBytes; iq2_xxs)
};

__device__ __forceinline__ uint32_t ldg32(const uint8_t *p) { return __ldg(reinterpret_cast<const unsigned int *>(p)); }
// Where D::load reads an item's words: global memory through the read-only cache (dp4a) or a
// shared-memory copy of the rows (stream). Word reads are 4-byte aligned, half reads 2-byte.
struct GlobalWords {
  __device__ static uint32_t w(const uint8_t *p) { return ldg32(p); }
  __device__ static uint32_t h(const uint8_t *p) { return __ldg(reinterpret_cast<const unsigned short *>(p)); }
};
struct SharedWords {
  __device__ static uint32_t w(const uint8_t *p) { return *reinterpret_cast<const uint32_t *>(p); }
  __device__ static uint32_t h(const uint8_t *p) { return *reinterpret_cast<const unsigned short *>(p); }
};
// The dot products of 16 weight bytes (words w[0..3], masked) with x's hi and lo int8 parts.
template <size_t N>
__device__ __forceinline__ int2 dp4a_hi_lo(const uint32_t (&w)[N], uint32_t mask, const uint4 &xh, const uint4 &xl) {
  const uint32_t w0 = w[0] & mask, w1 = w[1] & mask, w2 = w[2] & mask, w3 = w[3] & mask;
  int sh = dp4a<false, true>(w0, xh.x, 0), sl = dp4a<false, true>(w0, xl.x, 0);
  sh = dp4a<false, true>(w1, xh.y, sh);
  sl = dp4a<false, true>(w1, xl.y, sl);
  sh = dp4a<false, true>(w2, xh.z, sh);
  sl = dp4a<false, true>(w2, xl.z, sl);
  sh = dp4a<false, true>(w3, xh.w, sh);
  sl = dp4a<false, true>(w3, xl.w, sl);
  return make_int2(sh, sl);
}
// Small non-negative integer n (< 2^23) times 2^-e as f32 without a conversion instruction.
__device__ __forceinline__ float small_int_scaled(uint32_t n, int e = 0) {
  const uint32_t bits = (150u - static_cast<uint32_t>(e)) << 23;
  return __uint_as_float(bits | n) - __uint_as_float(bits);
}

// Four values of x as int8 hi and lo parts (scale s = max/127 of their scale group, inv =
// 127/max, inv254 = 254·inv), packed into a word each in value order.
// rint through the f32 mantissa: fma(v, inv, 1.5·2^23) holds rint(v·inv) in its low bits (two's
// complement, |v·inv| <= 127·(1 + a few ulp)), so the low byte is the int8 and no clamp or
// conversion instruction is needed; |lo| <= 127 likewise since |x - hi·s| <= s/2.
__device__ __forceinline__ void quantize4(const float4 &v, float s, float inv, float inv254, uint32_t &ph, uint32_t &pl) {
  constexpr float kMagic = 12582912.0f;
  const float vals[4] = {v.x, v.y, v.z, v.w};
  uint32_t hb[4], lb[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float hm = fmaf(vals[e], inv, kMagic);
    const float r = fmaf(-(hm - kMagic), s, vals[e]);
    hb[e] = __float_as_uint(hm);
    lb[e] = __float_as_uint(fmaf(r, inv254, kMagic));
  }
  ph = __byte_perm(__byte_perm(hb[0], hb[1], 0x0040u), __byte_perm(hb[2], hb[3], 0x0040u), 0x5410u);
  pl = __byte_perm(__byte_perm(lb[0], lb[1], 0x0040u), __byte_perm(lb[2], lb[3], 0x0040u), 0x5410u);
}

// Quantizes x[0, k) (load(i): values 4i .. 4i + 3) into the permuted XQuant layout of D (D::piece:
// value index (a multiple of 4) → byte offset of its 4 values; D::scale_slot: value index → xs
// slot), a thread per 16 values: a scale group's max takes one shuffle per doubling past 16 values
// (32: one, 128: three), the sum of 16 values none, and hi / lo go out as one 16-byte store each. Against a thread per 4 values (the same
// bytes) on the stream kernel: 0.97-1.06x, at least 1.00 in 21 of 24 cells (docs/benchmarks.md,
// session 11).
template <typename D, typename Load>
__device__ __forceinline__ void quantize_x(const Load &load, int64_t k, int ipr, int8_t *hi, int8_t *lo,
                                             float2 *xs, uint8_t *xi) {
  const int n16 = static_cast<int>(k / 16);  // a multiple of 16: half warps are in or out together
  for (int base = 0; base < n16; base += static_cast<int>(blockDim.x)) {
    const int p = base + static_cast<int>(threadIdx.x);  // this thread's values 16p .. 16p + 15
    const bool active = p < n16;
    float4 v[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) v[q] = active ? load(4 * p + q) : make_float4(0.f, 0.f, 0.f, 0.f);
    float m = 0.0f;
#pragma unroll
    for (int q = 0; q < 4; ++q)
      m = fmaxf(m, fmaxf(fmaxf(fabsf(v[q].x), fabsf(v[q].y)), fmaxf(fabsf(v[q].z), fabsf(v[q].w))));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));  // a 32-value group: threads p and p ^ 1
    if constexpr (D::kScaleGroup >= 64) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    if constexpr (D::kScaleGroup >= 128) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));  // 128: p .. p ^ 7
    static_assert(D::kScaleGroup == 32 || D::kScaleGroup == 64 || D::kScaleGroup == 128, "x scale groups of 32-128 values");
    const float s = m * (1.0f / 127.0f);
    const float inv = m > 0.0f ? __frcp_rn(m) * 127.0f : 0.0f, inv254 = inv * 254.0f;
    uint32_t ph[4], pl[4];
    float t[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      quantize4(v[q], s, inv, inv254, ph[q], pl[q]);
      t[q] = (v[q].x + v[q].y) + (v[q].z + v[q].w);
    }
    const float sum16 = (t[0] + t[1]) + (t[2] + t[3]);  // pairs, then pairs of pairs
    const bool upper = (p & 1) != 0;
    if constexpr (D::kPairHalves) {
      // the lower thread (values 0..15 of the group, words A0..A3) writes the group's first 16
      // bytes, A_q and B_q interleaved for q = 0, 1; the upper one (16..31, B0..B3) the last 16,
      // q = 2, 3: each sends the other the two words it lacks
      const uint32_t sh0 = __shfl_xor_sync(0xffffffffu, upper ? ph[0] : ph[2], 1);
      const uint32_t sh1 = __shfl_xor_sync(0xffffffffu, upper ? ph[1] : ph[3], 1);
      const uint32_t sl0 = __shfl_xor_sync(0xffffffffu, upper ? pl[0] : pl[2], 1);
      const uint32_t sl1 = __shfl_xor_sync(0xffffffffu, upper ? pl[1] : pl[3], 1);
      if (active) {
        const uint32_t ah0 = upper ? sh0 : ph[0], bh0 = upper ? ph[2] : sh0;
        const uint32_t ah1 = upper ? sh1 : ph[1], bh1 = upper ? ph[3] : sh1;
        const uint32_t al0 = upper ? sl0 : pl[0], bl0 = upper ? pl[2] : sl0;
        const uint32_t al1 = upper ? sl1 : pl[1], bl1 = upper ? pl[3] : sl1;
        // value 8 of a group sits at byte 16, the start of its second piece (DpMxfp4::piece)
        const int dst = D::piece(upper ? 16 * p - 8 : 16 * p, ipr);
        *reinterpret_cast<uint4 *>(hi + dst) = make_uint4(mxfp4::lower_word(ah0, bh0), mxfp4::upper_word(bh0, ah0),
                                                          mxfp4::lower_word(ah1, bh1), mxfp4::upper_word(bh1, ah1));
        *reinterpret_cast<uint4 *>(lo + dst) = make_uint4(mxfp4::lower_word(al0, bl0), mxfp4::upper_word(bl0, al0),
                                                          mxfp4::lower_word(al1, bl1), mxfp4::upper_word(bl1, al1));
      }
    } else if (active) {
      const int dst = D::piece(16 * p, ipr);
      *reinterpret_cast<uint4 *>(hi + dst) = make_uint4(ph[0], ph[1], ph[2], ph[3]);
      *reinterpret_cast<uint4 *>(lo + dst) = make_uint4(pl[0], pl[1], pl[2], pl[3]);
    }
    if (active && (D::kSums || !upper)) xs[D::scale_slot(16 * p, ipr)] = make_float2(s * (1.0f / 254.0f), sum16);
    if constexpr (D::kItemSums) {
      // the piece's integer sum Σ(254·hi + lo) (|S| <= 16·32385 < 2^20), as three bytes of its
      // item's record (XQuant::xi)
      int shi = 0, slo = 0;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        shi = dp4a<true, false>(ph[q], 0x01010101u, shi);
        slo = dp4a<true, false>(pl[q], 0x01010101u, slo);
      }
      const int sum = shi * 254 + slo;
      if (active) {
        // (slot % ipr and slot / ipr of scale_slot instead: 0.98-0.99x at 8 experts, session 14)
        const int item = D::item_of(16 * p), piece = D::field_of(16 * p);  // slot = piece·ipr + item
        uint8_t *rec = xi + 16 * item;
        rec[piece] = static_cast<uint8_t>(sum);
        rec[4 + piece] = static_cast<uint8_t>(sum >> 8);
        rec[8 + piece] = static_cast<uint8_t>(sum >> 16);
        if (piece == 0) *reinterpret_cast<float *>(rec + 12) = s * (1.0f / 254.0f);
      }
    }
  }
}

// The quantized x at the start of a dp4a / stream block's dynamic shared memory: hi bytes [k],
// lo bytes [k], the float2 scales [k / 16], then the item records [k / 64] (D::kItemSums: XQuant::xi;
// the space is reserved for every decoder).
template <typename D>
__device__ __forceinline__ XQuant x_smem_view(uint8_t *smem, int64_t k) {
  const int8_t *hi = reinterpret_cast<const int8_t *>(smem);
  XQuant xq{hi, hi + k, reinterpret_cast<const float2 *>(smem + 2 * k), static_cast<int>(k / D::kValues)};
  if constexpr (D::kItemSums) xq.xi = reinterpret_cast<const uint4 *>(smem + 2 * k + k / 16 * 8);
  return xq;
}
// x's values 4i .. 4i + 3 (quantize_x's loader): a row of f32 in global memory.
struct LoadRow {
  const float *x;
  __device__ float4 operator()(int i) const { return __ldg(reinterpret_cast<const float4 *>(x) + i); }
};
template <typename D, typename Load>
__device__ __forceinline__ void quantize_x_smem(const Load &load, int64_t k, uint8_t *smem) {
  int8_t *hi = reinterpret_cast<int8_t *>(smem);
  quantize_x<D>(load, k, static_cast<int>(k / D::kValues), hi, hi + k, reinterpret_cast<float2 *>(smem + 2 * k),
                smem + 2 * k + k / 16 * 8);
}
template <typename D>
__device__ __forceinline__ void quantize_x_smem(const float *__restrict__ x, int64_t k, uint8_t *smem) {
  quantize_x_smem<D>(LoadRow{x}, k, smem);
}
// act(gate, up) of two f32 rows, values 4i .. 4i + 3 (GemvGlu): glu_activation, the f32 function
// of launch_glu, on the same inputs, so the values are those launch_glu would have written.
struct LoadGlu {
  const float *gate, *up;
  GemvGlu act;
  __device__ float4 operator()(int i) const {
    const float4 g = __ldg(reinterpret_cast<const float4 *>(gate) + i), u = __ldg(reinterpret_cast<const float4 *>(up) + i);
    return make_float4(glu_activation(g.x, u.x, act.kind, act.limit, act.beta_g, act.beta_u),
                       glu_activation(g.y, u.y, act.kind, act.limit, act.beta_g, act.beta_u),
                       glu_activation(g.z, u.z, act.kind, act.limit, act.beta_g, act.beta_u),
                       glu_activation(g.w, u.w, act.kind, act.limit, act.beta_g, act.beta_u));
  }
};
// The GEMV input of matrix m into the block's quantized x: row x_rows[m] (or m) of x, or with
// GLU of act(x, glu.up) (GemvArgs::glu; a template parameter: behind a run-time branch in every
// kernel, the activation's code cost the kernels that do not apply it 4-9 % of mxfp4 and q3_K
// decode speed, docs/benchmarks.md session 9; why was not measured). After
// griddepcontrol.wait (x is often the previous kernel's output); the caller synchronizes the
// block before reading it.
template <typename D, bool GLU>
__device__ __forceinline__ void quantize_input_smem(const GemvArgs &a, int m, uint8_t *smem) {
  const int64_t row = static_cast<int64_t>(a.x_rows ? a.x_rows[m] : m) * a.k;
  if constexpr (GLU) {
    quantize_x_smem<D>(LoadGlu{a.x + row, a.glu.up + row, a.glu}, a.k, smem);
  } else {
    quantize_x_smem<D>(a.x + row, a.k, smem);
  }
}

// q2_K item ii of a row: block ii/4, half h = (ii/2)%2, 16-byte group g = ii%2 of that half's
// 32 quant bytes, all four 2-bit fields j (values 128h + 32j + 16g + 0..15, scale 8h + 2j + g).
// x piece j of item ii = those 16 values of field j.
struct DpKq {
  static constexpr int kValues = 64;
  static constexpr bool kSums = true;
  static constexpr bool kItemSums = false;  // XQuant::xi: only SQ2K reads it
  // one x scale per 128 values (half a block: an item's four pieces share it, so the stream
  // kernels add their pieces' integer dots before one conversion)
  static constexpr int kScaleGroup = 128;
  static constexpr bool kPairHalves = false;  // x in value order within a piece (see DpMxfp4)
  static constexpr int kTableBytes = 0;  // no lookup tables (see DpIq2xxs)
  __device__ static void init_tables(uint8_t *) {}
  // value v's item (4 per 256-value block: half h, 16-byte group g) and field j (its x piece): v
  // sits at byte v % 16 of piece j·ipr + item, which is also its scale slot (no division)
  __device__ static int item_of(int v) { return 4 * (v >> 8) + 2 * ((v >> 7) & 1) + ((v >> 4) & 1); }
  __device__ static int field_of(int v) { return (v >> 5) & 3; }
  __device__ static int piece(int v, int ipr) { return (field_of(v) * ipr + item_of(v)) * 16 + (v & 15); }
  __device__ static int scale_slot(int v, int ipr) { return piece(v, ipr) >> 4; }
  struct XPiece {
    uint4 hi, lo;
    float2 s;
  };
  // x piece j of item ii: hi, lo and (s/254, Σx)
  __device__ static XPiece x_piece(const XQuant &xq, int j, int ii) {
    const int slot = j * xq.ipr + ii;
    return {*reinterpret_cast<const uint4 *>(xq.hi + 16 * slot), *reinterpret_cast<const uint4 *>(xq.lo + 16 * slot),
            xq.xs[slot]};
  }
};
struct DpQ2K : DpKq {
  static constexpr int kWords = 7, kBytes256 = 84;
  template <typename L = GlobalWords>
  __device__ static void load(const uint8_t *row, int ii, uint32_t (&r)[kWords]) {
    const uint8_t *b = row + (ii >> 2) * 84;
    const int h = (ii >> 1) & 1, g = ii & 1;
    const uint8_t *q = b + 16 + 32 * h + 16 * g;
#pragma unroll
    for (int i = 0; i < 4; ++i) r[i] = L::w(q + 4 * i);
    r[4] = L::w(b + 8 * h);
    r[5] = L::w(b + 8 * h + 4);
    r[6] = L::w(b + 80);
  }
  template <int RW>
  __device__ static void dot(const uint32_t (&r)[RW][kWords], const uint8_t *const *, int ii, const XQuant &xq,
                             float (&acc)[RW]) {
    const int g = ii & 1;
    float A[RW], B[RW];
#pragma unroll
    for (int rr = 0; rr < RW; ++rr) A[rr] = B[rr] = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const XPiece xp = x_piece(xq, j, ii);
      const uint4 xh = xp.hi, xl = xp.lo;
      const float2 xs = xp.s;
      const uint32_t mask = 0x03030303u << (2 * j);
#pragma unroll
      for (int rr = 0; rr < RW; ++rr) {
        const int2 d = dp4a_hi_lo(r[rr], mask, xh, xl);
        const int sh = d.x, sl = d.y;
        const uint32_t sc = (r[rr][4 + (j >> 1)] >> (16 * (j & 1) + 8 * g)) & 0xFFu;
        const float dl = small_int_scaled(sc & 0xFu, 2 * j);  // (sc & 15)·4^-j: undoes the in-place mask
        A[rr] = fmaf(dl * xs.x, static_cast<float>(sh * 254 + sl), A[rr]);
        B[rr] = fmaf(small_int_scaled(sc >> 4), xs.y, B[rr]);
      }
    }
#pragma unroll
    for (int rr = 0; rr < RW; ++rr) {
      const float2 dd = __half22float2(bits_h2(r[rr][6]));
      acc[rr] += fmaf(dd.x, A[rr], -dd.y * B[rr]);
    }
  }
};

// q3_K item: as q2_K (hmask bytes 16g..16g+15, bit 4h + j). Blocks are 110 bytes, so every
// field of an odd block sits 2 bytes off a word boundary: aligned words + a funnel shift.
struct DpQ3K : DpKq {
  static constexpr int kWords = 15, kBytes256 = 110;
  template <typename L = GlobalWords>
  __device__ static void load(const uint8_t *row, int ii, uint32_t (&r)[kWords]) {
    const uint8_t *b = row + (ii >> 2) * 110;
    const int off = static_cast<int>(reinterpret_cast<uintptr_t>(b) & 3);  // 0 or 2
    const uint8_t *a = b - off;
    const int h = (ii >> 1) & 1, g = ii & 1;
    const uint8_t *hm = a + 16 * g, *q = a + 32 + 32 * h + 16 * g, *sc = a + 96;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      r[i] = L::w(hm + 4 * i);
      r[5 + i] = L::w(q + 4 * i);
    }
    r[10] = L::w(sc);
    r[11] = L::w(sc + 4);
    r[12] = L::w(sc + 8);
    // the fifth word only when misaligned: an aligned block's words end at its last byte
    r[4] = off ? L::w(hm + 16) : 0u;
    r[9] = off ? L::w(q + 16) : 0u;
    r[13] = off ? L::w(sc + 12) : 0u;
    r[14] = L::h(b + 108);
  }
  template <int RW>
  __device__ static void dot(const uint32_t (&r)[RW][kWords], const uint8_t *const *rows, int ii, const XQuant &xq,
                             float (&acc)[RW]) {
    const int h = (ii >> 1) & 1, g = ii & 1;
    const float hb_scale0 = h ? 0.25f : 4.0f;  // 4·2^-(4h): the high bit sits at bit 4h + j
    uint32_t hm[RW][4], q[RW][4], S0[RW], S1[RW], S2[RW];
#pragma unroll
    for (int rr = 0; rr < RW; ++rr) {
      const uint32_t fs = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(rows[rr] + (ii >> 2) * 110) & 3) * 8;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        hm[rr][i] = __funnelshift_r(r[rr][i], r[rr][i + 1], fs);
        q[rr][i] = __funnelshift_r(r[rr][5 + i], r[rr][6 + i], fs);
      }
      const uint32_t sh_sc = 8 * g + 4 * h;
      S0[rr] = __funnelshift_r(r[rr][10], r[rr][11], fs) >> sh_sc;
      S1[rr] = __funnelshift_r(r[rr][11], r[rr][12], fs) >> sh_sc;
      S2[rr] = __funnelshift_r(r[rr][12], r[rr][13], fs) >> sh_sc;
    }
    float sum[RW];
#pragma unroll
    for (int rr = 0; rr < RW; ++rr) sum[rr] = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const XPiece xp = x_piece(xq, j, ii);
      const uint4 xh = xp.hi, xl = xp.lo;
      const float2 xs = xp.s;
      const uint32_t xhw[4] = {xh.x, xh.y, xh.z, xh.w}, xlw[4] = {xl.x, xl.y, xl.z, xl.w};
      const uint32_t qm = 0x03030303u << (2 * j), hmk = 0x01010101u << (4 * h + j);
      const float hscale = hb_scale0 * (1.0f / static_cast<float>(1 << j)), qscale = 1.0f / static_cast<float>(1 << (2 * j));
#pragma unroll
      for (int rr = 0; rr < RW; ++rr) {
        int qh = 0, ql = 0, bh = 0, bl = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint32_t wq = q[rr][i] & qm, wh = hm[rr][i] & hmk;
          qh = dp4a<false, true>(wq, xhw[i], qh);
          ql = dp4a<false, true>(wq, xlw[i], ql);
          bh = dp4a<false, true>(wh, xhw[i], bh);
          bl = dp4a<false, true>(wh, xlw[i], bl);
        }
        const uint32_t low4 = ((j < 2 ? S0[rr] : S1[rr]) >> (16 * (j & 1))) & 0xFu;
        const uint32_t high2 = (S2[rr] >> (16 * (j & 1) + 2 * (j >> 1))) & 3u;
        const float sc = small_int_scaled(low4 | (high2 << 4)) - 32.0f;
        // Σx·(ql + 4·hb − 4) in x units: ql·4^j and hb·2^(4h+j) come out of the in-place masks
        const float inner = fmaf(static_cast<float>(bh * 254 + bl), hscale, static_cast<float>(qh * 254 + ql) * qscale);
        sum[rr] = fmaf(sc, fmaf(xs.x, inner, -4.0f * xs.y), sum[rr]);
      }
    }
#pragma unroll
    for (int rr = 0; rr < RW; ++rr)
      acc[rr] = fmaf(__half2float(__ushort_as_half(static_cast<unsigned short>(r[rr][14]))), sum[rr], acc[rr]);
  }
};

// mxfp4 item: 4 blocks of 32 values (68 bytes, word-aligned since rows are multiples of 136).
// x pieces 2c, 2c + 1 of item ii = the 32 values of its block c in the order the table lookup
// yields the weights (cuda/mxfp4_pairs.cuh: byte p of the 32 is value p/2 + 16·(p % 2)), so that
// each looked-up word goes to dp4a as it comes out.
struct DpMxfp4 {
  static constexpr int kWords = 17, kValues = 128, kBytes256 = 136;
  static constexpr bool kSums = false;
  static constexpr bool kItemSums = false;
  static constexpr int kScaleGroup = 32;  // the block's: one e8m0 scale per 32 values
  static constexpr bool kPairHalves = true;
  static constexpr int kTableBytes = 0;
  __device__ static void init_tables(uint8_t *) {}
  // byte offset of the x word that holds values v .. v + 3 (v a multiple of 4) interleaved with
  // v + 16 .. v + 19: position 2s (s = v % 16) of the block's 32 for the lower half, 2s + 4 for
  // the upper (see above)
  __device__ static int piece(int v, int ipr) {
    const int item = v >> 7, c = (v >> 5) & 3, pos = 2 * (v & 15) + 4 * ((v >> 4) & 1);
    return ((2 * c + (pos >> 4)) * ipr + item) * 16 + (pos & 15);
  }
  __device__ static int scale_slot(int v, int ipr) { return ((v >> 5) & 3) * ipr + (v >> 7); }
  // x of 32-value chunk c of item ii: hi and lo bytes in the piece order (DpMxfp4: interleaved
  // halves; DpIq2xxs: words 0..3 the first 16 values, 4..7 the second 16) and s/254
  struct XChunk {
    uint32_t hi[8], lo[8];
    float s;
  };
  __device__ static XChunk x_chunk(const XQuant &xq, int c, int ii) {
    const uint4 xa = *reinterpret_cast<const uint4 *>(xq.hi + 16 * ((2 * c) * xq.ipr + ii));
    const uint4 xb = *reinterpret_cast<const uint4 *>(xq.hi + 16 * ((2 * c + 1) * xq.ipr + ii));
    const uint4 la = *reinterpret_cast<const uint4 *>(xq.lo + 16 * ((2 * c) * xq.ipr + ii));
    const uint4 lb = *reinterpret_cast<const uint4 *>(xq.lo + 16 * ((2 * c + 1) * xq.ipr + ii));
    return {{xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w}, {la.x, la.y, la.z, la.w, lb.x, lb.y, lb.z, lb.w},
            xq.xs[c * xq.ipr + ii].x};
  }
  template <typename L = GlobalWords>
  __device__ static void load(const uint8_t *row, int ii, uint32_t (&r)[kWords]) {
    const uint8_t *p = row + ii * 68;
#pragma unroll
    for (int i = 0; i < kWords; ++i) r[i] = L::w(p + 4 * i);
  }
  template <int RW>
  __device__ static void dot(const uint32_t (&r)[RW][kWords], const uint8_t *const *, int ii, const XQuant &xq,
                             float (&acc)[RW]) {
    dot_tables<RW>(r, ii, xq, acc, mxfp4::PairTables{}, [](uint8_t e) { return e8m0_half(e); });
  }
  // dot with the lookup's register table words given, and the block scale e8m0_half(e) of a scale
  // byte e by `scale` (SMxfp4: from a table)
  template <int RW, typename Scale>
  __device__ static void dot_tables(const uint32_t (&r)[RW][kWords], int ii, const XQuant &xq, float (&acc)[RW],
                                    const mxfp4::PairTables &tab, const Scale &scale) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int off = 17 * c, start = off + 1, wi = start / 4, fs = 8 * (start % 4);
      const XChunk x = x_chunk(xq, c, ii);
#pragma unroll
      for (int rr = 0; rr < RW; ++rr) {
        const uint32_t e = (r[rr][off / 4] >> (8 * (off % 4))) & 0xFFu;
        int sh = 0, sl = 0;
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const uint32_t q = fs ? __funnelshift_r(r[rr][wi + t], r[rr][wi + t + 1], fs) : r[rr][wi + t];
          const mxfp4::Pairs v = mxfp4::pairs(q, tab);
          sh = dp4a<true, true>(v.x, x.hi[2 * t], sh);
          sl = dp4a<true, true>(v.x, x.lo[2 * t], sl);
          sh = dp4a<true, true>(v.y, x.hi[2 * t + 1], sh);
          sl = dp4a<true, true>(v.y, x.lo[2 * t + 1], sl);
        }
        acc[rr] = fmaf(scale(static_cast<uint8_t>(e)) * x.s, static_cast<float>(sh * 254 + sl), acc[rr]);
      }
    }
  }
};

// mxfp4 for the stream kernel: DpMxfp4 with the lookup's two register table words read from
// shared memory once per item, each lane from its own copy (a volatile load of a value ptxas
// cannot prove warp-uniform: a constant, or a uniform load, it re-creates with a move before every
// byte permute; mxfp4_pairs.cuh). 8 % fewer instructions in the item loop, 82 registers instead
// of 86, speed 0.99-1.01x (1.007 mean over 8 cells; session 12 call 5). Session 14 added the final
// permute's selector base to those words (one logic instruction per weight word instead of two:
// 64 of the loop's 1,522 per 4 rows x 128 values, ncu) and takes e8m0_half of the block scales from
// a 256-entry table after them (a load instead of ~5 integer instructions per block and row): each
// 1.02-1.05x, both 1.07-1.08x at 8 experts and 1.05-1.09x at the engine's sizes (call 4): the
// item loop is bound by instruction issue after all (one 8-warp block per SM at k = 4096).
struct SMxfp4 : DpMxfp4 {
  // (pos0, neg0, sel0, unused) per lane, then e8m0_half of every scale byte
  static constexpr int kPairTableBytes = 32 * 16, kTableBytes = kPairTableBytes + 256 * 4;
  __device__ static void init_tables(uint8_t *tab) {
    if (threadIdx.x < 32) {
      const mxfp4::PairTables t{};
      reinterpret_cast<uint4 *>(tab)[threadIdx.x] = make_uint4(t.pos0, t.neg0, t.sel0, 0u);
    }
    for (int e = static_cast<int>(threadIdx.x); e < 256; e += static_cast<int>(blockDim.x))
      reinterpret_cast<float *>(tab + kPairTableBytes)[e] = e8m0_half(static_cast<uint8_t>(e));
  }
  template <int RW>
  __device__ static void dot(const uint32_t (&r)[RW][kWords], const uint8_t *const *, int ii, const XQuant &xq,
                             float (&acc)[RW]) {
    mxfp4::PairTables tab;
    uint32_t unused;
    asm volatile("ld.volatile.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(tab.pos0), "=r"(tab.neg0), "=r"(tab.sel0), "=r"(unused)
                 : "r"(smem_addr(xq.tab) + 16u * (threadIdx.x & 31u)));
    const float *etab = reinterpret_cast<const float *>(xq.tab + kPairTableBytes);
    dot_tables<RW>(r, ii, xq, acc, tab, [etab](uint8_t e) { return etab[e]; });
  }
};

// iq2_xxs (stream kernel only): an item is half a block, 128 values = four 32-value sub-blocks of
// 8 bytes, x laid out and quantized as for mxfp4 (one x scale per 32 values, the sub-block); each
// sub-block's integer sum is cuda/iq2xxs_dot.cuh's (checked on a CPU by
// tests/backend/cuda/iq2xxs_dot_test.cpp), then d/8 per block. The grid and the sign patterns' byte masks
// sit in shared memory (the __constant__ tables serialize lanes reading different entries).
__device__ const uint64_t kIq2xxsGridGlobal[256] = {EP_IQ2XXS_GRID_VALUES};
__device__ const uint8_t kIq2xxsSignsGlobal[128] = {EP_IQ2XXS_KSIGNS_VALUES};
struct DpIq2xxs : DpMxfp4 {
  static constexpr int kWords = 9, kBytes256 = 66;
  static constexpr bool kPairHalves = false;  // x in value order: a grid word is 8 consecutive values
  __device__ static int piece(int v, int ipr) {
    const int item = v >> 7, c = (v >> 5) & 3, part = (v >> 4) & 1;
    return ((2 * c + part) * ipr + item) * 16 + (v & 15);
  }
  static constexpr int kTableBytes = (256 + 128) * 8;  // grid [256], then sign masks [128]
  // by the whole block, before anything reads them (the block synchronizes after x)
  __device__ static void init_tables(uint8_t *tab) {
    auto *pairs = reinterpret_cast<iq2xxs::WordPair *>(tab);
    for (int i = static_cast<int>(threadIdx.x); i < 256 + 128; i += static_cast<int>(blockDim.x)) {
      if (i < 256) {
        const uint64_t g = kIq2xxsGridGlobal[i];
        pairs[i] = {static_cast<uint32_t>(g), static_cast<uint32_t>(g >> 32)};
      } else {
        pairs[i] = iq2xxs::sign_masks(kIq2xxsSignsGlobal[i - 256]);
      }
    }
  }
  // words 0..7: the item's 32 quant bytes (2-byte aligned in a row: rows of whole 66-byte blocks
  // start 2-byte aligned, checked by the launcher); word 8: the block's d (f16 bits)
  template <typename L = SharedWords>
  __device__ static void load(const uint8_t *row, int ii, uint32_t (&r)[kWords]) {
    const uint8_t *blk = row + (ii >> 1) * 66;
    const uintptr_t q = reinterpret_cast<uintptr_t>(blk + 2 + 32 * (ii & 1));
    const uint8_t *base = reinterpret_cast<const uint8_t *>(q & ~uintptr_t(3));
    if ((q & 2) != 0) {
      uint32_t t[9];
#pragma unroll
      for (int i = 0; i < 9; ++i) t[i] = L::w(base + 4 * i);
#pragma unroll
      for (int i = 0; i < 8; ++i) r[i] = __funnelshift_r(t[i], t[i + 1], 16);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) r[i] = L::w(base + 4 * i);
    }
    r[8] = L::h(blk);
  }
  template <int RW>
  __device__ static void dot(const uint32_t (&r)[RW][kWords], const uint8_t *const *, int ii, const XQuant &xq,
                             float (&acc)[RW]) {
    const auto *grid = reinterpret_cast<const iq2xxs::WordPair *>(xq.tab), *masks = grid + 256;
    float part[RW];
#pragma unroll
    for (int rr = 0; rr < RW; ++rr) part[rr] = 0.0f;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const XChunk x = x_chunk(xq, c, ii);
#pragma unroll
      for (int rr = 0; rr < RW; ++rr)
        part[rr] = fmaf(static_cast<float>(iq2xxs::subblock_sum(r[rr][2 * c], r[rr][2 * c + 1], grid, masks, x.hi, x.lo)),
                        x.s, part[rr]);
    }
#pragma unroll
    for (int rr = 0; rr < RW; ++rr)
      acc[rr] = fmaf(__half2float(__ushort_as_half(static_cast<unsigned short>(r[rr][8]))) * 0.125f, part[rr], acc[rr]);
  }
};

template <int T> struct DpOf;
template <> struct DpOf<kIQ2_XXS> { using type = DpIq2xxs; };
template <> struct DpOf<kQ2_K> { using type = DpQ2K; };
template <> struct DpOf<kQ3_K> { using type = DpQ3K; };
template <> struct DpOf<kMXFP4> { using type = DpMxfp4; };

constexpr int64_t dp4a_smem_bytes(int64_t k) { return 2 * k + k / 16 * 8 + k / 64 * 16; }  // x_smem_view
constexpr int64_t kDp4aMaxSmem = 200 * 1024;

// ---- the stream decode kernel (mxfp4, q2_K, q3_K, iq2_xxs; one token; k a multiple of 256) --
// The dp4a kernel's arithmetic (the same x quantization, item layout and dot products), with the
// weights streamed through shared memory instead of registers: every warp owns a contiguous,
// balanced range of rows of one matrix (the ranges of all warps of a matrix differ by at most one
// row) and copies it, RW rows at a time (one contiguous byte range: rows are adjacent), into its
// own ring of NS stages (StreamWarp: a bulk copy per chunk on sm_90+, 16-byte cp.async on older
// GPUs). The first NS − 1 stages are issued before the
// block quantizes x, so DRAM works during the prologue, and the loads in flight cost no
// registers (more warps per SM than dp4a's register double buffer allows). Warps synchronize only
// with themselves in the main loop. Launched with programmatic dependent launch (on a created
// stream): the next launch's blocks start while this one drains and fetch their first weights
// before griddepcontrol.wait; x is read and y written only after it (see the kernel).

constexpr int64_t stream_x_bytes(int64_t k) { return (dp4a_smem_bytes(k) + 15) / 16 * 16; }
// The mbarriers of the bulk copies (one per warp and stage), after the rings; reserved on every
// architecture (the host does not know which one the kernel was compiled for).
constexpr int64_t stream_barrier_bytes(int warps, int ns) { return static_cast<int64_t>(warps) * ns * 8; }
// One stage: RW rows starting anywhere in a 16-byte granule (≤ 15 bytes before, ≤ 15 after).
constexpr int64_t stream_stage_bytes(int64_t row_bytes, int rw) { return (rw * row_bytes + 30 + 15) / 16 * 16; }

// q2_K for the stream kernel: dp4a's item and x layout; the item's four pieces share one x scale
// (DpKq::kScaleGroup), so a row's sums stay integers over the item: Σ_j sc_j·(254·hi + lo dot)_j
// (the in-place mask's 4^j shifted out exactly; |.| <= 4·15·16·3·32385 < 2^27) and the mins'
// Σ_j m_j·S_j by three dp4a of the 4-bit mins against the bytes of the pieces' integer x sums
// (XQuant::xi) — then two conversions and the block's d and dmin per item and row. The 4-bit
// scales and mins of the item's four sub-blocks come out of one byte permute.
struct SQ2K : DpQ2K {
  static constexpr bool kItemSums = true;
  template <int RW>
  __device__ static void dot(const uint32_t (&r)[RW][kWords], const uint8_t *const *, int ii, const XQuant &xq,
                             float (&acc)[RW]) {
    const uint32_t sel = (ii & 1) ? 0x7531u : 0x6420u;  // scale bytes 8h + 2j + g, j = 0..3
    const uint4 rec = xq.xi[ii];
    uint32_t scw[RW];
    int A[RW], B[RW];
#pragma unroll
    for (int rr = 0; rr < RW; ++rr) {
      const uint32_t w = __byte_perm(r[rr][4], r[rr][5], sel);
      scw[rr] = w & 0x0F0F0F0Fu;
      const uint32_t mnw = (w >> 4) & 0x0F0F0F0Fu;
      B[rr] = dp4a<false, false>(mnw, rec.x, 0) + dp4a<false, false>(mnw, rec.y, 0) * 256 + dp4a<false, true>(mnw, rec.z, 0) * 65536;
      A[rr] = 0;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const XPiece xp = x_piece(xq, j, ii);  // (its s goes unread: the item's scale is rec.w)
      const uint32_t mask = 0x03030303u << (2 * j);
#pragma unroll
      for (int rr = 0; rr < RW; ++rr) {
        const int2 d = dp4a_hi_lo(r[rr], mask, xp.hi, xp.lo);
        const int t = (d.x * 254 + d.y) >> (2 * j);  // exact: every masked weight is a multiple of 4^j
        A[rr] += static_cast<int>(__byte_perm(scw[rr], 0u, 0x4440u + j)) * t;
      }
    }
    const float xs = __uint_as_float(rec.w);
#pragma unroll
    for (int rr = 0; rr < RW; ++rr) {
      const float2 dd = __half22float2(bits_h2(r[rr][6]));
      acc[rr] = fmaf(xs, fmaf(dd.x, static_cast<float>(A[rr]), -dd.y * static_cast<float>(B[rr])), acc[rr]);
    }
  }
};
// q3_K for the stream kernel: the 2-bit field and its high bit are merged into one byte per value
// before the dp4a pair, (q + 4·hb)·2^e with e = 0, 2, 4, 4 for j = 0..3 (≤ 112), so a value costs
// one dp4a pair instead of two; Σ(q + 4·hb − 4)·x = 2^-e·dot − 4·Σx. The item's four 6-bit scales
// come out as bytes with two byte permutes.
// Its rows are 4-byte aligned (stream_covers: k a multiple of 512, matrices 4-byte aligned), so
// block b of every row starts at 110·b ≡ 2·(b & 1) (mod 4): one word offset per item for all rows,
// and every field read as five aligned words (four when the block is aligned would save a load
// but cost a branch or per-row address arithmetic; session 12).
struct SQ3K : DpQ3K {
  template <typename L = SharedWords>
  __device__ static void load(const uint8_t *row, int ii, uint32_t (&r)[kWords]) {
    const int b = ii >> 2, h = (ii >> 1) & 1, g = ii & 1;
    const uint8_t *a = row + 110 * b - 2 * (b & 1);  // the word at or before the block
    const uint8_t *hm = a + 16 * g, *q = a + 32 + 32 * h + 16 * g, *sc = a + 96;
#pragma unroll
    for (int i = 0; i < 5; ++i) {  // an aligned block's fifth words end inside it (or at the next block's first bytes)
      r[i] = L::w(hm + 4 * i);
      r[5 + i] = L::w(q + 4 * i);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) r[10 + i] = L::w(sc + 4 * i);
    r[14] = L::h(row + 110 * b + 108);
  }
  template <int RW>
  __device__ static void dot(const uint32_t (&r)[RW][kWords], const uint8_t *const *, int ii, const XQuant &xq,
                             float (&acc)[RW]) {
    const int h = (ii >> 1) & 1, g = ii & 1;
    const uint32_t fs = 16u * static_cast<uint32_t>((ii >> 2) & 1);  // the block's word offset (see above)
    uint32_t hm[RW][4], q[RW][4], scb[RW];
#pragma unroll
    for (int rr = 0; rr < RW; ++rr) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        hm[rr][i] = __funnelshift_r(r[rr][i], r[rr][i + 1], fs) >> (4 * h);  // bit j of each byte: the high bit
        q[rr][i] = __funnelshift_r(r[rr][5 + i], r[rr][6 + i], fs);
      }
      const uint32_t raw0 = __funnelshift_r(r[rr][10], r[rr][11], fs), raw1 = __funnelshift_r(r[rr][11], r[rr][12], fs),
                     raw2 = __funnelshift_r(r[rr][12], r[rr][13], fs);
      // scale 8h + 2j + g: low 4 bits in byte 2j + g (nibble h), high 2 bits in byte 8 + 2(j & 1) + g
      // at bit 4h + 2(j >> 1)
      const uint32_t low = (__byte_perm(raw0, raw1, g ? 0x7531u : 0x6420u) >> (4 * h)) & 0x0F0F0F0Fu;
      const uint32_t hw = __byte_perm(raw2, 0u, g ? 0x3131u : 0x2020u) >> (4 * h);
      const uint32_t high = (hw & 0x00000303u) | ((hw >> 2) & 0x03030000u);
      scb[rr] = low | (high << 4);  // scale + 32 per byte j
    }
    float sum[RW];
#pragma unroll
    for (int rr = 0; rr < RW; ++rr) sum[rr] = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const XPiece xp = x_piece(xq, j, ii);
      const uint32_t xhw[4] = {xp.hi.x, xp.hi.y, xp.hi.z, xp.hi.w}, xlw[4] = {xp.lo.x, xp.lo.y, xp.lo.z, xp.lo.w};
      const int e = j == 0 ? 0 : j == 1 ? 2 : 4;  // a constant after unrolling
      const float xsj = xp.s.x * (1.0f / static_cast<float>(1 << e)), m4 = -4.0f * xp.s.y;
#pragma unroll
      for (int rr = 0; rr < RW; ++rr) {
        int th = 0, tl = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint32_t qp = j == 3 ? (q[rr][i] >> 2) & 0x30303030u : q[rr][i] & (0x03030303u << (2 * j));
          // (the shift as a multiply by a power of two from constant memory, IMAD instead of SHF:
          // 0.95-0.99x at the engine's sizes, session 15)
          const uint32_t hp = (hm[rr][i] & (0x01010101u << j)) << (j == 3 ? 3 : j + 2);
          const uint32_t wv = qp | hp;
          th = dp4a<false, true>(wv, xhw[i], th);
          tl = dp4a<false, true>(wv, xlw[i], tl);
        }
        const float sc = __uint_as_float(__byte_perm(scb[rr], 0x4B000000u, 0x7440u + j)) - 8388640.0f;  // − 2^23 − 32
        sum[rr] = fmaf(sc, fmaf(static_cast<float>(th * 254 + tl), xsj, m4), sum[rr]);
      }
    }
#pragma unroll
    for (int rr = 0; rr < RW; ++rr)
      acc[rr] = fmaf(__half2float(__ushort_as_half(static_cast<unsigned short>(r[rr][14]))), sum[rr], acc[rr]);
  }
};
template <int T> struct StreamOf { using type = typename DpOf<T>::type; };
template <> struct StreamOf<kQ2_K> { using type = SQ2K; };
template <> struct StreamOf<kQ3_K> { using type = SQ3K; };
template <> struct StreamOf<kMXFP4> { using type = SMxfp4; };


// Whether StreamWarp copies its chunks with bulk copies (sm_90+) or with cp.async (older GPUs:
// cp.async.bulk and mbarrier transaction counts need sm_90). Host code: false (unused there).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
inline constexpr bool kStreamBulkCopy = true;
#else
inline constexpr bool kStreamBulkCopy = false;
#endif
// One warp's share of a matrix for the stream kernel: a contiguous range of rows (row ranges of
// the nw warps that share the matrix differ by at most one row), copied RW << glog rows at a time
// (one contiguous byte range: rows are adjacent) into the warp's ring of NS stages — by one bulk
// copy per chunk issued by lane 0 and completing on the stage's mbarrier (sm_90+), or by 16-byte
// cp.async of every lane. 32 >> glog lanes split a row's items (2^glog row groups of RW rows per
// chunk). prefetch() reads only the weights (issue it before x exists); run() computes the rows
// into y. A row's result depends only on the lanes per row and x, not on RW, NS, the copy or the
// split among warps.
template <typename D, int RW, int NS>
struct StreamWarp {
  const uint8_t *w;
  uint8_t *ring;  // this warp's NS stages of stage_bytes
  uint64_t *bars;  // this warp's NS mbarriers (bulk copies: stage s completes on bars[s])
  // (row indices as 32-bit unsigned instead — the launchers keep n below 2^31 — were 0.87-0.97x at
  // 8 experts in session 14; why was not measured)
  int64_t row_bytes, rbeg, rend;
  // whole 16-byte granules up to here are copied asynchronously (the matrix's last row may end
  // inside a granule: compute-sanitizer memcheck reports a cp.async with a cut source size as a
  // 16-byte read past the allocation, so that granule is read byte by byte)
  uintptr_t mat_end;
  // probe (sweep builds): bit 0 skips the dot products, 1 the copies; bit 3 issues all NS stages
  // before x instead of NS − 1 (each stage's next chunk is then issued after the stage is computed)
  int stage_bytes, glog, chunks, probe;

  // rows of warp gw of nw: n / nw each, one more for the first n % nw (32-bit: the launchers
  // check n < 2^31; a 64-bit division costs ~100 instructions per warp). (The blocks dispatched
  // first start beside the previous launch's last blocks and finish ~3 µs before the others;
  // giving them 4/3, 3/2 or 2x the rows of the rest was slower in 33 of 36 cells at 8 experts
  // (0.75-0.94x) and in all 36 at the engine's sizes: docs/benchmarks.md, session 17.)
  __device__ StreamWarp(const uint8_t *w_, int64_t n, int64_t k, int gw, int nw, int glog_, uint8_t *ring_, int stage_bytes_,
                        int probe_, uint64_t *bars_ = nullptr)
      : w(w_), ring(ring_), bars(bars_), row_bytes(k / 256 * D::kBytes256), stage_bytes(stage_bytes_), glog(glog_), probe(probe_) {
    const int per = static_cast<int>(n) / nw, extra = static_cast<int>(n) % nw;
    rbeg = static_cast<int64_t>(gw) * per + (gw < extra ? gw : extra);
    rend = rbeg + per + (gw < extra ? 1 : 0);
    const int crows = RW << glog;
    chunks = static_cast<int>((rend - rbeg + crows - 1) / crows);
    mat_end = reinterpret_cast<uintptr_t>(w + n * row_bytes);
    if constexpr (kStreamBulkCopy) {
      if ((threadIdx.x & 31) == 0) {
        for (int st = 0; st < NS; ++st) mbar_init(bars + st, 1);
        mbar_init_fence();
      }
      __syncwarp();
    }
  }

  // chunk c: rows rbeg + crows·c .. (< rend) into stage c % NS (cp.async: always one commit group
  // per call; bulk copy: stage c % NS completes its phase c / NS for every c < chunks)
  __device__ void issue(int c) const {
    const int lane = static_cast<int>(threadIdx.x & 31), crows = RW << glog;
    if (c < chunks && (probe & 2) == 0) {
      const int64_t r0 = rbeg + static_cast<int64_t>(c) * crows;
      const int64_t nr = rend - r0 < crows ? rend - r0 : crows;
      const uintptr_t src = reinterpret_cast<uintptr_t>(w + r0 * row_bytes);
      const uintptr_t start = src & ~uintptr_t(15), end = src + static_cast<uintptr_t>(nr * row_bytes);
      const int n16 = static_cast<int>((end - start + 15) / 16);
      const int whole = start + 16 * static_cast<uintptr_t>(n16) <= mat_end ? n16 : n16 - 1;  // granules inside the matrix
      const uint8_t *from = reinterpret_cast<const uint8_t *>(start);
      uint8_t *dst = ring + (c % NS) * stage_bytes;
      // the matrix's cut last granule, by lane 0 with a plain store first: released by the
      // arrive below (bulk copies) or by wait_chunk's __syncwarp (cp.async)
      if (whole < n16 && lane == 0)
        *reinterpret_cast<uint4 *>(dst + 16 * whole) = load16_bounded(reinterpret_cast<const uint4 *>(from + 16 * whole), mat_end);
      if constexpr (kStreamBulkCopy) {
        if (lane == 0) {
          if (whole > 0) {
            bulk_copy_g2s(dst, from, 16u * static_cast<unsigned>(whole), bars + c % NS);
          } else {
            mbar_arrive(bars + c % NS);
          }
        }
        return;
      } else {
        for (int i = lane; i < whole; i += 32) cp_async16(dst + 16 * i, from + 16 * i);
      }
    } else if (kStreamBulkCopy && c < chunks && lane == 0) {
      mbar_arrive(bars + c % NS);  // probe 2: no copy, the stage still completes
    }
    if constexpr (!kStreamBulkCopy) cp_async_commit();
  }
  // Chunk c (< chunks) has landed in its stage, for every lane of the warp.
  __device__ void wait_chunk(int c) const {
    if constexpr (kStreamBulkCopy) {
      mbar_wait(bars + c % NS, static_cast<unsigned>(c / NS) & 1u);
    } else {
      cp_async_wait<NS - 1>();  // chunk c has landed (this lane's copies) ...
      __syncwarp();             // ... and every lane's
    }
  }
  __device__ bool all_stages_first() const { return (probe & 8) != 0; }
  // The first NS − 1 chunks (probe bit 3: NS): weights only (no x, no output).
  __device__ void prefetch() const {
#pragma unroll
    for (int c = 0; c < NS - 1; ++c) issue(c);
    if (all_stages_first()) issue(NS - 1);
  }
  // Every row of the range into y (x quantized in xq; its block synchronized after writing it);
  // nothing is left in flight at return.
  __device__ void run(const XQuant &xq, float *y) const {
    const int lane = static_cast<int>(threadIdx.x & 31), ipr = xq.ipr;
    const int lpr = 32 >> glog, grp = lane >> (5 - glog), sub = lane & (lpr - 1);  // lanes per row, group, lane in it
    const int crows = RW << glog;
    const int spt = (ipr + lpr - 1) / lpr;
    const bool all_first = all_stages_first();
    for (int c = 0; c < chunks; ++c) {
      if (!all_first) {
        __syncwarp();  // every lane is done with the stage that chunk c + NS − 1 overwrites
        issue(c + NS - 1);
      }
      wait_chunk(c);
      const int64_t c0 = rbeg + static_cast<int64_t>(c) * crows;
      const uint8_t *stage = ring + (c % NS) * stage_bytes + (reinterpret_cast<uintptr_t>(w + c0 * row_bytes) & 15);
      const int64_t r0 = c0 + grp * RW;  // this lane group's rows (past rend: computed on row 0, not written)
      const uint8_t *rp[RW];
#pragma unroll
      for (int rr = 0; rr < RW; ++rr) rp[rr] = stage + (r0 + rr < rend ? grp * RW + rr : 0) * row_bytes;
      float acc[RW];
#pragma unroll
      for (int rr = 0; rr < RW; ++rr) acc[rr] = 0.0f;
      for (int q = 0; q < spt; ++q) {
        const int ii = sub + lpr * q;
        if (ii < ipr && (probe & 1) == 0) {
          uint32_t words[RW][D::kWords];
#pragma unroll
          for (int rr = 0; rr < RW; ++rr) D::template load<SharedWords>(rp[rr], ii, words[rr]);
          D::template dot<RW>(words, rp, ii, xq, acc);
        }
      }
      if (all_first) {
        __syncwarp();  // every lane is done with stage c % NS: chunk c + NS goes there
        issue(c + NS);
      }
      // sum over the lpr lanes of a row group: every lane shuffles (no divergent branch around a
      // shuffle), the offsets at or past lpr are dropped. (Halving steps that trade half of the RW
      // sums with the partner lane — 6 shuffles for 4 rows over 32 lanes instead of 20 — were
      // 0.92-1.00x at 8 experts, session 14.)
#pragma unroll
      for (int rr = 0; rr < RW; ++rr) {
        float sum = acc[rr];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
          const float other = __shfl_xor_sync(0xffffffffu, sum, o);
          if (o < lpr) sum += other;
        }
        if (sub == 0 && r0 + rr < rend) y[r0 + rr] = sum;
      }
    }
    if constexpr (!kStreamBulkCopy) cp_async_wait<0>();  // nothing left in flight at exit (the trailing groups are empty)
  }
};

// Rows per warp step, stages and warps per block, and how a warp's 32 lanes split over its rows:
// idle_den > 0 takes the fewest row groups whose lanes idle at most 1/idle_den of their steps
// (more rows per lane: each x piece read from shared memory serves more rows), idle_den = 0 the
// fewest lane-steps per row (ties to fewer row groups) — stream_glog.
template <int T> struct StreamConfig;
// The best mean over the four benchmark shapes among the configurations measured on the H200
// (docs/benchmarks.md, "Kernels", session 6: 1, 2 or 4 rows x 2-4 stages x 8, 16 or 32 warps):
// 4 rows per warp step, 2 stages, 8 warps for all three types. Row groups (session 11, env
// EP_GEMV_STREAM_GLOG): at k = 3584 (56 items per row) q2_K is 15-17 % faster and q3_K 2-4 % with
// one group of 4 rows (1/8 of the lane-steps idle) than with four groups of one row (none idle);
// mxfp4 at k = 3072 (24 items) is 14 % slower with one group (1/4 idle) than with four, q2_K at
// k = 3072 (48 items) 10 % slower with one group (1/4 idle) than with two (none idle).
// split_rw: rows per warp step when the lanes split over at least 2^split_glog row groups (where
// the shared memory allows), so that a lane group keeps 4 or 2 rows instead of 2 or 1. Session
// 11 (EP_GEMV_STREAM_CFG=8x2 and 4x2 against each other, two runs): 8 rows at k = 3072 — q2_K and
// q3_K two groups, mxfp4 and iq2_xxs four — mxfp4 +4-7 %, q2_K +7-9 %, q3_K +5-10 %, iq2_xxs
// +8-17 %, though it leaves one block per SM where 4 rows leave two; at k = 2048 (mxfp4 and
// iq2_xxs two groups) mxfp4 0.4-1.5 % slower, iq2_xxs 7 % faster at 8 matrices and 15 % slower at
// 6: they split only over four groups. q3_K no longer splits (split_rw = rw): with session 12's
// aligned-word loads (128 registers) 4 rows at k = 3072 were 1.042x at 8 matrices and 1.013x at
// 16 against 8 rows (three runs each, session 12 call 7); the other shapes do not split.
// Session 15 (temporary -D flags, docs/benchmarks.md): three stages for mxfp4 and q3_K, two
// chunks before the wait 0.86-0.96x at 8 experts, one before it and one after x 0.95-1.03x;
// 16-warp blocks of 2-row steps at up to 128 registers (one block per SM) 0.88-1.04x (q3_K at
// k = 4096 the only gain).
// wide_warps > 0: from k = wide_min_k on, where the rows do not split and the shared memory allows,
// one block of wide_warps warps per SM instead of two of `warps`. q2_K (session 15,
// docs/benchmarks.md): two co-resident 8-warp blocks of a launch ended up to 3.7 us apart (call 7's
// timeline, mxfp4 at k = 2048; the older block's warps seem to be issued first — not measured
// directly), and one 16-warp block per SM measured 1.038 / 1.024 at k = 4096 / 3584 with 8 experts
// and 1.001 / 1.039 at the engine's sizes (call 9, three runs; call 8 alike), while at k = 3072 it
// was 0.93-0.94 (the 8-row split no longer fits) and at 2048 about 1.00. q3_K at k = 3584 (two
// blocks per SM before; at 4096 one, and 16 warps do not fit): 1.013 with 8 experts, 1.036 with 32
// (call 10). mxfp4 runs one block per SM at k = 4096 and 3584 (shared memory); its 16-warp blocks
// of 2-row steps were slower (call 5).
// fill_warps > 0: where the rows do not split and two blocks of `warps` do not fit an SM's shared
// memory, one block of fill_warps warps if its shared memory stays at or below fill_max_smem.
// Session 16 (docs/benchmarks.md, calls 1-2): 12 warps for mxfp4 at k = 3584 (195 KB) measured
// 1.020 with 8 experts and 1.042 / 1.077 with K3's 32; at k = 4096 (223 KB) 0.915 with 8 and
// 0.988 / 1.013 with 12; q3_K at k = 4096 (181 KB) 0.924 with 8 and 1.011 / 1.024 with 12; q2_K at
// k = 3072 (the split plan, 203 KB) 0.935 with 16. (Session 13's 12-warp blocks at every k: mxfp4
// at k = 3584 with 32 experts 1.054, every other cell 0.86-1.01.) Call 3, the committed plan against
// EP_GEMV_STREAM_CFG=4x2x8: 0.994 with 8 experts, 1.047 with 32 (0.751 -> 0.786).
template <> struct StreamConfig<kQ2_K> {
  static constexpr int rw = 4, split_rw = 8, split_glog = 1, ns = 2, warps = 8, idle_den = 8;
  static constexpr int wide_warps = 16;
  static constexpr int64_t wide_min_k = 3584;
  static constexpr int fill_warps = 0;
  static constexpr int64_t fill_max_smem = 0;
};
template <> struct StreamConfig<kQ3_K> {
  static constexpr int rw = 4, split_rw = 4, split_glog = 1, ns = 2, warps = 8, idle_den = 8;
  static constexpr int wide_warps = 16;  // of the benchmark shapes fits only k = 3584 (4096: 239 KB)
  static constexpr int64_t wide_min_k = 3584;
  static constexpr int fill_warps = 0;
  static constexpr int64_t fill_max_smem = 0;
};
template <> struct StreamConfig<kMXFP4> {
  static constexpr int rw = 4, split_rw = 8, split_glog = 2, ns = 2, warps = 8, idle_den = 0;
  static constexpr int wide_warps = 0;
  static constexpr int64_t wide_min_k = 0;
  static constexpr int fill_warps = 12;
  static constexpr int64_t fill_max_smem = 200 * 1024;  // k = 4096 (223 KB) was slower with 8 experts
};
// iq2_xxs: mxfp4's configuration (only the row split measured)
template <> struct StreamConfig<kIQ2_XXS> {
  static constexpr int rw = 4, split_rw = 8, split_glog = 2, ns = 2, warps = 8, idle_den = 0;
  static constexpr int wide_warps = 0;
  static constexpr int64_t wide_min_k = 0;
  static constexpr int fill_warps = 0;
  static constexpr int64_t fill_max_smem = 0;
};

constexpr int64_t kStreamMaxSmem = 227 * 1024;
// The shared memory the runtime reserves per resident block (sm_90: 1 KB; kStreamMaxSmem plus it
// is an SM's 228 KB).
constexpr int64_t kSmemReservedPerBlock = 1024;
// Two blocks of smem bytes fit one SM's shared memory.
constexpr bool stream_two_blocks_fit(int64_t smem) {
  return 2 * (smem + kSmemReservedPerBlock) <= kStreamMaxSmem + kSmemReservedPerBlock;
}
// Lane-steps per row of ipr items with 2^g row groups (32 >> g lanes per row).
constexpr int64_t stream_lane_steps(int64_t ipr, int g) { return (ipr + (32 >> g) - 1) / (32 >> g) * (32 >> g); }
// Row groups per warp (2^glog, at most max_glog) for a row of ipr items: the fewest lane-steps
// (ties to fewer groups), or fewer groups whose lanes idle at most 1/idle_den (StreamConfig).
constexpr int stream_glog(int64_t ipr, int max_glog, int idle_den) {
  int best = 0;  // the fewest lane-steps
  for (int g = 1; g <= max_glog; ++g)
    if (stream_lane_steps(ipr, g) < stream_lane_steps(ipr, best)) best = g;
  for (int g = 0; g < best && idle_den > 0; ++g)  // fewer groups whose lanes idle little
    if (idle_den * (stream_lane_steps(ipr, g) - ipr) <= stream_lane_steps(ipr, g)) return g;
  return best;
}
static_assert(stream_glog(56, 2, 8) == 0 && stream_glog(56, 2, 0) == 2, "k 3584: q2_K one row group, mxfp4-style four");
static_assert(stream_glog(48, 2, 8) == 1 && stream_glog(24, 2, 0) == 2 && stream_glog(28, 2, 0) == 0, "k 3072, 1536, 3584");
static_assert(stream_glog(64, 2, 8) == 0 && stream_glog(12, 2, 8) == 1 && stream_glog(12, 0, 8) == 0, "k 4096, 768");
// What a launch runs: rows per lane group (the configuration's rows per chunk split over the row
// groups, so the chunk, the stages and the occupancy stay those of the configuration), stages,
// warps per block, row groups and the shared memory.
struct StreamPlan {
  int rw, ns, warps, glog;
  int64_t stage, smem;
};
// max_glog (0..2) caps the row groups below what the rows allow.
template <int T>
StreamPlan stream_plan(int64_t k, int rw, int ns, int warps, int max_glog = 2) {
  using D = typename StreamOf<T>::type;
  constexpr int64_t rb = D::kBytes256, values = D::kValues;
  StreamPlan p{};
  rw = rw < 1 ? 1 : rw;
  const int glog_cap = rw >= 4 ? 2 : rw == 2 ? 1 : 0;  // 3 rows stay one group
  p.glog = stream_glog(k / values, max_glog < glog_cap ? max_glog : glog_cap, StreamConfig<T>::idle_den);
  p.rw = rw >> p.glog;
  p.ns = ns;
  p.warps = warps;
  p.stage = stream_stage_bytes(k / 256 * rb, p.rw << p.glog);
  p.smem = stream_x_bytes(k) + D::kTableBytes + warps * ns * p.stage + stream_barrier_bytes(warps, ns);
  return p;
}
// The default plan for k (StreamConfig<T>; row groups capped at 2^max_glog): rw rows per warp
// step, or split_rw when the rows split over 2^split_glog or more row groups and its shared
// memory fits; rows that do not split run in blocks of wide_warps from k = wide_min_k on where
// those fit, or of fill_warps where only one block of `warps` fits an SM and fill_max_smem allows.
template <int T>
StreamPlan default_stream_plan(int64_t k, int max_glog = 2) {
  using C = StreamConfig<T>;
  const StreamPlan plan = stream_plan<T>(k, C::rw, C::ns, C::warps, max_glog);
  if constexpr (C::wide_warps > 0) {
    static_assert(C::split_glog >= 1, "rows in one group (glog 0) never take the split plan");
    if (plan.glog == 0 && k >= C::wide_min_k) {
      const StreamPlan wide = stream_plan<T>(k, C::rw, C::ns, C::wide_warps, max_glog);
      if (wide.smem <= kStreamMaxSmem) return wide;
    }
  }
  if constexpr (C::fill_warps > 0) {
    if (plan.glog == 0 && !stream_two_blocks_fit(plan.smem)) {
      const StreamPlan fill = stream_plan<T>(k, C::rw, C::ns, C::fill_warps, max_glog);
      if (fill.smem <= C::fill_max_smem) return fill;
    }
  }
  if (plan.glog < C::split_glog) return plan;
  // both row counts allow four row groups, so the two plans split the lanes alike
  static_assert(C::rw >= 4 && C::split_rw >= 4, "stream_plan caps the row groups below 4 rows");
  const StreamPlan split = stream_plan<T>(k, C::split_rw, C::ns, C::warps, max_glog);
  return split.smem <= kStreamMaxSmem ? split : plan;
}
// The least shared memory the stream kernel needs for k (the default's rw rows per step): over
// kStreamMaxSmem, the kernel cannot run this k.
template <int T>
int64_t stream_smem_bytes(int64_t k) {
  return stream_plan<T>(k, StreamConfig<T>::rw, StreamConfig<T>::ns, StreamConfig<T>::warps).smem;
}

// Launches Kernel once over one wave of resident blocks shared by the launch's matrices: per
// matrix (blockIdx.y) min(most, SMs · blocks per SM / matrices) blocks, at least one. Rounded
// down: rounding up leaves a few blocks for a second wave whenever the matrices do not divide the
// slots (3 blocks per SM: 50 x 8 = 400 blocks for 396 slots), which doubled the time of such
// configurations in session 5's measurements. With programmatic dependent launch on sm_90+ and a
// created stream (the legacy default stream serializes), unless `pdl` is false.
template <auto Kernel, typename... Args>
void launch_one_wave(const char *name, int threads, int64_t smem, int64_t n_mat, int64_t most, bool pdl,
                     cudaStream_t stream, Args... args) {
  const Residency r = residency<Kernel>(threads, smem);
  int per_sm = r.per_sm;
#if defined(EP_GEMV_SWEEP)
  // EP_GEMV_BLOCKS_PER_SM=n (sweep builds): at most n of the launch's blocks per SM, so that the
  // next launch's blocks can be resident beside them
  static const int cap = [] {
    const char *v = std::getenv("EP_GEMV_BLOCKS_PER_SM");
    return v != nullptr ? std::atoi(v) : 0;
  }();
  if (cap > 0 && cap < per_sm) per_sm = cap;
#endif
  const int64_t slots = static_cast<int64_t>(r.sms) * per_sm;
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
  cfg.numAttrs = pdl && stream != nullptr && r.pdl ? 1 : 0;
  EP_CUDA_CHECK(cudaLaunchKernelEx(&cfg, Kernel, args...));
  EP_CUDA_CHECK_LAUNCH(name);
}


}  // namespace
}  // namespace ep::backend::cuda
