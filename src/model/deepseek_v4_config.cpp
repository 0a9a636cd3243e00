#include "model/deepseek_v4_config.hpp"

#include "core/error.hpp"
#include "core/log.hpp"
#include "format/gguf.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <string_view>

namespace ep::model {

const char *attn_kind_name(AttnKind kind) noexcept {
  switch (kind) {
    case AttnKind::sliding: return "sliding";
    case AttnKind::csa: return "csa";
    case AttnKind::hca: return "hca";
  }
  return "?";
}

namespace {

using format::GgufType;
using format::GgufValue;

const GgufValue &require_key(const format::GgufSet &g, const std::string &key) {
  const GgufValue *v = g.find(key);
  if (!v) fail(Status::format, "{}: missing metadata key {}", g.first().path(), key);
  return *v;
}

int64_t get_int(const format::GgufSet &g, const std::string &key) {
  return require_key(g, key).as_int(g.first().path() + ": " + key);
}
int64_t get_int_or(const format::GgufSet &g, const std::string &key, int64_t fallback) {
  const GgufValue *v = g.find(key);
  return v ? v->as_int(g.first().path() + ": " + key) : fallback;
}
double get_float(const format::GgufSet &g, const std::string &key) {
  return require_key(g, key).as_float(g.first().path() + ": " + key);
}
double get_float_or(const format::GgufSet &g, const std::string &key, double fallback) {
  const GgufValue *v = g.find(key);
  return v ? v->as_float(g.first().path() + ": " + key) : fallback;
}

/// A per-layer float (scalar or array of at least n_layers values).
std::vector<float> per_layer_floats(const format::GgufSet &g, const std::string &key, int64_t n_layers,
                                    const std::vector<float> *fallback) {
  const GgufValue *v = g.find(key);
  if (!v) {
    if (fallback) return *fallback;
    fail(Status::format, "{}: missing metadata key {}", g.first().path(), key);
  }
  const std::string what = g.first().path() + ": " + key;
  if (v->type != GgufType::array) return std::vector<float>(static_cast<size_t>(n_layers), static_cast<float>(v->as_float(what)));
  if (v->array_size() < static_cast<size_t>(n_layers))
    fail(Status::format, "{}: {} values for {} layers", what, v->array_size(), n_layers);
  std::vector<float> out;
  for (int64_t i = 0; i < n_layers; ++i) out.push_back(static_cast<float>(v->at(static_cast<size_t>(i)).as_float(what)));
  return out;
}

/// A key that DeepSeek-V4 allows one value for (llama.cpp's loader and ds4 fix it; some
/// writers leave it out): a missing key takes that value and is added to @p defaulted; any other
/// value is refused, naming the key, the value and the file.
void require_only_value(const format::GgufSet &g, const std::string &key, int64_t only, std::string_view meaning,
                        std::vector<std::string> &defaulted) {
  const GgufValue *v = g.find(key);
  if (!v) {
    defaulted.push_back(fmt::format("{} = {} ({})", key, only, meaning));
    return;
  }
  const int64_t got = v->as_int(g.first().path() + ": " + key);
  if (got != only)
    fail(Status::unsupported, "{}: {} is {}, DeepSeek-V4 allows only {} ({})", g.first().path(), key, got, only, meaning);
}

}  // namespace

DeepseekV4Config DeepseekV4Config::from_gguf(const format::GgufSet &g) {
  const std::string path = g.first().path();
  const GgufValue &arch = require_key(g, "general.architecture");
  if (arch.type != GgufType::string || arch.s != "deepseek4")
    fail(Status::unsupported, "{}: general.architecture is '{}', expected 'deepseek4'", path, arch.to_string());
  const std::string a = "deepseek4.";
  DeepseekV4Config c;
  c.hidden = get_int(g, a + "embedding_length");
  c.n_layers = get_int(g, a + "block_count");
  const int64_t nextn = get_int_or(g, a + "nextn_predict_layers", 0);
  if (nextn > 0 && nextn < c.n_layers && g.find_tensor(fmt::format("blk.{}.nextn.eh_proj.weight", c.n_layers - nextn))) {
    c.n_layers -= nextn;  // MTP layers are counted in block_count; they are not run here
    c.n_mtp_layers = nextn;
  }
  std::vector<std::string> defaulted;  // keys with one legal value that the writer left out
  c.n_heads = get_int(g, a + "attention.head_count");
  require_only_value(g, a + "attention.head_count_kv", 1, "one shared K=V head", defaulted);
  c.head_dim = get_int(g, a + "attention.key_length");
  require_only_value(g, a + "attention.value_length", c.head_dim, "K = V: the key length", defaulted);
  c.rope_dim = get_int_or(g, a + "rope.dimension_count", c.head_dim);
  c.q_lora_rank = get_int(g, a + "attention.q_lora_rank");
  c.o_groups = get_int(g, a + "attention.output_group_count");
  c.o_lora_rank = get_int(g, a + "attention.output_lora_rank");
  c.n_experts = get_int(g, a + "expert_count");
  c.n_experts_used = get_int(g, a + "expert_used_count");
  c.moe_ff = get_int(g, a + "expert_feed_forward_length");
  c.n_shared_experts = get_int(g, a + "expert_shared_count");
  c.n_hash_layers = get_int(g, a + "hash_layer_count");
  c.index_n_heads = get_int(g, a + "attention.indexer.head_count");
  c.index_head_dim = get_int(g, a + "attention.indexer.key_length");
  c.index_topk = get_int(g, a + "attention.indexer.top_k");
  c.sliding_window = get_int(g, a + "attention.sliding_window");
  c.hc_mult = get_int(g, a + "hyper_connection.count");
  c.hc_sinkhorn_iters = get_int(g, a + "hyper_connection.sinkhorn_iterations");
  c.hc_eps = static_cast<float>(get_float(g, a + "hyper_connection.epsilon"));
  c.rms_eps = static_cast<float>(get_float(g, a + "attention.layer_norm_rms_epsilon"));
  c.routed_scale = static_cast<float>(get_float(g, a + "expert_weights_scale"));
  c.norm_topk = get_int(g, a + "expert_weights_norm") != 0;
  require_only_value(g, a + "expert_gating_func", 4, "sqrt-softplus", defaulted);
  // No group-limited routing: top-k over all experts. One group is the same selection.
  for (const char *k : {"expert_group_count", "expert_group_used_count"}) {
    const int64_t n = get_int_or(g, a + k, 0);
    if (n > 1)
      fail(Status::unsupported, "{}: {}{} is {}, DeepSeek-V4 routes without expert groups (0 or 1)", path, a, k, n);
  }
  c.swiglu_limit = per_layer_floats(g, a + "swiglu_clamp_exp", c.n_layers, nullptr);
  c.swiglu_limit_shared = per_layer_floats(g, a + "swiglu_clamp_shexp", c.n_layers, &c.swiglu_limit);
  const GgufValue &ratios = require_key(g, a + "attention.compress_ratios");
  if (ratios.type != GgufType::array || ratios.array_size() < static_cast<size_t>(c.n_layers))
    fail(Status::format, "{}: {}attention.compress_ratios needs at least {} values, found {}", path, a, c.n_layers,
         ratios.array_size());
  for (int64_t il = 0; il < c.n_layers; ++il) {
    const int64_t r = ratios.at(static_cast<size_t>(il)).as_int(path + ": compress_ratios");
    if (r < 0 || r > (1 << 20)) fail(Status::format, "{}: compress ratio {} of layer {}", path, r, il);
    c.compress_ratio.push_back(static_cast<int32_t>(r));
    const bool has_indexer = g.find_tensor(fmt::format("blk.{}.indexer.proj.weight", il)).has_value();
    c.attn_kind.push_back(r == 0 ? AttnKind::sliding : (has_indexer ? AttnKind::csa : AttnKind::hca));
  }
  c.rope_theta = static_cast<float>(get_float_or(g, a + "rope.freq_base", 10000.0));
  c.compress_rope_theta = static_cast<float>(get_float(g, a + "attention.compress_rope_freq_base"));
  const GgufValue *st = g.find(a + "rope.scaling.type");
  // YaRN is the only scaling DeepSeek-V4 defines: a scaling factor without a type is YaRN (as
  // ds4 reads it).
  const bool yarn_by_default = !st && g.find(a + "rope.scaling.factor");
  if (yarn_by_default) defaulted.push_back(a + "rope.scaling.type = yarn (the only scaling DeepSeek-V4 defines)");
  if (yarn_by_default || (st && st->type == GgufType::string && st->s == "yarn")) {
    c.yarn_factor = static_cast<float>(get_float(g, a + "rope.scaling.factor"));
    c.yarn_original_max_positions = get_int(g, a + "rope.scaling.original_context_length");
    c.yarn_beta_fast = static_cast<float>(get_float_or(g, a + "rope.scaling.yarn_beta_fast", 32.0));
    c.yarn_beta_slow = static_cast<float>(get_float_or(g, a + "rope.scaling.yarn_beta_slow", 1.0));
  } else if (st && !(st->type == GgufType::string && (st->s == "none" || st->s.empty()))) {
    fail(Status::unsupported, "{}: {}rope.scaling.type is {}, DeepSeek-V4 allows only \"yarn\" (or \"none\")", path, a,
         st->to_string());
  }
  c.max_positions = get_int_or(g, a + "context_length", 0);
  const auto emb = g.find_tensor("token_embd.weight");
  if (!emb) fail(Status::format, "{}: missing tensor token_embd.weight", path);
  c.vocab = static_cast<int64_t>(emb->info->ne[1]);
  c.validate(path);
  if (!defaulted.empty()) {
    std::string list;
    for (const std::string &d : defaulted) list += (list.empty() ? "" : "; ") + d;
    log::info("{}: metadata missing, set to DeepSeek-V4's only values: {}", path, list);
  }
  return c;
}

namespace {

using nlohmann::json;

const json &jreq(const json &j, const char *key, const std::string &src) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) fail(Status::format, "{}: missing key '{}'", src, key);
  return *it;
}
int64_t jint(const json &j, const char *key, const std::string &src) {
  const json &v = jreq(j, key, src);
  if (!v.is_number_integer()) fail(Status::format, "{}: '{}' must be an integer", src, key);
  return v.get<int64_t>();
}
int64_t jint_or(const json &j, const char *key, int64_t fallback, const std::string &src) {
  auto it = j.find(key);
  return (it == j.end() || it->is_null()) ? fallback : jint(j, key, src);
}
double jnum(const json &j, const char *key, const std::string &src) {
  const json &v = jreq(j, key, src);
  if (!v.is_number()) fail(Status::format, "{}: '{}' must be a number", src, key);
  return v.get<double>();
}
double jnum_or(const json &j, const char *key, double fallback, const std::string &src) {
  auto it = j.find(key);
  return (it == j.end() || it->is_null()) ? fallback : jnum(j, key, src);
}
std::string jstr_or(const json &j, const char *key, const std::string &fallback, const std::string &src) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_string()) fail(Status::format, "{}: '{}' must be a string, found {}", src, key, it->dump());
  return it->get<std::string>();
}
/// The rope type of a rope block: `rope_type`, else the older `type`, else "default".
std::string rope_type(const json &j, const std::string &src) {
  return jstr_or(j, "rope_type", jstr_or(j, "type", "default", src), src);
}

}  // namespace

