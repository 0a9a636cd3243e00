// The token side of the tensor-core GEMV (gemv_mma.cu), host-callable so that
// tests/backend/cuda/mma_pairs_test.cpp checks its index arithmetic on a CPU: how many tokens a
// launch's kernel is instantiated for, how many values of x one phase stages, where x's staging
// puts a token's 4-value unit among the B fragments and which of them a lane reads for an mma.
//
// The 8 columns of m16n8k16 are tokens: a kernel of NTOK tokens runs tiles(NTOK) n8 tiles, and
// every A fragment a warp decodes from its weights feeds one mma per tile (token tile j: tokens
// 8j..8j+7; lane 4g + t reads token 8j + g's B fragments and holds the outputs of tokens
// 8j + 2t, 8j + 2t + 1). x is staged per phase as hi + lo f16 B fragments, 16 bytes per 4-value
// unit and token: uint4 slot (step·NTOK + token)·4 + lane quarter of the phase's 16-value mma
// steps, whatever the token count, so a wider kernel only has more tokens per step.
#pragma once

#include <cstdint>

#include "backend/cuda/mma_pairs.cuh"

namespace ep::backend::cuda::mma {

/// Tokens of one m16n8k16 tile (its n).
inline constexpr int kTileTokens = 8;
/// The most tokens one tensor-core launch runs (four tiles).
inline constexpr int kMaxTokens = 32;
/// Values of a row per pipeline stage (a weight chunk); a phase of x holds whole chunks.
inline constexpr int kChunkValues = 256;
/// Bytes of x's staging at up to 16 tokens (hi + lo f16: 4 bytes per value and token).
inline constexpr int kXBytesBase = 16384;

/// The n8 tiles of a kernel of @p ntok tokens (1 up to 8 tokens).
EP_MMA_HD constexpr int tiles(int ntok) { return (ntok + kTileTokens - 1) / kTileTokens; }
/// Bytes of x's staging for @p ntok tokens: kXBytesBase, grown at 32 tokens so that a phase
/// still holds one whole chunk of every token.
EP_MMA_HD constexpr int x_bytes(int ntok) {
  return 4 * ntok * kChunkValues > kXBytesBase ? 4 * ntok * kChunkValues : kXBytesBase;
}
/// Values of x one phase stages per token (a multiple of kChunkValues for every count <= kMaxTokens).
EP_MMA_HD constexpr int phase_values(int ntok) { return x_bytes(ntok) / (4 * ntok); }
/// The kernel's token count for a launch of @p n_tok tokens (1..kMaxTokens): the next of 1, 2, 4,
/// 8, 16 and 32 at or above it (up to 8 the other GEMV families' gemv_tokens_rounded).
EP_MMA_HD constexpr int tokens_rounded(int n_tok) {
  return n_tok <= 1 ? 1 : n_tok == 2 ? 2 : n_tok <= 4 ? 4 : n_tok <= 8 ? 8 : n_tok <= 16 ? 16 : 32;
}

/// How x's units are laid out over a phase's steps, matching the type's A fragments: natural
/// (mxfp4: step q of the phase takes units 4q..4q+3, lane quarter = unit % 4), k-quant (q2_K,
/// q3_K: steps permuted so that lane t sees whole scale groups) or pairs (q8_0, iq2_xxs:
/// mma_pairs.cuh's order).
enum class XOrder : int { natural = 0, kquant = 1, pairs = 2 };

/// The uint4 slot of x's staging that holds unit @p q4 of the phase (its values 4·q4..4·q4+3)
/// of token @p tok, in a kernel of @p ntok tokens.
EP_MMA_HD int x_slot(XOrder order, int q4, int tok, int ntok) {
  const int q = q4 >> 2, r = q4 & 3;  // 16-value group q of the phase, quarter r
  if (order == XOrder::kquant) {
    const int gl = q & 15, sb = q >> 4;
    return ((sb * 16 + 4 * (gl >> 2) + r) * ntok + tok) * 4 + (gl & 3);
  }
  if (order == XOrder::pairs) {
    const int u = q4 & 7, step = 2 * (q4 >> 3) + pair_unit_step(u);  // unit u of block q4 / 8
    return (step * ntok + tok) * 4 + pair_unit_lane(u);
  }
  return (q * ntok + tok) * 4 + r;
}
/// The slot lane 4g + t reads for mma step @p step of the phase and token tile @p j (its
/// token 8j + g), in a kernel of @p ntok tokens.
EP_MMA_HD int x_read_slot(int step, int j, int g, int t, int ntok) {
  return (step * ntok + kTileTokens * j + g) * 4 + t;
}
/// The token of accumulator @p e (0..3: c0..c3) of lane quarter @p t in token tile @p j.
EP_MMA_HD int c_token(int j, int t, int e) { return kTileTokens * j + 2 * t + (e & 1); }

}  // namespace ep::backend::cuda::mma
