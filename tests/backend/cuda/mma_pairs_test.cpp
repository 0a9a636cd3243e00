// The tensor-core GEMV's q8_0 and iq2_xxs decoders (cuda/mma_pairs.cuh) on a CPU, against the CPU
// backend's dequantization (bit-exact with ggml): every value a lane places in its A registers, at
// the block value pair_value names, times the f32 scale the kernel applies to the block's mma sums
// (q8_0: d; iq2_xxs: d/8) is the dequantized value bit for bit, for random blocks with any finite
// f16 d and for every iq2_xxs (grid entry, sign pattern, scale); x's staging (pair_unit_step,
// pair_unit_lane) meets every A value at its k; the host's f16 emulation rounds as f16 does; and
// the token side (mma_tiles.cuh) at 1..32 tokens: x's staging fills each slot of a phase once,
// and the slot a lane reads for a token tile holds that tile's token at the lane's k.
#include "backend/cuda/mma_pairs.cuh"
#include "backend/cuda/mma_tiles.cuh"

#include "backend/dequant.hpp"
#include "backend/iq2xxs_table.hpp"
#include "format/ggml_type.hpp"
#include "support/catch.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace {

namespace mma = ep::backend::cuda::mma;
using ep::format::GgmlType;

uint32_t word_at(const uint8_t *p) {
  uint32_t w = 0;
  std::memcpy(&w, p, 4);
  return w;
}

// Random f16 bits of a finite value (any sign, zero and subnormals included).
uint16_t finite_f16(std::mt19937 &rng) {
  for (;;) {
    const auto h = static_cast<uint16_t>(rng());
    if (((h >> 10) & 31) != 31) return h;
  }
}

float half_of(uint32_t a, int h) { return static_cast<float>(mma::host::f16_value(h == 0 ? a & 0xFFFFu : a >> 16)); }

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Every A value of a q8_0 block's four lanes times d against the CPU's 32 values; returns how
// many were checked.
int check_q8_0_block(const uint8_t (&blk)[34]) {
  float want[32];
  ep::backend::dequantize_row(GgmlType::q8_0, blk, want, 32);
  const float d = static_cast<float>(mma::host::f16_value(blk[0] | (uint32_t{blk[1]} << 8)));
  int checked = 0;
  for (int t = 0; t < 4; ++t) {
    const uint32_t w[2] = {word_at(blk + 2 + 8 * t), word_at(blk + 6 + 8 * t)};
    uint32_t a[4];
    mma::q8_0_lane(w, a);
    for (int i = 0; i < 4; ++i) {
      for (int h = 0; h < 2; ++h) {
        const int v = mma::pair_value(t, i, h);
        const float q = half_of(a[i], h);
        if (q != static_cast<float>(static_cast<int8_t>(blk[2 + v])) || !same_bits(q * d, want[v]))
          FAIL("lane " << t << " register " << i << " half " << h << " (value " << v << "): " << q << " * " << d
                       << " != " << want[v]);
        ++checked;
      }
    }
  }
  return checked;
}

// Every A value of an iq2_xxs block's eight sub-blocks and four lanes times d/8 against the CPU's
// 256 values; returns the largest |integer| placed.
int check_iq2xxs_block(const uint8_t (&blk)[66], const mma::GridF16 (&table)[256]) {
  float want[256];
  ep::backend::dequantize_row(GgmlType::iq2_xxs, blk, want, 256);
  const float d8 = static_cast<float>(mma::host::f16_value(blk[0] | (uint32_t{blk[1]} << 8))) * 0.125f;
  int largest = 0;
  for (int sb = 0; sb < 8; ++sb) {
    const uint32_t idx = word_at(blk + 2 + 8 * sb), aux = word_at(blk + 6 + 8 * sb);
    for (int t = 0; t < 4; ++t) {
      uint32_t a[4];
      mma::iq2xxs_lane(idx, aux, t, table, a);
      for (int i = 0; i < 4; ++i) {
        for (int h = 0; h < 2; ++h) {
          const int v = 32 * sb + mma::pair_value(t, i, h);
          const float q = half_of(a[i], h);
          if (q != std::round(q) || !same_bits(q * d8, want[v]))
            FAIL("sub-block " << sb << " lane " << t << " register " << i << " half " << h << " (value " << v << "): " << q
                              << " * " << d8 << " != " << want[v]);
          largest = std::max(largest, static_cast<int>(std::fabs(q)));
        }
      }
    }
  }
  return largest;
}

struct Table {
  mma::GridF16 e[256];
  Table() {
    for (int i = 0; i < 256; ++i) e[i] = mma::iq2xxs_table_entry(ep::backend::kIq2xxsGrid[i]);
  }
};

}  // namespace