DeepseekV4Config DeepseekV4Config::from_hf_json(const std::string &text, const std::string &src) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception &e) {
    fail(Status::format, "{}: not JSON: {}", src, e.what());
  }
  if (!j.is_object()) fail(Status::format, "{}: not a JSON object", src);
  const auto mt = j.find("model_type");
  if (mt == j.end() || !mt->is_string() || mt->get<std::string>() != "deepseek_v4")
    fail(Status::unsupported, "{}: model_type is not 'deepseek_v4'", src);
  DeepseekV4Config c;
  c.vocab = jint(j, "vocab_size", src);
  c.hidden = jint(j, "hidden_size", src);
  c.n_layers = jint(j, "num_hidden_layers", src);
  c.n_heads = jint(j, "num_attention_heads", src);
  if (jint_or(j, "num_key_value_heads", 1, src) != 1) fail(Status::format, "{}: num_key_value_heads must be 1", src);
  c.head_dim = jint(j, "head_dim", src);
  if (j.contains("qk_rope_head_dim") && !j["qk_rope_head_dim"].is_null()) {
    c.rope_dim = jint(j, "qk_rope_head_dim", src);
  } else {
    const double prf = jnum(j, "partial_rotary_factor", src);
    c.rope_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * prf);  // int() as transformers does
  }
  c.q_lora_rank = jint(j, "q_lora_rank", src);
  c.o_groups = jint(j, "o_groups", src);
  c.o_lora_rank = jint(j, "o_lora_rank", src);
  c.n_experts = jint(j, "n_routed_experts", src);
  c.n_experts_used = jint(j, "num_experts_per_tok", src);
  c.moe_ff = jint(j, "moe_intermediate_size", src);
  c.n_shared_experts = jint_or(j, "n_shared_experts", 1, src);
  c.index_n_heads = jint(j, "index_n_heads", src);
  c.index_head_dim = jint(j, "index_head_dim", src);
  c.index_topk = jint(j, "index_topk", src);
  c.sliding_window = jint(j, "sliding_window", src);
  c.hc_mult = jint(j, "hc_mult", src);
  c.hc_sinkhorn_iters = jint(j, "hc_sinkhorn_iters", src);
  c.hc_eps = static_cast<float>(jnum(j, "hc_eps", src));
  c.rms_eps = static_cast<float>(jnum(j, "rms_norm_eps", src));
  c.routed_scale = static_cast<float>(jnum(j, "routed_scaling_factor", src));
  c.norm_topk = true;  // transformers always renormalizes the routed weights
  const std::string scoring = jstr_or(j, "scoring_func", "sqrtsoftplus", src);
  if (scoring != "sqrtsoftplus") fail(Status::unsupported, "{}: scoring_func '{}' (expected sqrtsoftplus)", src, scoring);
  const float limit = static_cast<float>(jnum(j, "swiglu_limit", src));
  c.swiglu_limit.assign(static_cast<size_t>(c.n_layers), limit);
  c.swiglu_limit_shared = c.swiglu_limit;
  // attention layer types
  int64_t csa_rate = 4, hca_rate = 128;
  if (j.contains("compress_rates") && j["compress_rates"].is_object()) {
    csa_rate = jint_or(j["compress_rates"], "compressed_sparse_attention", csa_rate, src);
    hca_rate = jint_or(j["compress_rates"], "heavily_compressed_attention", hca_rate, src);
  }
  csa_rate = jint_or(j, "compress_rate_csa", csa_rate, src);
  hca_rate = jint_or(j, "compress_rate_hca", hca_rate, src);
  if (j.contains("layer_types") && j["layer_types"].is_array()) {
    const json &lt = j["layer_types"];
    if (static_cast<int64_t>(lt.size()) < c.n_layers) fail(Status::format, "{}: layer_types has {} entries for {} layers", src, lt.size(), c.n_layers);
    for (int64_t il = 0; il < c.n_layers; ++il) {
      const std::string t = lt[static_cast<size_t>(il)].get<std::string>();
      if (t == "sliding_attention") { c.attn_kind.push_back(AttnKind::sliding); c.compress_ratio.push_back(0); }
      else if (t == "compressed_sparse_attention") { c.attn_kind.push_back(AttnKind::csa); c.compress_ratio.push_back(static_cast<int32_t>(csa_rate)); }
      else if (t == "heavily_compressed_attention") { c.attn_kind.push_back(AttnKind::hca); c.compress_ratio.push_back(static_cast<int32_t>(hca_rate)); }
      else fail(Status::format, "{}: layer_types[{}] = '{}'", src, il, t);
    }
  } else if (j.contains("compress_ratios") && j["compress_ratios"].is_array()) {
    const json &cr = j["compress_ratios"];
    if (static_cast<int64_t>(cr.size()) < c.n_layers) fail(Status::format, "{}: compress_ratios has {} entries for {} layers", src, cr.size(), c.n_layers);
    for (int64_t il = 0; il < c.n_layers; ++il) {
      const int64_t r = cr[static_cast<size_t>(il)].get<int64_t>();
      c.compress_ratio.push_back(static_cast<int32_t>(r));
      c.attn_kind.push_back(r == 0 ? AttnKind::sliding : (r == csa_rate ? AttnKind::csa : AttnKind::hca));
    }
  } else {
    fail(Status::format, "{}: neither layer_types nor compress_ratios", src);
  }
  if (j.contains("mlp_layer_types") && j["mlp_layer_types"].is_array()) {
    const json &ml = j["mlp_layer_types"];
    int64_t n_hash = 0;
    for (int64_t il = 0; il < c.n_layers && il < static_cast<int64_t>(ml.size()); ++il) {
      const std::string t = ml[static_cast<size_t>(il)].get<std::string>();
      if (t == "hash_moe") {
        if (n_hash != il) fail(Status::unsupported, "{}: hash_moe layer {} after a non-hash layer", src, il);
        ++n_hash;
      } else if (t != "moe") {
        fail(Status::format, "{}: mlp_layer_types[{}] = '{}'", src, il, t);
      }
    }
    c.n_hash_layers = n_hash;
  } else {
    c.n_hash_layers = jint_or(j, "num_hash_layers", 3, src);
  }
  // RoPE
  c.rope_theta = static_cast<float>(jnum_or(j, "rope_theta", 10000.0, src));
  c.compress_rope_theta = static_cast<float>(jnum_or(j, "compress_rope_theta", 160000.0, src));
  c.max_positions = jint_or(j, "max_position_embeddings", 0, src);
  const json *yarn = nullptr;
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    const json &rp = j["rope_parameters"];
    if (rp.contains("main") && rp["main"].is_object()) c.rope_theta = static_cast<float>(jnum_or(rp["main"], "rope_theta", c.rope_theta, src));
    if (rp.contains("compress") && rp["compress"].is_object()) {
      const json &cp = rp["compress"];
      c.compress_rope_theta = static_cast<float>(jnum_or(cp, "rope_theta", c.compress_rope_theta, src));
      const std::string type = rope_type(cp, src);
      if (type == "yarn") yarn = &cp;
      else if (type != "default") fail(Status::unsupported, "{}: compress rope_type '{}'", src, type);
    } else if (rope_type(rp, src) == "yarn") {
      yarn = &rp;
    }
  } else if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    const json &rs = j["rope_scaling"];
    if (rope_type(rs, src) == "yarn") yarn = &rs;
  }
  if (yarn) {
    c.yarn_factor = static_cast<float>(jnum(*yarn, "factor", src));
    c.yarn_original_max_positions = jint(*yarn, "original_max_position_embeddings", src);
    c.yarn_beta_fast = static_cast<float>(jnum_or(*yarn, "beta_fast", 32.0, src));
    c.yarn_beta_slow = static_cast<float>(jnum_or(*yarn, "beta_slow", 1.0, src));
    c.compress_attention_factor = static_cast<float>(jnum_or(*yarn, "attention_factor", 1.0, src));
    // transformers' YaRN takes the factor from max_position_embeddings / original when both exist
    if (c.max_positions > 0 && c.yarn_original_max_positions > 0)
      c.yarn_factor = static_cast<float>(static_cast<double>(c.max_positions) / static_cast<double>(c.yarn_original_max_positions));
  }
  c.validate(src);
  return c;
}

