// The stream decode-GEMV kernel (mxfp4, q2_K, q3_K, iq2_xxs; one token; k a multiple of 256):
// the dp4a kernel's arithmetic (gemv_dp4a.cuh: the same x quantization, item layout and dot
// products), with the weights streamed through shared memory instead of registers: every warp
// owns a contiguous, balanced range of rows of one matrix (the ranges of all warps of a matrix
// differ by at most one row) and copies it, RW rows at a time (one contiguous byte range: rows
// are adjacent), into its own ring of NS stages (StreamWarp: a bulk copy per chunk on sm_90+,
// 16-byte cp.async on older GPUs). The first NS − 1 stages are issued before the block quantizes
// x, so DRAM works during the prologue, and the loads in flight cost no registers (more warps per
// SM than dp4a's register double buffer allows). Warps synchronize only with themselves in the
// main loop. Launched with programmatic dependent launch (on a created stream): the next
// launch's blocks start while this one drains and fetch their first weights before
// griddepcontrol.wait; x is read and y written only after it (see the kernel). Scales are folded
// into the integer dots (q2_K: a row's whole item in integers, mins included) and the q3_K high
// bit merged into the 2-bit field. launch_gemv (gemv.cu) runs it for one token on matrices of at
// least 2048 rows wherever it fits.
#include "backend/cuda/dispatch.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/gemv_dp4a.cuh"
#include "backend/cuda/gemv_families.hpp"
#include "backend/cuda/grid_dependency.cuh"
#include "backend/cuda/iq2xxs_dot.cuh"
#include "backend/cuda/kernels.hpp"
#include "backend/cuda/mxfp4_pairs.cuh"
#include "backend/cuda/quant_unit.cuh"
#include "core/status.hpp"
#include "gpu/check.hpp"

#include <cstdint>
#include <string>

namespace ep::backend::cuda {
namespace {

using namespace quant;

constexpr int64_t stream_x_bytes(int64_t k) { return (dp4a_smem_bytes(k) + 15) / 16 * 16; }
// The mbarriers of the bulk copies (one per warp and stage), after the rings; reserved on every
// architecture (the host does not know which one the kernel was compiled for).
constexpr int64_t stream_barrier_bytes(int warps, int ns) { return static_cast<int64_t>(warps) * ns * 8; }
// One stage: RW rows starting anywhere in a 16-byte granule (≤ 15 bytes before, ≤ 15 after).
constexpr int64_t stream_stage_bytes(int64_t row_bytes, int rw) { return (rw * row_bytes + 30 + 15) / 16 * 16; }

// mxfp4 for the stream kernel: DpMxfp4 with the lookup's two register table words read from
// shared memory once per item, each lane from its own copy (a volatile load of a value ptxas
// cannot prove warp-uniform: a constant, or a uniform load, it re-creates with a move before every
// byte permute; mxfp4_pairs.cuh): 8 % fewer instructions in the item loop and fewer registers.
// The final permute's selector base is stored in those words too (one logic instruction per
// weight word instead of two), and e8m0_half of the block scales comes from a 256-entry table
// after them (a load instead of ~5 integer instructions per block and row): measured 1.05-1.09x
// together, since the item loop is bound by instruction issue.
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
// sub-block's integer sum is iq2xxs_dot.cuh's (checked on a CPU by
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
// Its rows are 4-byte aligned (gemv_stream_covers: k a multiple of 512, matrices 4-byte aligned), so
// block b of every row starts at 110·b ≡ 2·(b & 1) (mod 4): one word offset per item for all rows,
// and every field read as five aligned words (four when the block is aligned would save a load
// but cost a branch or per-row address arithmetic).
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
          // (the shift as a multiply by a power of two from constant memory, IMAD instead of SHF,
          // measured slower)
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
template <int T> struct StreamOf;
template <> struct StreamOf<kIQ2_XXS> { using type = DpIq2xxs; };
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
  // (row indices as 32-bit unsigned instead — the launchers keep n below 2^31 — measured slower)
  int64_t row_bytes, rbeg, rend;
  // whole 16-byte granules up to here are copied asynchronously (the matrix's last row may end
  // inside a granule: compute-sanitizer memcheck reports a cp.async with a cut source size as a
  // 16-byte read past the allocation, so that granule is read byte by byte)
  uintptr_t mat_end;
  int stage_bytes, glog, chunks;

