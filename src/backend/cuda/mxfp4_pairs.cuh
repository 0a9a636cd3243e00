// mxfp4 decode GEMV: the e2m1 → int8 table lookup of the dp4a and stream kernels (DpMxfp4 in
// gemv_dp4a.cuh) and the x layout it implies, host-callable so that
// tests/backend/cuda/mxfp4_pairs_test.cpp checks them on a CPU against ggml's kvalues_mxfp4.
//
// ggml (../shared/reference): a block is an e8m0 scale byte and 16 bytes; byte i holds value i in
// its low nibble and value i + 16 in its high nibble; a nibble is an e2m1 code whose value, times
// two, is kvalues_mxfp4 = {0, 1, 2, 3, 4, 6, 8, 12, 0, −1, −2, −3, −4, −6, −8, −12} (the scale's
// e8m0_half carries the 1/2). The lookup turns word t of the block's bytes (values 4t..4t+3 and
// 4t+16..4t+19) into two words of int8 in nibble order: values 4t, 4t+16, 4t+1, 4t+17 and 4t+2,
// 4t+18, 4t+3, 4t+19. x is stored in that order (byte p of a block's 32 is value p/2 + 16·(p % 2),
// mxfp4_x_position), so each word goes to dp4a as it comes out.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define EP_MXFP4_HD __host__ __device__ __forceinline__
#else
#define EP_MXFP4_HD inline
#endif

namespace ep::backend::cuda::mxfp4 {

/// Byte permute (PTX prmt.b32, default mode): byte n of the result is byte (s >> 4n) & 7 of the
/// 8 bytes b:a. Only for selectors whose four low nibbles are all below 8 (bit 3 would switch a
/// byte to sign replication on the device); unlike __byte_perm, no mask instruction is added for
/// a selector computed at run time (nvcc ands it with 0x7777 first).
EP_MXFP4_HD uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(s));
  return d;
#else
  const uint64_t v = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t d = 0;
  for (int n = 0; n < 4; ++n) d |= static_cast<uint32_t>((v >> (8 * ((s >> (4 * n)) & 7u))) & 0xFFu) << (8 * n);
  return d;
#endif
}

/// The int8 weights (2 × e2m1) of the 8 nibbles of q: x = nibbles of bytes 0 and 1 (low, high,
/// low, high), y = those of bytes 2 and 3.
struct Pairs {
  uint32_t x, y;
};
/// The lookup's first table words (magnitudes 0..3 and their negations), which a byte permute
/// takes from registers (the second words go in as immediates), and the final permute's selector
/// base. Left as constants, ptxas re-creates the table words with a move before every permute (241
/// of the 1,596 instructions of the stream kernel's mxfp4 item loop in its SASS) and builds the
/// selector with two logic instructions (an immediate each) instead of one; the stream kernel
/// reads all three from shared memory instead (SMxfp4 in gemv_stream.cu). (The `>> 16` shifts as
/// `mul.hi` by a power of two read from shared memory — IMAD.HI on the FMA pipe instead of SHF on
/// the ALU pipe, the busiest — measured slower, as did the `>> 1` shifts and the funnel shifts as
/// multiplies.)
struct PairTables {
  uint32_t pos0 = 0x03020100u, neg0 = 0xFDFEFF00u, sel0 = 0x32103210u;
};
EP_MXFP4_HD Pairs pairs(uint32_t q, const PairTables &t = PairTables{}) {
  constexpr uint32_t pos1 = 0x0C080604u, neg1 = 0xF4F8FAFCu;
  const uint32_t m = q & 0x77777777u;                             // the magnitudes' table indices
  const uint32_t sel = t.sel0 | ((q >> 1) & 0x44444444u);  // byte n of pos, or of neg where negative
  const uint32_t lo = prmt(prmt(t.pos0, pos1, m), prmt(t.neg0, neg1, m), sel);
  const uint32_t hi = prmt(prmt(t.pos0, pos1, m >> 16), prmt(t.neg0, neg1, m >> 16), sel >> 16);
  return {lo, hi};
}

/// Byte position of value v (0..31) of a block in its x: p = 2·(v % 16) + v / 16.
EP_MXFP4_HD int x_position(int v) { return 2 * (v & 15) + ((v >> 4) & 1); }

/// The two x words of values s .. s + 3 (s % 16 < 16, packed as `own`) and s + 16 .. s + 19
/// (packed as `other`) of a block, interleaved: the lower word at position 2s, the upper one at
/// 2s + 4 (quantize_x writes them; mxfp4_pairs_test checks the layout on a CPU).
EP_MXFP4_HD uint32_t lower_word(uint32_t own, uint32_t other) { return prmt(own, other, 0x5140u); }
EP_MXFP4_HD uint32_t upper_word(uint32_t own, uint32_t other) { return prmt(other, own, 0x7362u); }

}  // namespace ep::backend::cuda::mxfp4