TEST_CASE("mma pairs: x's staging puts every value of a block at the k of its A value", "[gemv][mma]") {
  int seen[32] = {};
  for (int t = 0; t < 4; ++t)
    for (int i = 0; i < 4; ++i)
      for (int h = 0; h < 2; ++h) ++seen[mma::pair_value(t, i, h)];
  for (int v = 0; v < 32; ++v) {
    INFO("value " << v);
    CHECK(seen[v] == 1);  // the four lanes' A registers hold each value of the block once
  }
  // unit u's value 4u + j: lane pair_unit_lane(u), step pair_unit_step(u), B register j % 2 (b0:
  // values 4u, 4u+2; b1: 4u+1, 4u+3: k 2t + h and 2t + 8 + h), half j / 2; the A value at that
  // k is the one in register 2·step + j % 2, half j / 2
  for (int u = 0; u < 8; ++u) {
    for (int j = 0; j < 4; ++j) {
      INFO("unit " << u << " value " << j);
      CHECK(mma::pair_value(mma::pair_unit_lane(u), 2 * mma::pair_unit_step(u) + (j & 1), j >> 1) == 4 * u + j);
    }
  }
}

TEST_CASE("mma pairs: a q8_0 lane's A values times d are the CPU's values", "[gemv][mma]") {
  std::mt19937 rng(51);
  uint8_t blk[34];
  int checked = 0;
  for (int b = 0; b < 256; ++b) {  // every int8 value, in every byte position
    const uint16_t d = finite_f16(rng);
    blk[0] = static_cast<uint8_t>(d);
    blk[1] = static_cast<uint8_t>(d >> 8);
    for (int v = 0; v < 32; ++v) blk[2 + v] = static_cast<uint8_t>(b + 37 * v);
    checked += check_q8_0_block(blk);
  }
  for (int rep = 0; rep < 20000; ++rep) {
    for (auto &x : blk) x = static_cast<uint8_t>(rng());
    const uint16_t d = finite_f16(rng);
    blk[0] = static_cast<uint8_t>(d);
    blk[1] = static_cast<uint8_t>(d >> 8);
    checked += check_q8_0_block(blk);
  }
  CHECK(checked == (256 + 20000) * 32);  // every value of every block
}

TEST_CASE("mma pairs: an iq2_xxs lane's A values times d/8 are the CPU's values", "[gemv][mma][iq2xxs]") {
  const Table table;
  std::mt19937 rng(52);
  uint8_t blk[66];
  auto set_d = [&] {
    const uint16_t d = finite_f16(rng);
    blk[0] = static_cast<uint8_t>(d);
    blk[1] = static_cast<uint8_t>(d >> 8);
  };
  int largest = 0;
  // every (grid entry, sign pattern) pair once (entry e in lane e % 4), the scales in turn: 256 · 128
  // pairs, 32 per block (four per sub-block); then random blocks
  int pair = 0;
  while (pair < 256 * 128) {
    set_d();
    for (int sb = 0; sb < 8; ++sb) {
      uint32_t idx = 0, aux = static_cast<uint32_t>((pair / 32 + sb) % 16) << 28;
      for (int l = 0; l < 4; ++l, ++pair) {
        idx |= static_cast<uint32_t>(pair % 256) << (8 * l);
        aux |= static_cast<uint32_t>((pair / 256 + 37 * l) % 128) << (7 * l);
      }
      std::memcpy(blk + 2 + 8 * sb, &idx, 4);
      std::memcpy(blk + 6 + 8 * sb, &aux, 4);
    }
    largest = std::max(largest, check_iq2xxs_block(blk, table.e));
  }
  for (int rep = 0; rep < 5000; ++rep) {
    for (auto &x : blk) x = static_cast<uint8_t>(rng());
    set_d();
    largest = std::max(largest, check_iq2xxs_block(blk, table.e));
  }
  CHECK(largest == 31 * 43);  // the largest (2s + 1)·grid was placed, exactly
}

TEST_CASE("mma pairs: the host's f16 emulation rounds to nearest even", "[gemv][mma]") {
  int checked = 0;
  for (uint32_t h = 0; h < 0x7C00u; ++h) {  // every finite non-negative f16 and the midpoint above it
    const double v = mma::host::f16_value(h);
    REQUIRE(mma::host::f16_round(v) == h);
    REQUIRE(mma::host::f16_round(-v) == (h | 0x8000u));
    const double up = mma::host::f16_value(h + 1), mid = (v + up) / 2;  // h + 1 = 0x7C00: infinity
    if (h + 1 < 0x7C00u) {
      REQUIRE(mma::host::f16_round(mid) == ((h & 1u) != 0 ? h + 1 : h));  // ties to even
      REQUIRE(mma::host::f16_round(std::nextafter(mid, 0.0)) == h);
      REQUIRE(mma::host::f16_round(std::nextafter(mid, up)) == h + 1);
    }
    ++checked;
  }
  CHECK(mma::host::f16_round(65519.99) == 0x7BFFu);
  CHECK(mma::host::f16_round(65520.0) == 0x7C00u);
  CHECK(mma::hsub2(0x64806480u, 0x64806480u) == 0u);  // 1152 − 1152 = +0
  CHECK(mma::hmul2(0x3C003C00u, 0xC000C000u) == 0xC000C000u);  // 1 · −2
  CHECK(checked == 0x7C00);
}

