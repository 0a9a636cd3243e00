#include "testkit/deepseek_v4_gguf.hpp"

#include "core/error.hpp"
#include "format/gguf_writer.hpp"
#include "testkit/chat_vocab.hpp"
#include "testkit/random_weights.hpp"
#include "tokenizer/gguf_vocab.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace ep::testkit {

using format::GgmlType;
using format::GgufValue;

DeepseekV4SyntheticSpec DeepseekV4SyntheticSpec::flash_shaped(int64_t n_layers) {
  DeepseekV4SyntheticSpec s;
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

DeepseekV4SyntheticSpec DeepseekV4SyntheticSpec::flash_reduced(int64_t n_layers) {
  DeepseekV4SyntheticSpec s = flash_shaped(n_layers);
  s.vocab = 4096;
  s.hidden = 512;
  s.n_heads = 8;
  s.head_dim = 128;
  s.q_lora_rank = 256;
  s.o_groups = 4;
  s.o_lora_rank = 128;
  s.n_experts = 32;
  s.moe_ff = 256;
  s.index_n_heads = 16;
  s.index_head_dim = 64;
  return s;
}

DeepseekV4SyntheticSpec DeepseekV4SyntheticSpec::flash_ds4(int64_t n_layers) {
  DeepseekV4SyntheticSpec s = flash_shaped(n_layers);
  s.layout = DeepseekV4SyntheticLayout::ds4;
  s.expert_gate_up = GgmlType::iq2_xxs;
  s.expert_down = GgmlType::q2_k;
  s.chat_tokenizer = true;
  return s;
}

namespace {

enum class Kind { matrix, norm, small, sinks, scale3, tid2eid, experts, router_bias };

struct TensorSpec {
  std::string name;
  GgmlType type;
  std::vector<uint64_t> ne;
  Kind kind;
  float std = 1.0f;
};

}  // namespace

std::vector<uint32_t> deepseek_v4_synthetic_expert_ranks(const DeepseekV4SyntheticSpec &s, int64_t layer) {
  return expert_ranks(s.seed, static_cast<uint32_t>(s.n_experts), layer);
}

void write_deepseek_v4_synthetic_gguf(const DeepseekV4SyntheticSpec &s, const std::string &path,
                               const std::function<void(uint64_t, uint64_t)> &progress) {
  const int64_t n_layers = static_cast<int64_t>(s.compress_ratios.size());
  if (n_layers <= 0 || s.n_hash_layers > n_layers) fail(Status::invalid_argument, "synthetic DeepSeek-V4: {} layers, {} hash", n_layers, s.n_hash_layers);
  const uint64_t D = static_cast<uint64_t>(s.hidden), V = static_cast<uint64_t>(s.vocab), H = static_cast<uint64_t>(s.n_heads),
                 hd = static_cast<uint64_t>(s.head_dim), R = static_cast<uint64_t>(s.q_lora_rank),
                 G = static_cast<uint64_t>(s.o_groups), O = static_cast<uint64_t>(s.o_lora_rank),
                 E = static_cast<uint64_t>(s.n_experts), K = static_cast<uint64_t>(s.n_experts_used),
                 F = static_cast<uint64_t>(s.moe_ff), IH = static_cast<uint64_t>(s.index_n_heads),
                 I = static_cast<uint64_t>(s.index_head_dim), hc = static_cast<uint64_t>(s.hc_mult), M = (2 + hc) * hc;
  const bool ds4 = s.layout == DeepseekV4SyntheticLayout::ds4;
  const GgmlType dense = ds4 ? GgmlType::q8_0 : s.dense;
  std::vector<TensorSpec> ts;
  auto matrix = [&](const std::string &n, uint64_t ne0, uint64_t ne1, float scale = 1.0f) {
    ts.push_back({n, dense_type(dense, ne0), {ne0, ne1}, Kind::matrix, matrix_std(ne0, scale)});
  };
  auto f32 = [&](const std::string &n, std::vector<uint64_t> ne, Kind k, float std) { ts.push_back({n, GgmlType::f32, std::move(ne), k, std}); };
  // The ds4 layout keeps these in f16: the embedding, the hyper-connection mixers, the
  // compressors, the indexer and the router.
  auto side_matrix = [&](const std::string &n, uint64_t ne0, uint64_t ne1) {
    if (ds4) ts.push_back({n, GgmlType::f16, {ne0, ne1}, Kind::matrix, matrix_std(ne0)});
    else matrix(n, ne0, ne1);
  };
  auto side_params = [&](const std::string &n, std::vector<uint64_t> ne, float std) {
    ts.push_back({n, ds4 ? GgmlType::f16 : GgmlType::f32, std::move(ne), Kind::small, std});
  };
  ts.push_back({"token_embd.weight", ds4 ? GgmlType::f16 : dense_type(dense, D), {D, V}, Kind::matrix, 1.0f});
  for (int64_t il = 0; il < n_layers; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    const uint64_t ratio = static_cast<uint64_t>(s.compress_ratios[static_cast<size_t>(il)]);
    const bool csa = ratio == static_cast<uint64_t>(s.csa_ratio);
    for (const char *site : {"attn", "ffn"}) {
      side_matrix(b + "hc_" + site + "_fn.weight", hc * D, M);
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
      side_matrix(b + "attn_compressor_kv.weight", D, cw * hd);
      side_matrix(b + "attn_compressor_gate.weight", D, cw * hd);
      side_params(b + "attn_compressor_ape.weight", {cw * hd, ratio}, 0.5f);
      f32(b + "attn_compressor_norm.weight", {hd}, Kind::norm, 0.1f);
      if (csa) {
        side_params(b + "indexer.proj.weight", {D, IH}, static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))));
        side_matrix(b + "indexer.attn_q_b.weight", R, IH * I);
        side_matrix(b + "indexer_compressor_kv.weight", D, 2 * I);
        side_matrix(b + "indexer_compressor_gate.weight", D, 2 * I);
        side_params(b + "indexer_compressor_ape.weight", {2 * I, ratio}, 0.5f);
        f32(b + "indexer_compressor_norm.weight", {I}, Kind::norm, 0.1f);
      }
    }
    side_params(b + "ffn_gate_inp.weight", {D, E}, static_cast<float>(2.0 / std::sqrt(static_cast<double>(D))));
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
  side_matrix("output_hc_fn.weight", hc * D, hc);
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
  if (ds4) w.add(a + "vocab_size", u32(s.vocab));
  if (s.chat_tokenizer || ds4) {
    tokenizer::GgufVocab vocab = synthetic_chat_vocab(s.vocab);
    if (ds4) {
      // ds4 looks these up by text (vocab_load): a DSML marker and a merge table, here empty
      // (text is one token per byte either way).
      if (s.vocab <= kDs4DsmlTokenId)
        fail(Status::invalid_argument, "synthetic DeepSeek-V4, ds4 layout: vocabulary of {} ids, at least {} needed", s.vocab,
             kDs4DsmlTokenId + 1);
      vocab.tokens[static_cast<size_t>(kDs4DsmlTokenId)] = "｜DSML｜";
      vocab.token_types[static_cast<size_t>(kDs4DsmlTokenId)] = 4;  // user-defined, like <think>
    }
    tokenizer::add_gguf_vocab_keys(w, vocab);
    if (ds4 && vocab.merges.empty()) w.add("tokenizer.ggml.merges", GgufValue::make_array(format::GgufType::string, {}));
  }
  for (const TensorSpec &t : ts) w.add_tensor(t.name, t.type, t.ne);

  const uint64_t seed = s.seed;
  // router_zipf >= 0: per-layer expert ranks, hash-layer sampling weights.
  std::vector<std::vector<uint32_t>> ranks;
  if (s.router_zipf >= 0)
    for (int64_t il = 0; il < n_layers; ++il) ranks.push_back(deepseek_v4_synthetic_expert_ranks(s, il));
  auto fill_range = [&](size_t ti, uint64_t offset, std::span<uint8_t> out) {
    const TensorSpec &t = ts[ti];
    const auto info = format::require_ggml_type(static_cast<uint32_t>(t.type), t.name);
    uint32_t bb = info.block_bytes;
    if (t.kind == Kind::tid2eid) bb = static_cast<uint32_t>(4 * K);
    fill_blocks(bb, offset, out, [&](uint64_t bi, uint8_t *block) {
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
          std::memcpy(block + 4 * j, &id, 4);
          wt[e] = 0;
        }
      } else if (t.kind == Kind::router_bias) {
        const auto il = static_cast<size_t>(t.std);
        put_f32(block, zipf_router_bias(s.router_zipf, ranks[il][bi % E]));
      } else if (t.kind == Kind::tid2eid) {
        std::vector<int32_t> perm(static_cast<size_t>(E));
        std::iota(perm.begin(), perm.end(), 0);
        for (uint64_t j = 0; j < K; ++j) {
          const uint64_t pick = j + r.next() % (E - j);
          std::swap(perm[j], perm[pick]);
        }
        std::memcpy(block, perm.data(), 4 * K);
      } else if (t.kind == Kind::norm) {
        put_f32(block, static_cast<float>(1.0 + t.std * r.gauss()));
      } else if (t.kind == Kind::scale3) {
        put_f32(block, static_cast<float>(0.5 + r.uniform()));
      } else {
        make_block(t.type, t.std, r, block, bb);
      }
    });
  };
  // The bytes are a pure function of (tensor, position): large chunks are filled by several
  // threads (any split gives the same file), so writing runs near the disk's speed.
  auto fill = [&](size_t ti, uint64_t offset, std::span<uint8_t> out) {
    parallel_fill([&](uint64_t off, std::span<uint8_t> part) { fill_range(ti, off, part); }, offset, out);
  };
  w.write(path, 1, fill, progress ? format::GgufProgress(progress) : format::GgufProgress{});
}

}  // namespace ep::testkit
