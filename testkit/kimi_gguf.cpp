#include "testkit/kimi_gguf.hpp"

#include "core/error.hpp"
#include "format/gguf.hpp"
#include "format/gguf_writer.hpp"
#include "testkit/chat_vocab.hpp"
#include "testkit/random_weights.hpp"
#include "tokenizer/gguf_vocab.hpp"

#include <cmath>

namespace ep::testkit {

using format::GgmlType;
using format::GgufValue;

std::vector<bool> kimi_k3_mla_pattern(int64_t n_layers) {
  std::vector<bool> mla(static_cast<size_t>(std::max<int64_t>(n_layers, 0)), false);
  for (int64_t il = 0; il < n_layers; ++il) mla[static_cast<size_t>(il)] = il % 4 == 3 || il == n_layers - 1;
  return mla;
}

KimiSyntheticSpec KimiSyntheticSpec::tiny(int64_t n_layers) {
  KimiSyntheticSpec s;
  s.mla_layers = kimi_k3_mla_pattern(n_layers);
  s.n_dense_layers = std::min<int64_t>(1, n_layers);
  return s;
}

KimiSyntheticSpec KimiSyntheticSpec::k3_shaped(int64_t n_layers) {
  KimiSyntheticSpec s;
  s.vocab = 163840;
  s.hidden = 7168;
  s.mla_layers = kimi_k3_mla_pattern(n_layers);
  s.n_heads = 96;
  s.q_lora_rank = 1536;
  s.kv_lora_rank = 512;
  s.qk_nope_dim = 128;
  s.qk_rope_dim = 64;
  s.v_head_dim = 128;
  s.kda_heads = 96;
  s.kda_head_dim = 128;
  s.conv_kernel = 4;
  s.n_dense_layers = std::min<int64_t>(1, n_layers);
  s.dense_ff = 33792;
  s.n_experts = 896;
  s.n_experts_used = 16;
  s.moe_ff = 3072;
  s.n_shared_experts = 2;
  s.expert_latent_dim = 3584;
  s.attn_res_block_size = 12;
  s.dense = GgmlType::q8_0;
  return s;
}

KimiSyntheticSpec KimiSyntheticSpec::k3_reduced(int64_t n_layers) {
  KimiSyntheticSpec s = k3_shaped(n_layers);
  s.vocab = 4096;
  s.hidden = 512;
  s.n_heads = 8;
  s.q_lora_rank = 256;
  s.kv_lora_rank = 128;
  s.qk_nope_dim = 64;
  s.qk_rope_dim = 32;
  s.v_head_dim = 64;
  s.kda_heads = 8;
  s.kda_head_dim = 64;
  s.dense_ff = 1024;
  s.n_experts = 64;
  s.moe_ff = 256;
  s.expert_latent_dim = 256;
  return s;
}

namespace {

enum class Kind { matrix, norm, small, negative, experts, router_bias };

struct TensorSpec {
  std::string name;
  GgmlType type;
  std::vector<uint64_t> ne;
  Kind kind;
  float std = 1.0f;
  int64_t layer = -1;  ///< router_bias: the layer whose expert ranks shape it
};

uint64_t type_bytes(GgmlType t, uint64_t elems, const std::string &what) {
  const auto info = format::require_ggml_type(static_cast<uint32_t>(t), what);
  if (elems % info.block_elems != 0)
    fail(Status::invalid_argument, "synthetic Kimi: {}: {} elements are not whole {} blocks of {}", what, elems, info.name,
         info.block_elems);
  return elems / info.block_elems * info.block_bytes;
}

std::vector<TensorSpec> tensor_specs(const KimiSyntheticSpec &s) {
  const uint64_t D = static_cast<uint64_t>(s.hidden), V = static_cast<uint64_t>(s.vocab), H = static_cast<uint64_t>(s.n_heads),
                 R = static_cast<uint64_t>(s.q_lora_rank), KVL = static_cast<uint64_t>(s.kv_lora_rank),
                 NOPE = static_cast<uint64_t>(s.qk_nope_dim), ROPE = static_cast<uint64_t>(s.qk_rope_dim),
                 VH = static_cast<uint64_t>(s.v_head_dim), KH = static_cast<uint64_t>(s.kda_heads),
                 dk = static_cast<uint64_t>(s.kda_head_dim), Di = KH * dk, CK = static_cast<uint64_t>(s.conv_kernel),
                 E = static_cast<uint64_t>(s.n_experts), F = static_cast<uint64_t>(s.moe_ff),
                 FS = F * static_cast<uint64_t>(s.n_shared_experts), LAT = static_cast<uint64_t>(s.latent()),
                 NFF = static_cast<uint64_t>(s.dense_ff);
  std::vector<TensorSpec> ts;
  auto matrix = [&](const std::string &n, uint64_t ne0, uint64_t ne1, float scale = 1.0f) {
    ts.push_back({n, dense_type(s.dense, ne0), {ne0, ne1}, Kind::matrix, matrix_std(ne0, scale)});
  };
  auto f32 = [&](const std::string &n, std::vector<uint64_t> ne, Kind k, float std) {
    ts.push_back({n, GgmlType::f32, std::move(ne), k, std});
  };
  const float unit = matrix_std(D);
  ts.push_back({"token_embd.weight", dense_type(s.dense, D), {D, V}, Kind::matrix, 1.0f});
  for (int64_t il = 0; il < s.n_layers(); ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    f32(b + "attn_norm.weight", {D}, Kind::norm, 0.1f);
    f32(b + "ffn_norm.weight", {D}, Kind::norm, 0.1f);
    if (s.k3 && s.attn_res_block_size > 0) {
      f32(b + "attn_res_score.weight", {D}, Kind::small, unit);
      f32(b + "ffn_res_score.weight", {D}, Kind::small, unit);
    }
    if (!s.mla_layers[static_cast<size_t>(il)]) {
      matrix(b + "attn_q.weight", D, Di);
      matrix(b + "attn_k.weight", D, Di);
      matrix(b + "attn_v.weight", D, Di);
      for (const char *x : {"q", "k", "v"}) f32(b + "ssm_conv1d_" + x + ".weight", {CK, 1, Di}, Kind::small, 0.5f);
      matrix(b + "ssm_f_a.weight", D, dk);
      matrix(b + "ssm_f_b.weight", dk, Di);
      f32(b + "ssm_dt.bias", {Di}, Kind::small, 0.5f);
      f32(b + "ssm_a", {KH}, Kind::negative, 0.0f);
      matrix(b + "ssm_beta.weight", D, KH);
      if (s.k3) {
        matrix(b + "ssm_g.weight", D, Di);
      } else {
        matrix(b + "ssm_g_a.weight", D, dk);
        matrix(b + "ssm_g_b.weight", dk, Di);
      }
      f32(b + "ssm_norm.weight", {dk}, Kind::norm, 0.1f);
      matrix(b + "attn_output.weight", Di, D);
    } else {
      if (R > 0) {
        matrix(b + "attn_q_a.weight", D, R);
        f32(b + "attn_q_a_norm.weight", {R}, Kind::norm, 0.1f);
        matrix(b + "attn_q_b.weight", R, H * (NOPE + ROPE));
      } else {
        matrix(b + "attn_q.weight", D, H * (NOPE + ROPE));
      }
      matrix(b + "attn_kv_a_mqa.weight", D, KVL + ROPE);
      f32(b + "attn_kv_a_norm.weight", {KVL}, Kind::norm, 0.1f);
      matrix(b + "attn_kv_b.weight", KVL, H * (NOPE + VH));
      if (s.k3) matrix(b + "attn_gate.weight", D, H * VH);
      matrix(b + "attn_output.weight", H * VH, D);
    }
    if (il < s.n_dense_layers) {
      matrix(b + "ffn_gate.weight", D, NFF, 1.5f);
      matrix(b + "ffn_up.weight", D, NFF, 1.5f);
      matrix(b + "ffn_down.weight", NFF, D);
      continue;
    }
    f32(b + "ffn_gate_inp.weight", {D, E}, Kind::small, 2.0f * unit);
    if (s.router_zipf >= 0)
      ts.push_back({b + "exp_probs_b.bias", GgmlType::f32, {E}, Kind::router_bias, 0.0f, il});
    else
      f32(b + "exp_probs_b.bias", {E}, Kind::small, 0.1f);
    if (s.k3 && s.expert_latent_dim > 0) {
      matrix(b + "ffn_routed_down.weight", D, LAT);
      matrix(b + "ffn_routed_up.weight", LAT, D);
      f32(b + "ffn_routed_norm.weight", {LAT}, Kind::norm, 0.1f);
    }
    const float sg = matrix_std(LAT), sd = matrix_std(F);
    ts.push_back({b + "ffn_gate_exps.weight", s.expert_gate_up, {LAT, F, E}, Kind::experts, sg});
    ts.push_back({b + "ffn_up_exps.weight", s.expert_gate_up, {LAT, F, E}, Kind::experts, sg});
    ts.push_back({b + "ffn_down_exps.weight", s.expert_down, {F, LAT, E}, Kind::experts, sd});
    if (FS > 0) {
      matrix(b + "ffn_gate_shexp.weight", D, FS, 1.5f);
      matrix(b + "ffn_up_shexp.weight", D, FS, 1.5f);
      matrix(b + "ffn_down_shexp.weight", FS, D);
    }
  }
  if (s.k3 && s.attn_res_block_size > 0) f32("output_res_score.weight", {D}, Kind::small, unit);
  f32("output_norm.weight", {D}, Kind::norm, 0.1f);
  matrix("output.weight", D, V);
  return ts;
}

void check_spec(const KimiSyntheticSpec &s) {
  auto pos = [](int64_t v, const char *what) {
    if (v <= 0) fail(Status::invalid_argument, "synthetic Kimi: {} must be positive, not {}", what, v);
  };
  pos(s.n_layers(), "layer count");
  pos(s.vocab, "vocab");
  pos(s.hidden, "hidden");
  pos(s.n_heads, "heads");
  pos(s.kda_heads, "KDA heads");
  pos(s.kda_head_dim, "KDA head dim");
  pos(s.conv_kernel, "conv kernel");
  pos(s.kv_lora_rank, "kv_lora_rank");
  if (s.n_dense_layers < 0 || s.n_dense_layers > s.n_layers())
    fail(Status::invalid_argument, "synthetic Kimi: {} dense layers of {}", s.n_dense_layers, s.n_layers());
  if (s.n_dense_layers > 0) pos(s.dense_ff, "dense ff");
  if (s.n_dense_layers < s.n_layers()) {
    pos(s.n_experts, "experts");
    pos(s.moe_ff, "expert ff");
    if (s.n_experts_used <= 0 || s.n_experts_used > s.n_experts)
      fail(Status::invalid_argument, "synthetic Kimi: top-{} of {} experts", s.n_experts_used, s.n_experts);
  }
  if (s.k3 && s.kda_heads != s.n_heads)
    fail(Status::invalid_argument, "synthetic Kimi: Kimi-K3 files have as many KDA heads as attention heads ({} != {})", s.kda_heads,
         s.n_heads);
  if (s.chat_tokenizer && s.vocab < kSyntheticChatVocabMin)
    fail(Status::invalid_argument, "synthetic Kimi: a chat tokenizer needs a vocab of at least {}, not {}",
         kSyntheticChatVocabMin, s.vocab);
  if (s.shards < 1) fail(Status::invalid_argument, "synthetic Kimi: {} shards", s.shards);
}

}  // namespace

uint64_t kimi_synthetic_expert_layer_bytes(const KimiSyntheticSpec &s) {
  const auto L = static_cast<uint64_t>(s.latent()), F = static_cast<uint64_t>(s.moe_ff), E = static_cast<uint64_t>(s.n_experts);
  return E * (2 * type_bytes(s.expert_gate_up, L * F, "ffn_gate_exps") + type_bytes(s.expert_down, F * L, "ffn_down_exps"));
}

uint64_t kimi_synthetic_tensor_bytes(const KimiSyntheticSpec &s) {
  uint64_t n = 0;
  for (const TensorSpec &t : tensor_specs(s)) {
    uint64_t elems = 1;
    for (uint64_t v : t.ne) elems *= v;
    n += type_bytes(t.type, elems, t.name);
  }
  return n;
}

std::string write_kimi_synthetic_gguf(const KimiSyntheticSpec &s, const std::string &path,
                                      const std::function<void(uint64_t, uint64_t)> &progress) {
  check_spec(s);
  const std::vector<TensorSpec> ts = tensor_specs(s);
  format::GgufWriter w;
  const std::string a = std::string(s.arch()) + ".";
  auto u32 = [](int64_t v) { return GgufValue::make_u32(static_cast<uint32_t>(v)); };
  std::vector<GgufValue> kv_heads;
  for (bool m : s.mla_layers) kv_heads.push_back(GgufValue::make_i32(m ? 1 : 0));
  w.add("general.architecture", GgufValue::make_string(s.arch()));
  w.add("general.name", GgufValue::make_string(std::string("expertpack synthetic ") + (s.k3 ? "Kimi-K3" : "Kimi-Linear")));
  w.add(a + "context_length", u32(1 << 20));
  w.add(a + "embedding_length", u32(s.hidden));
  w.add(a + "block_count", u32(s.n_layers()));
  w.add(a + "vocab_size", u32(s.vocab));
  w.add(a + "feed_forward_length", u32(s.dense_ff));
  w.add(a + "attention.head_count", u32(s.n_heads));
  w.add(a + "attention.head_count_kv", GgufValue::make_array(format::GgufType::i32, kv_heads));
  w.add(a + "attention.key_length", u32(s.kv_lora_rank + s.qk_rope_dim));
  w.add(a + "attention.value_length", u32(s.kv_lora_rank));
  w.add(a + "attention.layer_norm_rms_epsilon", GgufValue::make_f32(s.rms_eps));
  if (s.q_lora_rank > 0) w.add(a + "attention.q_lora_rank", u32(s.q_lora_rank));
  w.add(a + "attention.kv_lora_rank", u32(s.kv_lora_rank));
  w.add(a + "attention.key_length_mla", u32(s.qk_nope_dim + s.qk_rope_dim));
  w.add(a + "attention.value_length_mla", u32(s.v_head_dim));
  w.add(a + "rope.dimension_count", u32(s.qk_rope_dim));
  w.add(a + "ssm.conv_kernel", u32(s.conv_kernel));
  w.add(a + "kda.head_dim", u32(s.kda_head_dim));
  if (s.kda_heads != s.n_heads) w.add(a + "kda.head_count", u32(s.kda_heads));
  w.add(a + "leading_dense_block_count", u32(s.n_dense_layers));
  w.add(a + "expert_count", u32(s.n_experts));
  w.add(a + "expert_used_count", u32(s.n_experts_used));
  w.add(a + "expert_group_used_count", u32(1));
  w.add(a + "expert_feed_forward_length", u32(s.moe_ff));
  w.add(a + "expert_shared_count", u32(s.n_shared_experts));
  w.add(a + "expert_weights_scale", GgufValue::make_f32(s.routed_scale));
  w.add(a + "expert_weights_norm", GgufValue::make_bool(true));
  w.add(a + "expert_gating_func", u32(2));
  if (s.k3) {
    w.add(a + "kda.gate_lower_bound", GgufValue::make_f32(s.gate_lower_bound));
    if (s.expert_latent_dim > 0) w.add(a + "expert_latent_length", u32(s.expert_latent_dim));
    w.add(a + "attn_res.block_size", u32(s.attn_res_block_size));
    w.add(a + "activation.situ_beta", GgufValue::make_f32(s.situ_beta));
    w.add(a + "activation.situ_linear_beta", GgufValue::make_f32(s.situ_linear_beta));
  }
  if (s.chat_tokenizer) tokenizer::add_gguf_vocab_keys(w, synthetic_kimi_chat_vocab(s.vocab));
  for (const TensorSpec &t : ts) w.add_tensor(t.name, t.type, t.ne);

  std::vector<std::vector<uint32_t>> ranks(static_cast<size_t>(s.n_layers()));
  if (s.router_zipf >= 0)
    for (int64_t il = s.n_dense_layers; il < s.n_layers(); ++il)
      ranks[static_cast<size_t>(il)] = expert_ranks(s.seed, static_cast<uint32_t>(s.n_experts), il);
  auto fill_range = [&](size_t ti, uint64_t offset, std::span<uint8_t> out) {
    const TensorSpec &t = ts[ti];
    const uint32_t bb = format::require_ggml_type(static_cast<uint32_t>(t.type), t.name).block_bytes;
    fill_blocks(bb, offset, out, [&](uint64_t bi, uint8_t *block) {
      Rand r(s.seed, ti, bi);
      switch (t.kind) {
        case Kind::norm: put_f32(block, static_cast<float>(1.0 + t.std * r.gauss())); break;
        case Kind::negative: put_f32(block, static_cast<float>(-(0.5 + r.uniform()))); break;
        case Kind::router_bias:
          put_f32(block, zipf_router_bias(s.router_zipf, ranks[static_cast<size_t>(t.layer)][bi % static_cast<uint64_t>(s.n_experts)]));
          break;
        default: make_block(t.type, t.std, r, block, bb); break;
      }
    });
  };
  auto fill = [&](size_t ti, uint64_t offset, std::span<uint8_t> out) {
    parallel_fill([&](uint64_t off, std::span<uint8_t> part) { fill_range(ti, off, part); }, offset, out);
  };
  const std::vector<std::string> files =
      w.write(path, s.shards, fill, progress ? format::GgufProgress(progress) : format::GgufProgress{});
  return files.front();
}

}  // namespace ep::testkit
