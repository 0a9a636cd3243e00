#include "model/kimi_config.hpp"

#include "core/error.hpp"
#include "format/gguf.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>

namespace ep::model {

namespace {

using format::GgufType;
using format::GgufValue;

class Keys {
 public:
  Keys(const format::GgufSet &g, std::string prefix) : g_(g), prefix_(std::move(prefix)), path_(g.first().path()) {}
  const GgufValue *find(const std::string &key) const { return g_.find(prefix_ + key); }
  const GgufValue &req(const std::string &key) const {
    const GgufValue *v = find(key);
    if (!v) fail(Status::format, "{}: missing metadata key {}{}", path_, prefix_, key);
    return *v;
  }
  int64_t i(const std::string &key) const { return req(key).as_int(what(key)); }
  int64_t i_or(const std::string &key, int64_t fallback) const {
    const GgufValue *v = find(key);
    return v ? v->as_int(what(key)) : fallback;
  }
  double f_or(const std::string &key, double fallback) const {
    const GgufValue *v = find(key);
    return v ? v->as_float(what(key)) : fallback;
  }
  std::string what(const std::string &key) const { return path_ + ": " + prefix_ + key; }
  const std::string &path() const { return path_; }

 private:
  const format::GgufSet &g_;
  std::string prefix_, path_;
};

}  // namespace

KimiConfig KimiConfig::from_gguf(const format::GgufSet &g) {
  const std::string path = g.first().path();
  const GgufValue *arch = g.find("general.architecture");
  if (!arch || arch->type != GgufType::string || (arch->s != "kimi-linear" && arch->s != "kimi-k3"))
    fail(Status::unsupported, "{}: general.architecture is '{}', expected 'kimi-linear' (or 'kimi-k3')", path,
         arch ? arch->to_string() : std::string("(missing)"));
  const Keys k(g, arch->s + ".");
  KimiConfig c;
  c.arch = arch->s;
  c.hidden = k.i("embedding_length");
  c.n_layers = k.i("block_count");
  c.max_positions = k.i_or("context_length", 0);
  c.rms_eps = static_cast<float>(k.req("attention.layer_norm_rms_epsilon").as_float(k.what("attention.layer_norm_rms_epsilon")));
  // per-layer mixer: head_count_kv[i] = 1 for MLA, 0 for KDA (llama.cpp's encoding)
  const GgufValue &kv = k.req("attention.head_count_kv");
  if (kv.type != GgufType::array || kv.array_size() < static_cast<size_t>(c.n_layers))
    fail(Status::format, "{}: needs an array of at least {} values (1 = MLA layer, 0 = KDA layer)", k.what("attention.head_count_kv"),
         c.n_layers);
  for (int64_t il = 0; il < c.n_layers; ++il) {
    const int64_t v = kv.at(static_cast<size_t>(il)).as_int(k.what("attention.head_count_kv"));
    if (v != 0 && v != 1)
      fail(Status::format, "{}: layer {} has {}, expected 0 (KDA) or 1 (MLA)", k.what("attention.head_count_kv"), il, v);
    c.mixer.push_back(v ? KimiMixer::mla : KimiMixer::kda);
  }
  c.n_heads = k.i("attention.head_count");
  c.q_lora_rank = k.i_or("attention.q_lora_rank", 0);
  c.kv_lora_rank = k.i("attention.kv_lora_rank");
  const int64_t key_mla = k.i("attention.key_length_mla");
  c.v_head_dim = k.i("attention.value_length_mla");
  c.qk_rope_dim = k.i_or("rope.dimension_count", 0);
  c.qk_nope_dim = key_mla - c.qk_rope_dim;
  c.conv_kernel = k.i("ssm.conv_kernel");
  c.kda_head_dim = k.i("kda.head_dim");
  c.kda_heads = k.i_or("kda.head_count", c.n_heads);
  c.n_dense_layers = k.i_or("leading_dense_block_count", 1);
  c.dense_ff = c.n_dense_layers ? k.i("feed_forward_length") : k.i_or("feed_forward_length", 0);
  c.n_experts = k.i("expert_count");
  c.n_experts_used = k.i("expert_used_count");
  c.moe_ff = k.i("expert_feed_forward_length");
  c.n_shared_experts = k.i_or("expert_shared_count", 0);
  c.routed_scale = static_cast<float>(k.f_or("expert_weights_scale", 1.0));
  c.norm_topk = k.i_or("expert_weights_norm", 1) != 0;
  const int64_t gating = k.i_or("expert_gating_func", 2);
  if (gating != 2)
    fail(Status::unsupported, "{}: expert_gating_func is {}, Kimi routes with sigmoid scores (2)", k.what("expert_gating_func"), gating);
  const int64_t groups = k.i_or("expert_group_count", 1), groups_used = k.i_or("expert_group_used_count", 1);
  if (groups > 1 && groups_used < groups)
    fail(Status::unsupported, "{}: group-limited routing ({} of {} groups) is not implemented", path, groups_used, groups);
  // Kimi-K3 features
  const double lb = k.f_or("kda.gate_lower_bound", 0.0);
  c.kda_gate_lower_bound = std::isfinite(lb) ? static_cast<float>(lb) : 0.0f;  // −inf = unset (llama.cpp's default)
  c.expert_latent_dim = k.i_or("expert_latent_length", 0);
  c.attn_res_block_size = k.i_or("attn_res.block_size", 0);
  c.situ = k.find("activation.situ_beta") != nullptr;
  if (c.situ) {
    c.situ_beta = static_cast<float>(k.f_or("activation.situ_beta", 4.0));
    c.situ_linear_beta = static_cast<float>(k.f_or("activation.situ_linear_beta", 25.0));
  }
  for (int64_t il = 0; il < c.n_layers; ++il) {
    c.mla_output_gate = c.mla_output_gate || g.find_tensor(fmt::format("blk.{}.attn_gate.weight", il)).has_value();
    c.kda_full_rank_gate = c.kda_full_rank_gate || g.find_tensor(fmt::format("blk.{}.ssm_g.weight", il)).has_value();
  }
  const auto emb = g.find_tensor("token_embd.weight");
  if (!emb) fail(Status::format, "{}: missing tensor token_embd.weight", path);
  c.vocab = static_cast<int64_t>(emb->info->ne[1]);
  c.validate(path);
  return c;
}

KimiConfig KimiConfig::from_hf_json(const std::string &text, const std::string &src) {
  using nlohmann::json;
  const json top = json::parse(text, nullptr, false);
  if (top.is_discarded() || !top.is_object()) fail(Status::format, "{}: not a JSON object", src);
  auto str_or = [&](const json &o, const char *key, const std::string &fallback) {
    if (!o.contains(key) || o[key].is_null()) return fallback;
    if (!o[key].is_string()) fail(Status::format, "{}: {} is {}, expected a string", src, key, o[key].dump());
    return o[key].get<std::string>();
  };
  auto bool_or = [&](const json &o, const char *key, bool fallback) {
    if (!o.contains(key) || o[key].is_null()) return fallback;
    if (!o[key].is_boolean()) fail(Status::format, "{}: {} is {}, expected true or false", src, key, o[key].dump());
    return o[key].get<bool>();
  };
  const bool k3_top = str_or(top, "model_type", "") == "kimi_k3";
  const json &j = top.contains("text_config") && top["text_config"].is_object() ? top["text_config"] : top;
  const std::string mt = str_or(j, "model_type", str_or(top, "model_type", ""));
  if (mt != "kimi_linear" && mt != "kimi_k3" && mt != "kimi")
    fail(Status::unsupported, "{}: model_type is '{}', expected kimi_linear or kimi_k3", src, mt);
  auto num = [&](const json &o, const char *key) -> const json & {
    if (!o.contains(key) || !o[key].is_number()) fail(Status::format, "{}: missing number {}", src, key);
    return o[key];
  };
  auto i = [&](const json &o, const char *key) {
    const json &v = num(o, key);
    if (!v.is_number_integer()) fail(Status::format, "{}: {} is {}, expected an integer", src, key, v.dump());
    return v.get<int64_t>();
  };
  auto i_or = [&](const json &o, const char *key, int64_t fallback) {
    return o.contains(key) && !o[key].is_null() ? i(o, key) : fallback;
  };
  auto f_or = [&](const json &o, const char *key, double fallback) {
    return o.contains(key) && !o[key].is_null() ? num(o, key).get<double>() : fallback;
  };
  KimiConfig c;
  c.vocab = i(j, "vocab_size");
  c.hidden = i(j, "hidden_size");
  c.n_layers = i(j, "num_hidden_layers");
  c.rms_eps = static_cast<float>(f_or(j, "rms_norm_eps", 1e-5));
  c.max_positions = i_or(j, "max_position_embeddings", i_or(j, "model_max_length", 0));
  const json la = j.contains("linear_attn_config") && j["linear_attn_config"].is_object() ? j["linear_attn_config"] : json::object();
  if (j.contains("layer_types") && j["layer_types"].is_array()) {
    if (static_cast<int64_t>(j["layer_types"].size()) != c.n_layers)
      fail(Status::format, "{}: layer_types has {} entries for {} layers", src, j["layer_types"].size(), c.n_layers);
    for (const json &t : j["layer_types"]) {
      const std::string s = t.is_string() ? t.get<std::string>() : "";
      if (s != "linear_attention" && s != "full_attention") fail(Status::format, "{}: layer type {}", src, t.dump());
      c.mixer.push_back(s == "full_attention" ? KimiMixer::mla : KimiMixer::kda);
    }
  } else if (la.contains("full_attn_layers") && la["full_attn_layers"].is_array()) {
    c.mixer.assign(static_cast<size_t>(c.n_layers), KimiMixer::kda);
    for (const json &v : la["full_attn_layers"]) {  // 1-based
      const int64_t l = v.is_number_integer() ? v.get<int64_t>() : 0;
      if (l < 1 || l > c.n_layers) fail(Status::format, "{}: full_attn_layers has {} (layers are 1..{})", src, v.dump(), c.n_layers);
      c.mixer[static_cast<size_t>(l - 1)] = KimiMixer::mla;
    }
  } else {
    fail(Status::format, "{}: neither layer_types nor linear_attn_config.full_attn_layers", src);
  }
  c.n_heads = i(j, "num_attention_heads");
  c.q_lora_rank = i_or(j, "q_lora_rank", 0);
  c.kv_lora_rank = i(j, "kv_lora_rank");
  c.qk_nope_dim = i(j, "qk_nope_head_dim");
  c.qk_rope_dim = i_or(j, "qk_rope_head_dim", 0);
  c.v_head_dim = i(j, "v_head_dim");
  c.kda_heads = i_or(la, "num_heads", i_or(j, "linear_num_heads", c.n_heads));
  c.kda_head_dim = la.contains("head_dim") ? i(la, "head_dim") : i(j, "linear_head_dim");
  c.conv_kernel = la.contains("short_conv_kernel_size") ? i(la, "short_conv_kernel_size") : i(j, "linear_conv_kernel_dim");
  if (j.contains("mlp_layer_types") && j["mlp_layer_types"].is_array()) {
    const json &ml = j["mlp_layer_types"];
    int64_t dense = 0;
    for (size_t k = 0; k < ml.size(); ++k) {
      if (ml[k] == "dense") {
        if (dense != static_cast<int64_t>(k)) fail(Status::unsupported, "{}: a dense FFN layer after a sparse one", src);
        ++dense;
      } else if (ml[k] != "sparse") {
        fail(Status::format, "{}: mlp layer type {}", src, ml[k].dump());
      }
    }
    c.n_dense_layers = dense;
  } else {
    c.n_dense_layers = i_or(j, "first_k_dense_replace", 1);
  }
  c.dense_ff = i_or(j, "intermediate_size", 0);
  c.n_experts = i_or(j, "num_experts", i_or(j, "num_local_experts", 0));
  c.n_experts_used = i_or(j, "num_experts_per_token", i_or(j, "num_experts_per_tok", 0));
  c.moe_ff = i_or(j, "moe_intermediate_size", 0);
  c.n_shared_experts = i_or(j, "num_shared_experts", i_or(j, "n_shared_experts", 0));
  c.routed_scale = static_cast<float>(f_or(j, "routed_scaling_factor", 1.0));
  c.norm_topk = bool_or(j, "moe_renormalize", bool_or(j, "norm_topk_prob", true));
  const std::string router = str_or(j, "moe_router_activation_func", "sigmoid");
  if (router != "sigmoid") fail(Status::unsupported, "{}: moe_router_activation_func '{}', Kimi routes with sigmoid scores", src, router);
  const int64_t groups = i_or(j, "num_expert_group", 1), groups_used = i_or(j, "topk_group", groups);
  if (groups > 1 && groups_used < groups)
    fail(Status::unsupported, "{}: group-limited routing ({} of {} groups) is not implemented", src, groups_used, groups);
  // Kimi-K3 features
  const std::string act = str_or(j, "hidden_act", "silu");
  if (act != "silu" && act != "situ") fail(Status::unsupported, "{}: hidden_act '{}'", src, act);
  c.situ = act == "situ";
  c.situ_beta = static_cast<float>(f_or(j, "activation_situ_beta", 4.0));
  c.situ_linear_beta = static_cast<float>(f_or(j, "activation_situ_linear_beta", 25.0));
  c.kda_gate_lower_bound = static_cast<float>(f_or(la, "gate_lower_bound", 0.0));
  c.kda_full_rank_gate = bool_or(la, "use_full_rank_gate", bool_or(j, "use_full_rank_gate", false));
  c.mla_output_gate = bool_or(j, "mla_use_output_gate", false);
  c.expert_latent_dim = i_or(j, "routed_expert_hidden_size", 0);
  c.attn_res_block_size = i_or(j, "attn_res_block_size", 0);
  const bool k3 = k3_top || mt == "kimi_k3" || c.situ || c.attn_res_block_size > 0 || c.expert_latent_dim > 0 ||
                  c.kda_gate_lower_bound != 0.0f || c.mla_output_gate || c.kda_full_rank_gate;
  c.arch = k3 ? "kimi-k3" : "kimi-linear";
  c.validate(src);
  return c;
}

void KimiConfig::validate(const std::string &src) const {
  auto pos = [&](int64_t v, const char *what) {
    if (v <= 0) fail(Status::format, "{}: {} must be positive, found {}", src, what, v);
  };
  pos(vocab, "vocab size");
  pos(hidden, "hidden size");
  pos(n_layers, "block_count");
  if (static_cast<int64_t>(mixer.size()) != n_layers)
    fail(Status::format, "{}: {} layer kinds for {} layers", src, mixer.size(), n_layers);
  if (!(rms_eps > 0.0f) || !std::isfinite(rms_eps)) fail(Status::format, "{}: rms epsilon {}", src, rms_eps);
  bool any_mla = false, any_kda = false;
  for (KimiMixer m : mixer) (m == KimiMixer::mla ? any_mla : any_kda) = true;
  if (any_mla) {
    pos(n_heads, "attention.head_count");
    pos(kv_lora_rank, "kv_lora_rank");
    pos(qk_nope_dim, "qk_nope_head_dim (key_length_mla - rope.dimension_count)");
    pos(v_head_dim, "value_length_mla");
    if (qk_rope_dim < 0) fail(Status::format, "{}: rope.dimension_count {}", src, qk_rope_dim);
    if (q_lora_rank < 0) fail(Status::format, "{}: q_lora_rank {}", src, q_lora_rank);
  }
  if (any_kda) {
    pos(kda_heads, "kda.head_count");
    pos(kda_head_dim, "kda.head_dim");
    pos(conv_kernel, "ssm.conv_kernel");
  }
  if (n_dense_layers < 0 || n_dense_layers > n_layers)
    fail(Status::format, "{}: leading_dense_block_count {} of {} layers", src, n_dense_layers, n_layers);
  if (n_dense_layers > 0) pos(dense_ff, "feed_forward_length");
  if (n_dense_layers < n_layers) {
    pos(n_experts, "expert_count");
    pos(n_experts_used, "expert_used_count");
    pos(moe_ff, "expert_feed_forward_length");
    if (n_experts_used > n_experts)
      fail(Status::format, "{}: expert_used_count {} > expert_count {}", src, n_experts_used, n_experts);
    if (n_shared_experts < 0) fail(Status::format, "{}: expert_shared_count {}", src, n_shared_experts);
  }
  if (kda_gate_lower_bound > 0.0f || !std::isfinite(kda_gate_lower_bound))
    fail(Status::format, "{}: kda.gate_lower_bound {} (must be negative, or unset)", src, kda_gate_lower_bound);
  if (expert_latent_dim < 0) fail(Status::format, "{}: expert_latent_length {}", src, expert_latent_dim);
  if (attn_res_block_size < 0) fail(Status::format, "{}: attn_res.block_size {}", src, attn_res_block_size);
  if (situ && !(situ_beta > 0.0f)) fail(Status::format, "{}: activation.situ_beta {} must be positive", src, situ_beta);
}

std::string KimiConfig::summary() const {
  std::string kinds;
  for (KimiMixer m : mixer) kinds += m == KimiMixer::mla ? 'M' : 'K';
  return fmt::format("{}: vocab {}, D {}, {} layers [{}], MLA H {} q_lora {} kv_lora {} nope {} rope {} v {}, KDA {}x{} conv {}, "
                     "{} dense (ff {}), {} experts top-{} ff {} shared {} scale {} norm {}, eps {}",
                     arch, vocab, hidden, n_layers, kinds, n_heads, q_lora_rank, kv_lora_rank, qk_nope_dim, qk_rope_dim,
                     v_head_dim, kda_heads, kda_head_dim, conv_kernel, n_dense_layers, dense_ff, n_experts, n_experts_used,
                     moe_ff, n_shared_experts, routed_scale, norm_topk, rms_eps) +
         (arch == "kimi-k3" || situ || attn_res_block_size || expert_latent_dim || kda_gate_lower_bound != 0.0f
              ? fmt::format("; K3: situ {} ({}, {}), AttnRes block {}, latent {}, decay bound {}, MLA gate {}, full-rank KDA gate {}",
                            situ, situ_beta, situ_linear_beta, attn_res_block_size, expert_latent_dim, kda_gate_lower_bound,
                            mla_output_gate, kda_full_rank_gate)
              : std::string());
}

}  // namespace ep::model