  // rows of warp gw of nw: n / nw each, one more for the first n % nw (32-bit: the launchers
  // check n < 2^31; a 64-bit division costs ~100 instructions per warp). (The blocks dispatched
  // first start beside the previous launch's last blocks and finish ~3 µs before the others;
  // giving them a larger share of the rows measured slower.)
  __device__ StreamWarp(const uint8_t *w_, int64_t n, int64_t k, int gw, int nw, int glog_, uint8_t *ring_, int stage_bytes_,
                        uint64_t *bars_ = nullptr)
      : w(w_), ring(ring_), bars(bars_), row_bytes(k / 256 * D::kBytes256), stage_bytes(stage_bytes_), glog(glog_) {
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
    if (c < chunks) {
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
  // The first NS − 1 chunks: weights only (no x, no output). (All NS of them before x measured
  // slower: x's quantization, which reads x after the wait, queues behind the weight loads.)
  __device__ void prefetch() const {
#pragma unroll
    for (int c = 0; c < NS - 1; ++c) issue(c);
  }
  // Every row of the range into y (x quantized in xq; its block synchronized after writing it);
  // nothing is left in flight at return.
  __device__ void run(const XQuant &xq, float *y) const {
    const int lane = static_cast<int>(threadIdx.x & 31), ipr = xq.ipr;
    const int lpr = 32 >> glog, grp = lane >> (5 - glog), sub = lane & (lpr - 1);  // lanes per row, group, lane in it
    const int crows = RW << glog;
    const int spt = (ipr + lpr - 1) / lpr;
    for (int c = 0; c < chunks; ++c) {
      __syncwarp();  // every lane is done with the stage that chunk c + NS − 1 overwrites
      issue(c + NS - 1);
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
        if (ii < ipr) {
          uint32_t words[RW][D::kWords];
#pragma unroll
          for (int rr = 0; rr < RW; ++rr) D::template load<SharedWords>(rp[rr], ii, words[rr]);
          D::template dot<RW>(words, rp, ii, xq, acc);
        }
      }
      // sum over the lpr lanes of a row group: every lane shuffles (no divergent branch around a
      // shuffle), the offsets at or past lpr are dropped. (Halving steps that trade half of the RW
      // sums with the partner lane — 6 shuffles for 4 rows over 32 lanes instead of 20 — measured
      // slower.)
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
// The values below were chosen by measurement on an H200 (docs/benchmarks.md, "Kernels"):
// - rw x ns x warps: 4 rows per warp step, 2 stages, 8 warps per block — the best mean over the
//   benchmark shapes among 1, 2 or 4 rows x 2-4 stages x 8, 16 or 32 warps; three stages, or
//   16-warp blocks of 2-row steps, measured no better.
// - idle_den: q2_K and q3_K take one group of 4 rows where at most 1/8 of the lane-steps idle (at
//   k = 3584, 56 items per row, 15-17 % and 2-4 % faster than four groups of one row); mxfp4 takes
//   the fewest lane-steps (one group where a quarter of them idles was 14 % slower at k = 3072).
// - split_rw: rows per warp step when the lanes split over at least 2^split_glog row groups (where
//   the shared memory allows), so that a lane group keeps 4 or 2 rows instead of 2 or 1: 8 rows at
//   k = 3072 measured 4-17 % faster, though they leave one block per SM where 4 rows leave two;
//   split over only two groups (mxfp4 and iq2_xxs at k = 2048) they were no faster, hence
//   split_glog = 2 there. q3_K does not split (split_rw = rw): with its aligned-word loads 4 rows
//   measured faster than 8.
// - wide_warps > 0: from k = wide_min_k on, where the rows do not split and the shared memory
//   allows, one block of wide_warps warps per SM instead of two of `warps` (two co-resident blocks
//   of one launch can end microseconds apart): q2_K at k = 3584 and 4096 and q3_K at 3584 measured
//   1-4 % faster; q2_K at k = 3072 slower (its 8-row split no longer fits).
// - fill_warps > 0: where the rows do not split and two blocks of `warps` do not fit an SM's shared
//   memory, one block of fill_warps warps if its shared memory stays at or below fill_max_smem:
//   mxfp4 at k = 3584 (195 KB) 2-8 % faster with 12 warps.
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
template <int T>
StreamPlan stream_plan(int64_t k, int rw, int ns, int warps) {
  using D = typename StreamOf<T>::type;
  constexpr int64_t rb = D::kBytes256, values = D::kValues;
  StreamPlan p{};
  rw = rw < 1 ? 1 : rw;
  const int glog_cap = rw >= 4 ? 2 : rw == 2 ? 1 : 0;  // 3 rows stay one group
  p.glog = stream_glog(k / values, glog_cap, StreamConfig<T>::idle_den);
  p.rw = rw >> p.glog;
  p.ns = ns;
  p.warps = warps;
  p.stage = stream_stage_bytes(k / 256 * rb, p.rw << p.glog);
  p.smem = stream_x_bytes(k) + D::kTableBytes + warps * ns * p.stage + stream_barrier_bytes(warps, ns);
  return p;
}
// The plan for k (StreamConfig<T>): rw rows per warp step, or split_rw when the rows split over
// 2^split_glog or more row groups and its shared memory fits; rows that do not split run in
// blocks of wide_warps from k = wide_min_k on where those fit, or of fill_warps where only one
// block of `warps` fits an SM and fill_max_smem allows.
template <int T>
StreamPlan default_stream_plan(int64_t k) {
  using C = StreamConfig<T>;
  static_assert(C::split_glog >= 1, "the wide and fill plans (rows in one group, glog 0) never take the split plan");
  const StreamPlan plan = stream_plan<T>(k, C::rw, C::ns, C::warps);
  if (C::wide_warps > 0 && plan.glog == 0 && k >= C::wide_min_k) {
    const StreamPlan wide = stream_plan<T>(k, C::rw, C::ns, C::wide_warps);
    if (wide.smem <= kStreamMaxSmem) return wide;
  }
  if (C::fill_warps > 0 && plan.glog == 0 && !stream_two_blocks_fit(plan.smem)) {
    const StreamPlan fill = stream_plan<T>(k, C::rw, C::ns, C::fill_warps);
    if (fill.smem <= C::fill_max_smem) return fill;
  }
  if (plan.glog < C::split_glog) return plan;
  // both row counts allow four row groups, so the two plans split the lanes alike
  static_assert(C::rw >= 4 && C::split_rw >= 4, "stream_plan caps the row groups below 4 rows");
  const StreamPlan split = stream_plan<T>(k, C::split_rw, C::ns, C::warps);
  return split.smem <= kStreamMaxSmem ? split : plan;
}
// The least shared memory the stream kernel needs for k (the default's rw rows per step): over
// kStreamMaxSmem, the kernel cannot run this k.
template <int T>
int64_t stream_smem_bytes(int64_t k) {
  return stream_plan<T>(k, StreamConfig<T>::rw, StreamConfig<T>::ns, StreamConfig<T>::warps).smem;
}

// A warp works on G = 2^glog rows groups at once: lane group l / (32 / G) takes RW rows of a
// chunk of G·RW rows and its 32 / G lanes split their items (G > 1 when a row has fewer items
// than 32, or a number that 32 lanes would leave partly idle: 48 items are 3 steps of 16 lanes).
// WARPS warps per block: x is quantized once per block, so fewer, larger blocks spend less on it.
// Blocks of more than 8 warps are bounded for one block per SM (up to 128 registers for 16 warps:
// the wide plans of q2_K and q3_K, StreamConfig; bounded for two such blocks, 64, they spilled;
// up to 168 for mxfp4's 12-warp fill plan). 8-warp blocks are bounded for two blocks per SM (at
// most 128 registers): unbounded, q3_K used 139, which left one block per SM, and measured 2-12 %
// slower (mxfp4 up to 3 %). Bounded for three blocks (at most 80 registers) q2_K was no faster.
template <typename D, int RW, int NS, int WARPS, bool GLU>
__global__ void __launch_bounds__(WARPS * 32, WARPS > 8 ? 1 : 2) gemv_stream_kernel(GemvArgs a, int stage_bytes, int glog) {
  extern __shared__ __align__(16) uint8_t smem[];
  XQuant xq = x_smem_view<D>(smem, a.k);
  const int warp = threadIdx.x >> 5, m = blockIdx.y;
  // after x: the decoder's tables (iq2_xxs), then one ring per warp
  uint8_t *tables = smem + stream_x_bytes(a.k);
  if constexpr (D::kTableBytes > 0) xq.tab = tables;
  uint8_t *ring = smem + stream_x_bytes(a.k) + D::kTableBytes + static_cast<int64_t>(warp) * NS * stage_bytes;
  // after the rings: each warp's NS mbarriers (bulk copies, stream_barrier_bytes)
  uint64_t *bars = reinterpret_cast<uint64_t *>(smem + stream_x_bytes(a.k) + D::kTableBytes +
                                                static_cast<int64_t>(WARPS) * NS * stage_bytes) + warp * NS;
  const StreamWarp<D, RW, NS> rows(static_cast<const uint8_t *>(a.w_ptrs ? a.w_ptrs[m] : a.w), a.n, a.k,
                                   static_cast<int>(blockIdx.x) * WARPS + warp, static_cast<int>(gridDim.x) * WARPS, glog,
                                   ring, stage_bytes, bars);
  rows.prefetch();  // (after the wait instead, or one more chunk right after it, measured slower)
  D::init_tables(tables);  // constants: before the wait too
  // Up to here only the weights, w_ptrs and the shape were read: the previous kernel may still be
  // running when this launch's blocks start (programmatic dependent launch). The only kernel that
  // lets its successor start early is this one, past this wait, and it writes nothing but y; x
  // (often the previous kernel's output) is read, and y written, after the wait.
  grid_dependency_wait();
  // (at the end of the block instead, or in each warp after its last chunk request, measured
  // slower)
  grid_dependents_launch();
  quantize_input_smem<D, GLU>(a, m, smem);
  __syncthreads();
  rows.run(xq, a.y + static_cast<int64_t>(m) * a.n);
}

template <int T, int RW, int NS, int WARPS, bool GLU>
void launch_stream_cfg(const GemvArgs &args, const StreamPlan &plan, cudaStream_t stream) {
  using D = typename StreamOf<T>::type;
  // at most one warp per row
  launch_one_wave<gemv_stream_kernel<D, RW, NS, WARPS, GLU>>("gemv_stream_kernel", WARPS * 32, plan.smem, args.n_mat,
                                                             (args.n + WARPS - 1) / WARPS, stream, args,
                                                             static_cast<int>(plan.stage), plan.glog);
}

// The kernel of default_stream_plan's plan for this k: the configurations it can pick are the
// ones instantiated (rows per lane group 4, 2 or 1 of C::warps, and the wide and fill blocks).
template <int T, bool GLU>
void launch_stream_plan(const GemvArgs &args, cudaStream_t stream) {
  using C = StreamConfig<T>;
  const StreamPlan plan = default_stream_plan<T>(args.k);
  static_assert(C::rw == 4 && (C::split_rw == 4 || C::split_rw == 8), "the default's rows per lane group are 4, 2 or 1");
  static_assert(C::ns == 2 || C::ns == 3, "instantiate the default configuration");
  if constexpr (C::wide_warps > 0) {
    if (plan.warps == C::wide_warps) return launch_stream_cfg<T, C::rw, C::ns, C::wide_warps, GLU>(args, plan, stream);
  }
  if constexpr (C::fill_warps > 0) {
    if (plan.warps == C::fill_warps) return launch_stream_cfg<T, C::rw, C::ns, C::fill_warps, GLU>(args, plan, stream);
  }
  if (plan.rw == 4) return launch_stream_cfg<T, 4, C::ns, C::warps, GLU>(args, plan, stream);
  if (plan.rw == 2) return launch_stream_cfg<T, 2, C::ns, C::warps, GLU>(args, plan, stream);
  return launch_stream_cfg<T, 1, C::ns, C::warps, GLU>(args, plan, stream);
}

// With an activation on the input (GemvArgs::glu) or without: a template parameter of the kernel.
template <int T>
void launch_stream(const GemvArgs &args, cudaStream_t stream) {
  if (args.glu.up != nullptr) {
    launch_stream_plan<T, true>(args, stream);
  } else {
    launch_stream_plan<T, false>(args, stream);
  }
}

}  // namespace

// stream: what dp4a covers, with x and one ring per warp in shared memory
bool gemv_stream_covers(uint32_t type, const GemvArgs &args) {
  const int t = static_cast<int>(type);
  if (!format::ggml_gemv_family(type, format::kGemvStream)) return false;
  if (t == kIQ2_XXS)  // its blocks are read as 16-bit halves and aligned words: 2-byte aligned rows
    return args.n_tok == 1 && args.k % 256 == 0 && stream_smem_bytes<kIQ2_XXS>(args.k) <= kStreamMaxSmem &&
           (args.w_ptrs != nullptr || (reinterpret_cast<uintptr_t>(args.w) & 1) == 0);
  if (!gemv_dp4a_covers(type, args)) return false;
  // q3_K (SQ3K): 4-byte aligned rows — k a multiple of 512 (rows of an even number of 110-byte
  // blocks) and 4-byte aligned matrices (w_ptrs: the caller's; documented on GemvArgs)
  if (t == kQ3_K && (args.k % 512 != 0 || (args.w_ptrs == nullptr && (reinterpret_cast<uintptr_t>(args.w) & 3) != 0)))
    return false;
  const int64_t smem = t == kQ2_K ? stream_smem_bytes<kQ2_K>(args.k)
                       : t == kQ3_K ? stream_smem_bytes<kQ3_K>(args.k)
                                    : stream_smem_bytes<kMXFP4>(args.k);
  return smem <= kStreamMaxSmem;
}

void launch_gemv_stream(uint32_t type, const GemvArgs &args, cudaStream_t stream) {
  dispatch_gemv_family<format::kGemvStream>(type, "launch_gemv_stream",
                                            [&](auto tag) { launch_stream<decltype(tag)::value>(args, stream); });
}

}  // namespace ep::backend::cuda