void DeepseekV4Config::validate(const std::string &src) const {
  auto positive = [&](int64_t v, const char *name) {
    if (v <= 0) fail(Status::format, "{}: {} = {} must be positive", src, name, v);
  };
  positive(vocab, "vocab"); positive(hidden, "hidden size"); positive(n_layers, "layer count");
  positive(n_heads, "head count"); positive(head_dim, "head_dim"); positive(rope_dim, "rope dims");
  positive(q_lora_rank, "q_lora_rank"); positive(o_groups, "o_groups"); positive(o_lora_rank, "o_lora_rank");
  positive(n_experts, "expert count"); positive(n_experts_used, "experts per token"); positive(moe_ff, "moe width");
  positive(n_shared_experts, "shared experts"); positive(sliding_window, "sliding window"); positive(hc_mult, "hc_mult");
  positive(hc_sinkhorn_iters, "sinkhorn iterations");
  if (rope_dim % 2 || rope_dim > head_dim) fail(Status::format, "{}: rope dims {} must be even and <= head_dim {}", src, rope_dim, head_dim);
  if (n_heads % o_groups) fail(Status::format, "{}: {} heads are not a multiple of {} output groups", src, n_heads, o_groups);
  if (n_experts_used > n_experts) fail(Status::format, "{}: {} experts per token of {}", src, n_experts_used, n_experts);
  if (n_hash_layers < 0 || n_hash_layers > n_layers) fail(Status::format, "{}: {} hash layers of {}", src, n_hash_layers, n_layers);
  if (static_cast<int64_t>(compress_ratio.size()) != n_layers || static_cast<int64_t>(attn_kind.size()) != n_layers ||
      static_cast<int64_t>(swiglu_limit.size()) != n_layers || static_cast<int64_t>(swiglu_limit_shared.size()) != n_layers)
    fail(Status::format, "{}: per-layer lists do not have {} entries", src, n_layers);
  bool any_csa = false;
  for (int64_t il = 0; il < n_layers; ++il) {
    const bool comp = compress_ratio[static_cast<size_t>(il)] > 0;
    if (comp != (attn_kind[static_cast<size_t>(il)] != AttnKind::sliding))
      fail(Status::format, "{}: layer {} ratio {} does not fit its kind", src, il, compress_ratio[static_cast<size_t>(il)]);
    any_csa |= attn_kind[static_cast<size_t>(il)] == AttnKind::csa;
  }
  if (any_csa) {
    positive(index_n_heads, "indexer heads"); positive(index_head_dim, "indexer head dim"); positive(index_topk, "indexer top-k");
    if (rope_dim > index_head_dim) fail(Status::format, "{}: rope dims {} > indexer head dim {}", src, rope_dim, index_head_dim);
  }
  if (!(rms_eps > 0.0f) || !(hc_eps >= 0.0f) || !std::isfinite(routed_scale))
    fail(Status::format, "{}: bad epsilon / scale (rms {}, hc {}, routed scale {})", src, rms_eps, hc_eps, routed_scale);
  if (yarn_factor > 1.0f && yarn_original_max_positions <= 0)
    fail(Status::format, "{}: YaRN factor {} without original_max_position_embeddings", src, yarn_factor);
}

std::string DeepseekV4Config::summary() const {
  std::string kinds;
  for (int64_t il = 0; il < n_layers; ++il) {
    if (il) kinds += ",";
    kinds += attn_kind_name(attn_kind[static_cast<size_t>(il)]);
    if (compress_ratio[static_cast<size_t>(il)]) kinds += fmt::format("/{}", compress_ratio[static_cast<size_t>(il)]);
  }
  return fmt::format("DeepSeek-V4: {} layers [{}], D {}, {} heads x {} (rope {}), vocab {}, {} experts top-{} F {}, "
                     "{} hash layers, window {}, hc {}",
                     n_layers, kinds, hidden, n_heads, head_dim, rope_dim, vocab, n_experts, n_experts_used, moe_ff,
                     n_hash_layers, sliding_window, hc_mult);
}

}  // namespace ep::model
