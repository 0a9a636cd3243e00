#include "model/deepseek_v4_synthetic.hpp"

#include "backend/dequant.hpp"
#include "core/error.hpp"
#include "format/gguf_writer.hpp"
#include "tokenizer/gguf_vocab.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>
#include <thread>

namespace ep::model {

using format::GgmlType;
using format::GgufValue;

Dsv4SyntheticSpec Dsv4SyntheticSpec::flash_shaped(int64_t n_layers) {
  Dsv4SyntheticSpec s;
  s.vocab = 129280;
  s.hidden = 4096;
  s.n_heads = 64;
  s.head_dim = 512;
  s.rope_dim = 64;
  s.q_lora_rank = 1024;
  s.o_groups = 8;
  s.o_lora_rank = 1024;
  s.n_experts = 256;
  s.n_experts_used = 6;
  s.moe_ff = 2048;
  s.n_hash_layers = std::min<int64_t>(3, n_layers);
  s.index_n_heads = 64;
  s.index_head_dim = 128;
  s.index_topk = 512;
  s.sliding_window = 128;
  s.compress_ratios.clear();
  for (int64_t il = 0; il < n_layers; ++il) s.compress_ratios.push_back(il < 2 ? 0 : (il % 2 == 0 ? 4 : 128));
  s.dense = GgmlType::q8_0;
  return s;
}

namespace {

uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Deterministic randomness keyed by (seed, tensor, index).
struct Rand {
  uint64_t state;
  Rand(uint64_t seed, uint64_t tensor, uint64_t index) : state(mix64(seed ^ mix64(tensor * 0x100000001B3ull ^ mix64(index)))) {}
  uint64_t next() { return state = mix64(state); }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double gauss() {
    const double u1 = std::max(uniform(), 1e-300), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

enum class Kind { matrix, norm, small, sinks, scale3, tid2eid, experts, router_bias };

struct TensorSpec {
  std::string name;
  GgmlType type;
  std::vector<uint64_t> ne;
  Kind kind;
  float std = 1.0f;
};

void put_f16(uint8_t *p, float v) {
  const uint16_t h = backend::fp32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

/// One block (or one element for plain types) of a random tensor with values of about @p std.
void make_block(GgmlType type, float std, Rand &r, uint8_t *out, uint32_t block_bytes) {
  switch (type) {
    case GgmlType::f32: {
      const float v = static_cast<float>(r.gauss() * std);
      std::memcpy(out, &v, 4);
      return;
    }
    case GgmlType::f16: put_f16(out, static_cast<float>(r.gauss() * std)); return;
    case GgmlType::bf16: {
      const uint16_t h = backend::fp32_to_bf16(static_cast<float>(r.gauss() * std));
      std::memcpy(out, &h, 2);
      return;
    }
    default: break;
  }
  for (uint32_t i = 0; i < block_bytes; ++i) out[i] = static_cast<uint8_t>(r.next());
  const double jitter = 0.75 + 0.5 * r.uniform();
  switch (type) {
    case GgmlType::q8_0: put_f16(out, static_cast<float>(std / 73.0 * jitter)); return;
    case GgmlType::mxfp4: {
      const int e = 128 + static_cast<int>(std::lround(std::log2(std / 4.4 * jitter)));
      out[0] = static_cast<uint8_t>(std::clamp(e, 2, 254));
      return;
    }
    case GgmlType::q2_k:
      put_f16(out + 80, static_cast<float>(std / 20.0 * jitter));
      put_f16(out + 82, static_cast<float>(std / 20.0 * jitter));
      return;
    case GgmlType::q3_k: put_f16(out + 108, static_cast<float>(std / 60.0 * jitter)); return;
    case GgmlType::q4_k:
    case GgmlType::q5_k:
      put_f16(out, static_cast<float>(std / 300.0 * jitter));
      put_f16(out + 2, static_cast<float>(std / 300.0 * jitter));
      return;
    case GgmlType::q6_k: put_f16(out + 208, static_cast<float>(std / 600.0 * jitter)); return;
    case GgmlType::iq2_xxs: put_f16(out, static_cast<float>(std / 40.0 * jitter)); return;
    default: fail(Status::unsupported, "synthetic DeepSeek-V4: cannot make random {} blocks", static_cast<uint32_t>(type));
  }
}

}  // namespace

std::vector<uint32_t> dsv4_synthetic_expert_ranks(const Dsv4SyntheticSpec &s, int64_t layer) {
  const auto E = static_cast<uint32_t>(s.n_experts);
  std::vector<uint32_t> order(E);
  std::iota(order.begin(), order.end(), 0u);
  Rand r(s.seed, 0x5A1Full, static_cast<uint64_t>(layer));
  for (uint32_t i = E; i > 1; --i) std::swap(order[i - 1], order[static_cast<uint32_t>(r.next() % i)]);
  std::vector<uint32_t> rank(E);
  for (uint32_t i = 0; i < E; ++i) rank[order[i]] = i;
  return rank;
}

void write_dsv4_synthetic_gguf(const Dsv4SyntheticSpec &s, const std::string &path,
                               const std::function<void(uint64_t, uint64_t)> &progress) {
  const int64_t n_layers = static_cast<int64_t>(s.compress_ratios.size());
  if (n_layers <= 0 || s.n_hash_layers > n_layers) fail(Status::invalid_argument, "synthetic DeepSeek-V4: {} layers, {} hash", n_layers, s.n_hash_layers);
  const uint64_t D = static_cast<uint64_t>(s.hidden), V = static_cast<uint64_t>(s.vocab), H = static_cast<uint64_t>(s.n_heads),
                 hd = static_cast<uint64_t>(s.head_dim), R = static_cast<uint64_t>(s.q_lora_rank),
                 G = static_cast<uint64_t>(s.o_groups), O = static_cast<uint64_t>(s.o_lora_rank),
                 E = static_cast<uint64_t>(s.n_experts), K = static_cast<uint64_t>(s.n_experts_used),
                 F = static_cast<uint64_t>(s.moe_ff), IH = static_cast<uint64_t>(s.index_n_heads),
                 I = static_cast<uint64_t>(s.index_head_dim), hc = static_cast<uint64_t>(s.hc_mult), M = (2 + hc) * hc;
  std::vector<TensorSpec> ts;
  auto dense_type = [&](uint64_t ne0) {
    const auto info = format::ggml_type_info(static_cast<uint32_t>(s.dense));
    return (info && ne0 % info->block_elems == 0) ? s.dense : GgmlType::f16;
  };
  auto matrix = [&](const std::string &n, uint64_t ne0, uint64_t ne1, float scale = 1.0f) {
    ts.push_back({n, dense_type(ne0), {ne0, ne1}, Kind::matrix, static_cast<float>(scale / std::sqrt(static_cast<double>(ne0)))});
  };
  auto f32 = [&](const std::string &n, std::vector<uint64_t> ne, Kind k, float std) { ts.push_back({n, GgmlType::f32, std::move(ne), k, std}); };
  ts.push_back({"token_embd.weight", dense_type(D), {D, V}, Kind::matrix, 1.0f});
  for (int64_t il = 0; il < n_layers; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    const uint64_t ratio = static_cast<uint64_t>(s.compress_ratios[static_cast<size_t>(il)]);
    const bool csa = ratio == static_cast<uint64_t>(s.csa_ratio);
    for (const char *site : {"attn", "ffn"}) {
      matrix(b + "hc_" + site + "_fn.weight", hc * D, M);
      f32(b + "hc_" + site + "_base.weight", {M}, Kind::small, 0.5f);
      f32(b + "hc_" + site + "_scale.weight", {3}, Kind::scale3, 0.0f);
    }
    f32(b + "attn_norm.weight", {D}, Kind::norm, 0.1f);
    f32(b + "ffn_norm.weight", {D}, Kind::norm, 0.1f);
    matrix(b + "attn_q_a.weight", D, R);
    f32(b + "attn_q_a_norm.weight", {R}, Kind::norm, 0.1f);
    matrix(b + "attn_q_b.weight", R, H * hd);
    matrix(b + "attn_kv.weight", D, hd);
    f32(b + "attn_kv_a_norm.weight", {hd}, Kind::norm, 0.1f);
    matrix(b + "attn_output_a.weight", H * hd / G, G * O);
    matrix(b + "attn_output_b.weight", G * O, D);
    f32(b + "attn_sinks.weight", {H}, Kind::sinks, 1.0f);
    if (ratio) {
      const uint64_t cw = csa ? 2 : 1;
      matrix(b + "attn_compressor_kv.weight", D, cw * hd);
      matrix(b + "attn_compressor_gate.weight", D, cw * hd);
      f32(b + "attn_compressor_ape.weight", {cw * hd, ratio}, Kind::small, 0.5f);
      f32(b + "attn_compressor_norm.weight", {hd}, Kind::norm, 0.1f);
      if (csa) {
        f32(b + "indexer.proj.weight", {D, IH}, Kind::small, static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))));
        matrix(b + "indexer.attn_q_b.weight", R, IH * I);
        matrix(b + "indexer_compressor_kv.weight", D, 2 * I);
        matrix(b + "indexer_compressor_gate.weight", D, 2 * I);
        f32(b + "indexer_compressor_ape.weight", {2 * I, ratio}, Kind::small, 0.5f);
        f32(b + "indexer_compressor_norm.weight", {I}, Kind::norm, 0.1f);
      }
    }
    f32(b + "ffn_gate_inp.weight", {D, E}, Kind::small, static_cast<float>(2.0 / std::sqrt(static_cast<double>(D))));
    if (il < s.n_hash_layers)
      ts.push_back({b + "ffn_gate_tid2eid.weight", GgmlType::i32, {K, V}, Kind::tid2eid, 0.0f});
    else if (s.router_zipf >= 0)
      f32(b + "exp_probs_b.bias", {E}, Kind::router_bias, static_cast<float>(il));  // std carries the layer
    else
      f32(b + "exp_probs_b.bias", {E}, Kind::small, 0.3f);
    ts.push_back({b + "ffn_gate_exps.weight", s.expert_gate_up, {D, F, E}, Kind::experts, static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)))});
    ts.push_back({b + "ffn_up_exps.weight", s.expert_gate_up, {D, F, E}, Kind::experts, static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)))});
    ts.push_back({b + "ffn_down_exps.weight", s.expert_down, {F, D, E}, Kind::experts, static_cast<float>(1.0 / std::sqrt(static_cast<double>(F)))});
    matrix(b + "ffn_gate_shexp.weight", D, F, 1.5f);
    matrix(b + "ffn_up_shexp.weight", D, F, 1.5f);
    matrix(b + "ffn_down_shexp.weight", F, D);
  }
  matrix("output_hc_fn.weight", hc * D, hc);
  f32("output_hc_base.weight", {hc}, Kind::small, 0.5f);
  f32("output_hc_scale.weight", {1}, Kind::scale3, 0.0f);
  f32("output_norm.weight", {D}, Kind::norm, 0.1f);
  matrix("output.weight", D, V);

  format::GgufWriter w;
  const std::string a = "deepseek4.";
  auto u32 = [](int64_t v) { return GgufValue::make_u32(static_cast<uint32_t>(v)); };
  std::vector<GgufValue> ratios, clamp;
  for (int32_t r : s.compress_ratios) ratios.push_back(GgufValue::make_i32(r));
  for (int64_t il = 0; il < n_layers; ++il) clamp.push_back(GgufValue::make_f32(s.swiglu_limit));
  w.add("general.architecture", GgufValue::make_string("deepseek4"));
  w.add("general.name", GgufValue::make_string("expertpack synthetic DeepSeek-V4"));
  w.add(a + "context_length", u32(static_cast<int64_t>(s.yarn_factor * static_cast<float>(s.yarn_original_max_positions))));
  w.add(a + "embedding_length", u32(s.hidden));
  w.add(a + "block_count", u32(n_layers));
  w.add(a + "expert_count", u32(s.n_experts));
  w.add(a + "expert_used_count", u32(s.n_experts_used));
  w.add(a + "attention.head_count", u32(s.n_heads));
  w.add(a + "attention.head_count_kv", u32(1));
  w.add(a + "attention.key_length", u32(s.head_dim));
  w.add(a + "attention.value_length", u32(s.head_dim));
  w.add(a + "rope.dimension_count", u32(s.rope_dim));
  w.add(a + "rope.freq_base", GgufValue::make_f32(s.rope_theta));
  w.add(a + "rope.scaling.type", GgufValue::make_string("yarn"));
  w.add(a + "rope.scaling.factor", GgufValue::make_f32(s.yarn_factor));
  w.add(a + "rope.scaling.original_context_length", u32(s.yarn_original_max_positions));
  w.add(a + "rope.scaling.yarn_beta_fast", GgufValue::make_f32(32.0f));
  w.add(a + "rope.scaling.yarn_beta_slow", GgufValue::make_f32(1.0f));
  w.add(a + "attention.layer_norm_rms_epsilon", GgufValue::make_f32(s.rms_eps));
  w.add(a + "attention.q_lora_rank", u32(s.q_lora_rank));
  w.add(a + "attention.sliding_window", u32(s.sliding_window));
  w.add(a + "expert_feed_forward_length", u32(s.moe_ff));
  w.add(a + "expert_shared_count", u32(1));
  w.add(a + "expert_weights_scale", GgufValue::make_f32(s.routed_scale));
  w.add(a + "expert_weights_norm", GgufValue::make_bool(true));
  w.add(a + "swiglu_clamp_exp", GgufValue::make_array(format::GgufType::f32, clamp));
  w.add(a + "swiglu_clamp_shexp", GgufValue::make_array(format::GgufType::f32, clamp));
  w.add(a + "attention.indexer.head_count", u32(s.index_n_heads));
  w.add(a + "attention.indexer.key_length", u32(s.index_head_dim));
  w.add(a + "attention.indexer.top_k", u32(s.index_topk));
  w.add(a + "attention.output_group_count", u32(s.o_groups));
  w.add(a + "attention.output_lora_rank", u32(s.o_lora_rank));
  w.add(a + "attention.compress_rope_freq_base", GgufValue::make_f32(s.compress_rope_theta));
  w.add(a + "attention.compress_ratios", GgufValue::make_array(format::GgufType::i32, ratios));
  w.add(a + "hyper_connection.count", u32(s.hc_mult));
  w.add(a + "hyper_connection.sinkhorn_iterations", u32(s.hc_sinkhorn_iters));
  w.add(a + "hyper_connection.epsilon", GgufValue::make_f32(s.hc_eps));
  w.add(a + "hash_layer_count", u32(s.n_hash_layers));
  w.add(a + "expert_gating_func", u32(4));
  if (s.chat_tokenizer) tokenizer::add_gguf_vocab_keys(w, tokenizer::synthetic_chat_vocab(s.vocab));
  for (const TensorSpec &t : ts) w.add_tensor(t.name, t.type, t.ne);

  const uint64_t seed = s.seed;
  // router_zipf >= 0: per-layer expert ranks, hash-layer sampling weights.
  std::vector<std::vector<uint32_t>> ranks;
  if (s.router_zipf >= 0)
    for (int64_t il = 0; il < n_layers; ++il) ranks.push_back(dsv4_synthetic_expert_ranks(s, il));
  auto fill_range = [&](size_t ti, uint64_t offset, std::span<uint8_t> out) {
    const TensorSpec &t = ts[ti];
    const auto info = format::require_ggml_type(static_cast<uint32_t>(t.type), t.name);
    uint32_t bb = info.block_bytes;
    if (t.kind == Kind::tid2eid) bb = static_cast<uint32_t>(4 * K);
    std::vector<uint8_t> block(bb);
    uint64_t pos = offset;
    size_t done = 0;
    while (done < out.size()) {
      const uint64_t bi = pos / bb, within = pos % bb;
      Rand r(seed, ti, bi);
      if (t.kind == Kind::tid2eid && s.router_zipf >= 0) {
        // blk.<il>.ffn_gate_tid2eid: K distinct experts, weight 1 / (1 + rank)^S each.
        const auto il = static_cast<size_t>(std::stoul(t.name.substr(4)));
        std::vector<double> wt(static_cast<size_t>(E));
        for (uint64_t e = 0; e < E; ++e) wt[e] = std::pow(1.0 + ranks[il][e], -s.router_zipf);
        for (uint64_t j = 0; j < K; ++j) {
          double total = 0;
          for (double x : wt) total += x;
          double u = r.uniform() * total;
          uint64_t e = 0;
          while (e + 1 < E && (wt[e] == 0 || u >= wt[e])) {
            u -= wt[e];
            ++e;
          }
          while (wt[e] == 0) e = (e + 1) % E;  // rounding at the end of the range
          const auto id = static_cast<int32_t>(e);
          std::memcpy(block.data() + 4 * j, &id, 4);
          wt[e] = 0;
        }
      } else if (t.kind == Kind::router_bias) {
        const auto il = static_cast<size_t>(t.std);
        const uint64_t e = bi % E;
        const float v = static_cast<float>(-s.router_zipf * Dsv4SyntheticSpec::kRouterZipfBiasScale *
                                           std::log(1.0 + static_cast<double>(ranks[il][e])));
        std::memcpy(block.data(), &v, 4);
      } else if (t.kind == Kind::tid2eid) {
        std::vector<int32_t> perm(static_cast<size_t>(E));
        std::iota(perm.begin(), perm.end(), 0);
        for (uint64_t j = 0; j < K; ++j) {
          const uint64_t pick = j + r.next() % (E - j);
          std::swap(perm[j], perm[pick]);
        }
        std::memcpy(block.data(), perm.data(), 4 * K);
      } else if (t.kind == Kind::norm) {
        const float v = static_cast<float>(1.0 + t.std * r.gauss());
        std::memcpy(block.data(), &v, 4);
      } else if (t.kind == Kind::scale3) {
        const float v = static_cast<float>(0.5 + r.uniform());
        std::memcpy(block.data(), &v, 4);
      } else {
        make_block(t.type, t.std, r, block.data(), bb);
      }
      const size_t n = static_cast<size_t>(std::min<uint64_t>(bb - within, out.size() - done));
      std::memcpy(out.data() + done, block.data() + within, n);
      done += n;
      pos += n;
    }
  };
  // The bytes are a pure function of (tensor, position): large chunks are filled by several
  // threads (any split gives the same file), so writing runs near the disk's speed.
  const unsigned n_threads = std::clamp(std::thread::hardware_concurrency(), 1u, 32u);
  auto fill = [&](size_t ti, uint64_t offset, std::span<uint8_t> out) {
    constexpr size_t kMinPart = 256u << 10;
    const size_t parts = std::min<size_t>(n_threads, out.size() / kMinPart);
    if (parts <= 1) return fill_range(ti, offset, out);
    const size_t step = (out.size() + parts - 1) / parts;
    std::vector<std::thread> pool;
    std::exception_ptr error;
    std::mutex error_mutex;
    for (size_t p = 0; p < parts; ++p) {
      const size_t lo = p * step, hi = std::min(out.size(), lo + step);
      if (lo >= hi) break;
      pool.emplace_back([&, lo, hi] {
        try {
          fill_range(ti, offset + lo, out.subspan(lo, hi - lo));
        } catch (...) {
          const std::lock_guard<std::mutex> lock(error_mutex);
          if (!error) error = std::current_exception();
        }
      });
    }
    for (auto &th : pool) th.join();
    if (error) std::rethrow_exception(error);
  };
  w.write(path, 1, fill, progress ? format::GgufProgress(progress) : format::GgufProgress{});
}

}  // namespace ep::model