TEST_CASE("mma tiles: token counts, phases, and x's staging for 1..32 tokens and every k order", "[gemv][mma]") {
  for (int n = 1; n <= mma::kMaxTokens; ++n) {
    const int r = mma::tokens_rounded(n);
    INFO("tokens " << n << " kernel " << r);
    CHECK(r >= n);
    CHECK((r == 1 || r == 2 || r == 4 || r == 8 || r == 16 || r == 32));
    CHECK((n <= 8) == (r <= 8));                              // 1..8: the other families' counts
    if (r > 1) CHECK(mma::tokens_rounded(r / 2 + 1) == r);  // the next count at or above
  }
  const mma::XOrder orders[3] = {mma::XOrder::natural, mma::XOrder::kquant, mma::XOrder::pairs};
  for (int ntok : {1, 2, 4, 8, 16, 32}) {
    const int pv = mma::phase_values(ntok), slots = mma::x_bytes(ntok) / 16, nt = mma::tiles(ntok);
    INFO("kernel tokens " << ntok << " phase values " << pv);
    CHECK(pv % mma::kChunkValues == 0);  // whole chunks per phase (a chunk never spans two)
    CHECK(pv / 4 * ntok <= slots);       // the phase's units of every token fit the staging
    CHECK(nt * mma::kTileTokens >= ntok);
    CHECK((nt - 1) * mma::kTileTokens < ntok);
    CHECK(4 * nt * 32 * 16 <= mma::x_bytes(ntok));  // four warps' partial sums per tile (the k split)
    for (mma::XOrder order : orders) {
      INFO("order " << static_cast<int>(order));
      // who wrote each slot: (unit, token), each slot at most once
      std::vector<int> unit_of(static_cast<size_t>(slots), -1), tok_of(static_cast<size_t>(slots), -1);
      bool once = true, inside = true;
      for (int tok = 0; tok < ntok; ++tok) {
        for (int q4 = 0; q4 < pv / 4; ++q4) {
          const int at = mma::x_slot(order, q4, tok, ntok);
          if (at < 0 || at >= slots) {
            inside = false;
            continue;
          }
          if (unit_of[static_cast<size_t>(at)] != -1) once = false;
          unit_of[static_cast<size_t>(at)] = q4;
          tok_of[static_cast<size_t>(at)] = tok;
        }
      }
      CHECK(inside);
      CHECK(once);
      // every (step, tile, g, t) a live token reads was written for that token; natural and pairs
      // also at the lane's k (k-quant: steps permuted by scale group, checked by the GPU tests)
      bool right_token = true, right_unit = true;
      for (int step = 0; step < pv / 16; ++step) {
        for (int j = 0; j < nt; ++j) {
          for (int g = 0; g < 8; ++g) {
            const int tok = mma::kTileTokens * j + g;
            if (tok >= ntok) continue;
            for (int t = 0; t < 4; ++t) {
              const int at = mma::x_read_slot(step, j, g, t, ntok);
              if (at < 0 || at >= slots || tok_of[static_cast<size_t>(at)] != tok) {
                right_token = false;
                continue;
              }
              const int u = unit_of[static_cast<size_t>(at)];
              if (order == mma::XOrder::natural && u != 4 * step + t) right_unit = false;
              if (order == mma::XOrder::pairs &&
                  (u / 8 != step / 2 || mma::pair_unit_step(u % 8) != step % 2 || mma::pair_unit_lane(u % 8) != t))
                right_unit = false;
            }
          }
        }
      }
      CHECK(right_token);
      CHECK(right_unit);
    }
    // the outputs: each token of the kernel held by one (tile, lane quarter, accumulator) per row pair
    std::vector<int> held(static_cast<size_t>(nt * mma::kTileTokens), 0);
    for (int j = 0; j < nt; ++j)
      for (int t = 0; t < 4; ++t)
        for (int e = 0; e < 4; ++e) ++held[static_cast<size_t>(mma::c_token(j, t, e))];
    bool each_once = true;
    for (int tok = 0; tok < nt * mma::kTileTokens; ++tok) each_once = each_once && held[static_cast<size_t>(tok)] == 2;
    CHECK(each_once);  // twice: rows g and g + 8 (e / 2)
  }
}
