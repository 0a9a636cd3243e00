#include "testkit/official_checkpoint.hpp"

#include "backend/dequant.hpp"
#include "core/error.hpp"
#include "format/gguf.hpp"
#include "format/gguf_writer.hpp"
#include "format/microscale.hpp"
#include "format/safetensors.hpp"
#include "model/deepseek_v4_config.hpp"
#include "model/kimi_config.hpp"
#include "model/weight_catalog.hpp"
#include "testkit/random_weights.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

namespace ep::testkit {
namespace {

namespace fs = std::filesystem;
using format::GgmlType;
using format::StDtype;
using nlohmann::json;

struct StOut {
  std::string name;
  StDtype dtype;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;
};
struct GgufOut {
  std::string name;
  GgmlType type;
  std::vector<uint64_t> ne;
  std::vector<uint8_t> bytes;
};

/// What one conversion writes: checkpoint tensors and reference GGUF tensors.
struct Out {
  std::vector<StOut> st;
  std::vector<GgufOut> ref;
};

struct Source {
  format::GgufFile file;
  explicit Source(const std::string &path) : file(format::GgufFile::open(path)) {}
  const format::GgufTensorInfo &info(const std::string &name) const {
    const format::GgufTensorInfo *t = file.find_tensor(name);
    if (!t) fail(Status::not_found, "{}: no tensor {}", file.path(), name);
    return *t;
  }
  std::vector<uint8_t> raw(const format::GgufTensorInfo &t) const {
    return file.source().read_vector(t.file_offset, static_cast<size_t>(t.nbytes));
  }
  std::vector<float> values(const format::GgufTensorInfo &t) const {
    uint64_t n = 1;
    for (uint32_t d = 0; d < t.n_dims; ++d) n *= t.ne[d];
    std::vector<float> v(static_cast<size_t>(n));
    const std::vector<uint8_t> r = raw(t);
    backend::dequantize_row(t.type, r.data(), v.data(), static_cast<int64_t>(n));
    return v;
  }
};

std::vector<uint64_t> torch_shape(const format::GgufTensorInfo &t) {
  std::vector<uint64_t> s;
  for (uint32_t d = t.n_dims; d-- > 0;) s.push_back(t.ne[d]);
  return s;
}
std::vector<uint64_t> ggml_ne(const format::GgufTensorInfo &t) { return std::vector<uint64_t>(t.ne.begin(), t.ne.begin() + t.n_dims); }

std::vector<uint8_t> f32_bytes(const std::vector<float> &v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}
std::vector<uint8_t> bf16_bytes(const std::vector<float> &v) {
  std::vector<uint8_t> b(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = backend::fp32_to_bf16(v[i]);
    std::memcpy(b.data() + 2 * i, &h, 2);
  }
  return b;
}

/// The GGUF's values as F32 in both files.
void put_f32(Out &o, const Source &s, const std::string &gguf, const std::string &st, std::vector<uint64_t> shape = {}) {
  const format::GgufTensorInfo &t = s.info(gguf);
  const std::vector<uint8_t> b = f32_bytes(s.values(t));
  o.st.push_back({st, StDtype::f32, shape.empty() ? torch_shape(t) : shape, b});
  o.ref.push_back({gguf, GgmlType::f32, ggml_ne(t), b});
}

/// The GGUF's values rounded to BF16, in both files.
void put_bf16(Out &o, const Source &s, const std::string &gguf, const std::string &st) {
  const format::GgufTensorInfo &t = s.info(gguf);
  const std::vector<uint8_t> b = bf16_bytes(s.values(t));
  o.st.push_back({st, StDtype::bf16, torch_shape(t), b});
  o.ref.push_back({gguf, GgmlType::bf16, ggml_ne(t), b});
}

/// The GGUF's matrix quantized to FP8 e4m3 with E8M0 block scales (the checkpoint), and the
/// values those give as bf16 (the reference).
void put_fp8(Out &o, const Source &s, const std::string &gguf, const std::string &st, uint64_t br, uint64_t bc) {
  const format::GgufTensorInfo &t = s.info(gguf);
  if (t.n_dims != 2) fail(Status::internal, "{}: FP8 needs a matrix", gguf);
  const uint64_t cols = t.ne[0], rows = t.ne[1], sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
  const std::vector<float> v = s.values(t);
  std::vector<uint8_t> q(v.size()), e(sr * sc);
  std::vector<float> back(v.size());
  for (uint64_t a = 0; a < sr; ++a)
    for (uint64_t b = 0; b < sc; ++b) {
      double amax = 0;
      for (uint64_t r = a * br; r < std::min(rows, (a + 1) * br); ++r)
        for (uint64_t c = b * bc; c < std::min(cols, (b + 1) * bc); ++c) amax = std::max(amax, std::fabs(static_cast<double>(v[r * cols + c])));
      const int k = amax > 0 ? static_cast<int>(std::ceil(std::log2(amax / 448.0))) : 0;
      e[a * sc + b] = static_cast<uint8_t>(k + 127);
      for (uint64_t r = a * br; r < std::min(rows, (a + 1) * br); ++r)
        for (uint64_t c = b * bc; c < std::min(cols, (b + 1) * bc); ++c) {
          const uint64_t i = r * cols + c;
          q[i] = format::e4m3_from_value(std::ldexp(static_cast<double>(v[i]), -k));
          back[i] = static_cast<float>(std::ldexp(format::e4m3_value(q[i]), k));
        }
    }
  const std::string stem = st.substr(0, st.size() - 7);  // X.weight
  o.st.push_back({st, StDtype::f8_e4m3, {rows, cols}, q});
  o.st.push_back({stem + ".scale", StDtype::f8_e8m0, {sr, sc}, e});
  o.ref.push_back({gguf, GgmlType::bf16, {cols, rows}, bf16_bytes(back)});
}

/// Stacked routed experts {ne0, ne1, E}: per expert in the checkpoint, the stack in the reference.
/// fp4: the MXFP4 bytes re-laid as packed FP4 (+ scales; compressed-tensors names when @p ct);
/// otherwise F32 values.
void put_experts(Out &o, const Source &s, const std::string &gguf, const std::string &prefix, const std::string &role, bool fp4, bool ct) {
  const format::GgufTensorInfo &t = s.info(gguf);
  const uint64_t cols = t.ne[0], rows = t.ne[1], E = t.ne[2];
  if (fp4) {
    if (t.type != GgmlType::mxfp4) fail(Status::internal, "{}: FP4 experts need MXFP4 in the source GGUF", gguf);
    const std::vector<uint8_t> raw = s.raw(t);
    const uint64_t per = format::mxfp4_bytes(rows, cols);
    for (uint64_t x = 0; x < E; ++x) {
      std::vector<uint8_t> packed(rows * cols / 2), scales(rows * cols / 32);
      format::mxfp4_to_fp4_e8m0(raw.data() + x * per, rows, cols, packed.data(), scales.data());
      const std::string n = fmt::format("{}{}.{}", prefix, x, role);
      o.st.push_back({n + (ct ? ".weight_packed" : ".weight"), ct ? StDtype::u8 : StDtype::i8, {rows, cols / 2}, packed});
      o.st.push_back({n + (ct ? ".weight_scale" : ".scale"), ct ? StDtype::u8 : StDtype::f8_e8m0, {rows, cols / 32}, scales});
    }
    o.ref.push_back({gguf, GgmlType::mxfp4, {cols, rows, E}, raw});
    return;
  }
  const std::vector<float> v = s.values(t);
  for (uint64_t x = 0; x < E; ++x) {
    const std::vector<float> one(v.begin() + static_cast<std::ptrdiff_t>(x * rows * cols),
                                 v.begin() + static_cast<std::ptrdiff_t>((x + 1) * rows * cols));
    o.st.push_back({fmt::format("{}{}.{}.weight", prefix, x, role), StDtype::f32, {rows, cols}, f32_bytes(one)});
  }
  o.ref.push_back({gguf, GgmlType::f32, {cols, rows, E}, f32_bytes(v)});
}

/// Shards (contiguous groups of tensors) + index, config.json, and (unless @p reference is
/// empty) the reference GGUF with the source's metadata.
void write_all(const Out &o, const Source &s, const std::string &dir, const std::string &reference, uint32_t shards,
               const json &config) {
  fs::create_directories(dir);
  const uint32_t n = std::max<uint32_t>(1, std::min<uint32_t>(shards, static_cast<uint32_t>(o.st.size())));
  json weight_map = json::object();
  uint64_t total = 0;
  for (uint32_t k = 0; k < n; ++k) {
    const size_t a = o.st.size() * k / n, b = o.st.size() * (k + 1) / n;
    const std::string name = n == 1 ? "model.safetensors" : fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, n);
    std::vector<format::StWriteTensor> part;
    for (size_t i = a; i < b; ++i) {
      part.push_back({o.st[i].name, o.st[i].dtype, o.st[i].shape});
      weight_map[o.st[i].name] = name;
      total += o.st[i].bytes.size();
    }
    format::write_safetensors((fs::path(dir) / name).string(), part,
                              [&](size_t t, uint64_t off, std::span<uint8_t> out) {
                                std::memcpy(out.data(), o.st[a + t].bytes.data() + off, out.size());
                              },
                              {{"format", "pt"}});
  }
  if (n > 1)
    std::ofstream(fs::path(dir) / "model.safetensors.index.json") << json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(1);
  std::ofstream(fs::path(dir) / "config.json") << config.dump(1);
  if (reference.empty()) return;
  format::GgufWriter w;
  for (const auto &[key, value] : s.file.metadata())
    if (key != "general.alignment" && key.rfind("split.", 0) != 0) w.add(key, value);
  for (const GgufOut &t : o.ref) w.add_tensor(t.name, t.type, t.ne);
  w.write(reference, 1, [&](size_t t, uint64_t off, std::span<uint8_t> out) {
    std::memcpy(out.data(), o.ref[t].bytes.data() + off, out.size());
  });
}

/// A few tensors of the MTP layer DeepSeek ships (the loaders skip `mtp.*`).
void put_mtp(Out &o, uint64_t seed, uint64_t d) {
  std::vector<uint8_t> w(64 * d), sc(1);
  Rand r(seed, 999, 0);
  for (uint8_t &b : w) b = static_cast<uint8_t>(r.next() & 0x77);
  sc[0] = 120;
  o.st.push_back({"mtp.0.attn.wq_a.weight", StDtype::f8_e4m3, {64, d}, w});
  o.st.push_back({"mtp.0.attn.wq_a.scale", StDtype::f8_e8m0, {1, (d + 127) / 128}, std::vector<uint8_t>((d + 127) / 128, 120)});
  o.st.push_back({"mtp.0.enorm.weight", StDtype::bf16, {d}, std::vector<uint8_t>(2 * d, 0x3f)});
}

}  // namespace

void write_deepseek_v4_official(const std::string &gguf, const std::string &dir, const std::string &reference,
                                const OfficialCheckpointOptions &opt) {
  const Source s(gguf);
  const model::DeepseekV4Config c = model::DeepseekV4Config::from_gguf(format::GgufSet::open(gguf));
  Out o;
  const uint64_t br = opt.fp8_block_rows, bc = opt.fp8_block_cols;
  auto check = [&](const std::string &st, const std::string &g) {
    int64_t x = -1;
    if (model::deepseek_v4_gguf_name(st, &x) != g) fail(Status::internal, "official name {} does not map to {}", st, g);
  };
  auto bf16 = [&](const std::string &g, const std::string &st) { check(st, g), put_bf16(o, s, g, st); };
  auto f32 = [&](const std::string &g, const std::string &st) { check(st, g), put_f32(o, s, g, st); };
  auto fp8 = [&](const std::string &g, const std::string &st) { check(st, g), put_fp8(o, s, g, st, br, bc); };
  bf16("token_embd.weight", "embed.weight");
  for (int64_t il = 0; il < c.n_layers; ++il) {
    const std::string b = fmt::format("blk.{}.", il), p = fmt::format("layers.{}.", il);
    bf16(b + "attn_norm.weight", p + "attn_norm.weight");
    bf16(b + "ffn_norm.weight", p + "ffn_norm.weight");
    for (const char *site : {"attn", "ffn"})
      for (const char *k : {"fn", "base", "scale"}) f32(b + fmt::format("hc_{}_{}.weight", site, k), p + fmt::format("hc_{}_{}", site, k));
    f32(b + "attn_sinks.weight", p + "attn.attn_sink");
    fp8(b + "attn_q_a.weight", p + "attn.wq_a.weight");
    bf16(b + "attn_q_a_norm.weight", p + "attn.q_norm.weight");
    fp8(b + "attn_q_b.weight", p + "attn.wq_b.weight");
    fp8(b + "attn_kv.weight", p + "attn.wkv.weight");
    bf16(b + "attn_kv_a_norm.weight", p + "attn.kv_norm.weight");
    fp8(b + "attn_output_a.weight", p + "attn.wo_a.weight");
    fp8(b + "attn_output_b.weight", p + "attn.wo_b.weight");
    if (c.attn_kind[static_cast<size_t>(il)] != model::AttnKind::sliding) {
      bf16(b + "attn_compressor_kv.weight", p + "attn.compressor.wkv.weight");
      bf16(b + "attn_compressor_gate.weight", p + "attn.compressor.wgate.weight");
      f32(b + "attn_compressor_ape.weight", p + "attn.compressor.ape");
      bf16(b + "attn_compressor_norm.weight", p + "attn.compressor.norm.weight");
      if (c.attn_kind[static_cast<size_t>(il)] == model::AttnKind::csa) {
        bf16(b + "indexer.proj.weight", p + "attn.indexer.weights_proj.weight");
        fp8(b + "indexer.attn_q_b.weight", p + "attn.indexer.wq_b.weight");
        bf16(b + "indexer_compressor_kv.weight", p + "attn.indexer.compressor.wkv.weight");
        bf16(b + "indexer_compressor_gate.weight", p + "attn.indexer.compressor.wgate.weight");
        f32(b + "indexer_compressor_ape.weight", p + "attn.indexer.compressor.ape");
        bf16(b + "indexer_compressor_norm.weight", p + "attn.indexer.compressor.norm.weight");
      }
    }
    bf16(b + "ffn_gate_inp.weight", p + "ffn.gate.weight");
    if (il < c.n_hash_layers) {
      const format::GgufTensorInfo &t = s.info(b + "ffn_gate_tid2eid.weight");
      const std::vector<uint8_t> raw = s.raw(t);
      std::vector<uint8_t> wide(raw.size() * 2);
      for (size_t i = 0; i < raw.size() / 4; ++i) {
        int32_t v;
        std::memcpy(&v, raw.data() + 4 * i, 4);
        const int64_t w = v;
        std::memcpy(wide.data() + 8 * i, &w, 8);
      }
      o.st.push_back({p + "ffn.gate.tid2eid", StDtype::i64, torch_shape(t), wide});
      o.ref.push_back({b + "ffn_gate_tid2eid.weight", GgmlType::i32, ggml_ne(t), raw});
    } else {
      f32(b + "exp_probs_b.bias", p + "ffn.gate.bias");
    }
    for (const auto &[role, w] : {std::pair{"gate", "w1"}, {"up", "w3"}, {"down", "w2"}}) {
      check(p + "ffn.experts.0." + w + ".weight", b + "ffn_" + role + "_exps.weight");
      put_experts(o, s, b + "ffn_" + role + "_exps.weight", p + "ffn.experts.", w, true, false);
      fp8(b + "ffn_" + role + "_shexp.weight", p + "ffn.shared_experts." + w + ".weight");
    }
  }
  f32("output_hc_fn.weight", "hc_head_fn");
  f32("output_hc_base.weight", "hc_head_base");
  f32("output_hc_scale.weight", "hc_head_scale");
  bf16("output_norm.weight", "norm.weight");
  bf16("output.weight", "head.weight");
  put_mtp(o, opt.seed, static_cast<uint64_t>(c.hidden));
  std::vector<int32_t> ratios(c.compress_ratio);
  ratios.push_back(0);  // the MTP layer's
  const json config = {
      {"architectures", {"DeepseekV4ForCausalLM"}},
      {"model_type", "deepseek_v4"},
      {"vocab_size", c.vocab},
      {"hidden_size", c.hidden},
      {"num_hidden_layers", c.n_layers},
      {"num_nextn_predict_layers", 1},
      {"num_attention_heads", c.n_heads},
      {"num_key_value_heads", 1},
      {"head_dim", c.head_dim},
      {"qk_rope_head_dim", c.rope_dim},
      {"q_lora_rank", c.q_lora_rank},
      {"o_groups", c.o_groups},
      {"o_lora_rank", c.o_lora_rank},
      {"sliding_window", c.sliding_window},
      {"compress_ratios", ratios},
      {"index_n_heads", c.index_n_heads},
      {"index_head_dim", c.index_head_dim},
      {"index_topk", c.index_topk},
      {"hc_mult", c.hc_mult},
      {"hc_sinkhorn_iters", c.hc_sinkhorn_iters},
      {"hc_eps", c.hc_eps},
      {"n_routed_experts", c.n_experts},
      {"num_experts_per_tok", c.n_experts_used},
      {"n_shared_experts", c.n_shared_experts},
      {"moe_intermediate_size", c.moe_ff},
      {"scoring_func", "sqrtsoftplus"},
      {"topk_method", "noaux_tc"},
      {"norm_topk_prob", true},
      {"routed_scaling_factor", c.routed_scale},
      {"num_hash_layers", c.n_hash_layers},
      {"swiglu_limit", c.swiglu_limit.at(0)},
      {"rope_theta", c.rope_theta},
      {"compress_rope_theta", c.compress_rope_theta},
      {"rope_scaling",
       {{"type", "yarn"},
        {"factor", c.yarn_factor},
        {"original_max_position_embeddings", c.yarn_original_max_positions},
        {"beta_fast", c.yarn_beta_fast},
        {"beta_slow", c.yarn_beta_slow}}},
      {"max_position_embeddings", static_cast<int64_t>(std::llround(c.yarn_factor * static_cast<double>(c.yarn_original_max_positions)))},
      {"rms_norm_eps", c.rms_eps},
      {"bos_token_id", 0},
      {"eos_token_id", 1},
      {"tie_word_embeddings", false},
      {"quantization_config",
       {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"}, {"scale_fmt", "ue8m0"}, {"weight_block_size", {br, bc}}}},
  };
  write_all(o, s, dir, reference, opt.shards, config);
}

void write_kimi_checkpoint(const std::string &gguf, KimiCheckpointLayout layout, const std::string &dir, const std::string &reference,
                           const OfficialCheckpointOptions &opt) {
  const Source s(gguf);
  const model::KimiConfig c = model::KimiConfig::from_gguf(format::GgufSet::open(gguf));
  const bool k3 = layout == KimiCheckpointLayout::k3_official;
  const std::string pre = k3 ? "language_model." : "";
  Out o;
  auto check = [&](const std::string &st, const std::string &g) {
    int64_t x = -1;
    const std::string got = model::kimi_gguf_name(st, c, &x);
    if (got.substr(0, got.find('#')) != g) fail(Status::internal, "checkpoint name {} maps to {}, not {}", st, got, g);
  };
  // K3's release: matrices BF16, vectors F32; transformers: everything F32
  auto put = [&](const std::string &g, const std::string &st) {
    check(pre + st, g);
    const format::GgufTensorInfo &t = s.info(g);
    if (k3 && !opt.k3_f32 && t.n_dims == 2 && t.ne[1] > 1) put_bf16(o, s, g, pre + st);
    else put_f32(o, s, g, pre + st);
  };
  Rand rnd(opt.seed, 1, 0);
  auto res_pair = [&](const std::string &g, const std::string &norm, const std::string &proj) {
    check(pre + norm, g);
    check(pre + proj, g);
    const std::vector<float> v = s.values(s.info(g));
    // proj = 2^k and norm = score / 2^k: their product is the source's score exactly
    std::vector<float> nv(v.size()), pv(v.size()), prod(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      const int k = static_cast<int>(rnd.next() % 3) - 1;
      pv[i] = std::ldexp(1.0f, k);
      nv[i] = std::ldexp(v[i], -k);
      prod[i] = nv[i] * pv[i];
    }
    o.st.push_back({pre + norm, StDtype::f32, {v.size()}, f32_bytes(nv)});
    o.st.push_back({pre + proj, StDtype::f32, {1, v.size()}, f32_bytes(pv)});
    o.ref.push_back({g, GgmlType::f32, {v.size()}, f32_bytes(prod)});
  };
  put("token_embd.weight", "model.embed_tokens.weight");
  const int64_t H = c.n_heads, KVL = c.kv_lora_rank, NOPE = c.qk_nope_dim, VH = c.v_head_dim;
  for (int64_t il = 0; il < c.n_layers; ++il) {
    const std::string b = fmt::format("blk.{}.", il), p = fmt::format("model.layers.{}.", il);
    put(b + "attn_norm.weight", p + "input_layernorm.weight");
    put(b + "ffn_norm.weight", p + "post_attention_layernorm.weight");
    if (c.attn_res_block_size > 0) {
      res_pair(b + "attn_res_score.weight", p + "self_attention_res_norm.weight", p + "self_attention_res_proj.weight");
      res_pair(b + "ffn_res_score.weight", p + "mlp_res_norm.weight", p + "mlp_res_proj.weight");
    }
    const std::string a = p + "self_attn.";
    if (c.mixer[static_cast<size_t>(il)] == model::KimiMixer::kda) {
      for (const char *x : {"q", "k", "v"}) {
        put(b + "attn_" + x + ".weight", a + x + "_proj.weight");
        const format::GgufTensorInfo &t = s.info(b + "ssm_conv1d_" + x + ".weight");
        check(pre + a + x + "_conv1d.weight", b + "ssm_conv1d_" + x + ".weight");
        put_f32(o, s, b + "ssm_conv1d_" + x + ".weight", pre + a + x + "_conv1d.weight", {t.ne[2], 1, t.ne[0]});
      }
      put(b + "ssm_f_a.weight", a + "f_a_proj.weight");
      put(b + "ssm_f_b.weight", a + "f_b_proj.weight");
      put(b + "ssm_dt.bias", a + "dt_bias");
      {
        // A_log = log(−ssm_a); the reference holds what the loader computes back from it
        check(pre + a + "A_log", b + "ssm_a");
        const std::vector<float> ssm_a = s.values(s.info(b + "ssm_a"));
        const size_t n = ssm_a.size(), pad = k3 ? 3 : 0;
        std::vector<float> alog(n + pad, 0.0f), back(n);
        for (size_t i = 0; i < n; ++i) {
          alog[i] = static_cast<float>(std::log(-static_cast<double>(ssm_a[i])));
          back[i] = model::kimi_ssm_a_from_a_log(alog[i]);
        }
        o.st.push_back({pre + a + "A_log", StDtype::f32, k3 ? std::vector<uint64_t>{n + pad} : std::vector<uint64_t>{1, 1, n, 1}, f32_bytes(alog)});
        o.ref.push_back({b + "ssm_a", GgmlType::f32, {n}, f32_bytes(back)});
      }
      put(b + "ssm_beta.weight", a + "b_proj.weight");
      if (c.kda_full_rank_gate) {
        put(b + "ssm_g.weight", a + "g_proj.weight");
      } else {
        put(b + "ssm_g_a.weight", a + "g_a_proj.weight");
        put(b + "ssm_g_b.weight", a + "g_b_proj.weight");
      }
      put(b + "ssm_norm.weight", a + "o_norm.weight");
      put(b + "attn_output.weight", a + "o_proj.weight");
    } else {
      if (c.q_lora_rank > 0) {
        put(b + "attn_q_a.weight", a + "q_a_proj.weight");
        put(b + "attn_q_a_norm.weight", a + "q_a_layernorm.weight");
        put(b + "attn_q_b.weight", a + "q_b_proj.weight");
      } else {
        put(b + "attn_q.weight", a + "q_proj.weight");
      }
      put(b + "attn_kv_a_mqa.weight", a + "kv_a_proj_with_mqa.weight");
      put(b + "attn_kv_a_norm.weight", a + "kv_a_layernorm.weight");
      check(pre + a + "kv_b_proj.weight", b + "attn_kv_b.weight");
      std::vector<float> kvb;
      if (s.file.find_tensor(b + "attn_kv_b.weight")) {
        kvb = s.values(s.info(b + "attn_kv_b.weight"));
      } else {  // llama.cpp's split k_b {nope, KVL, H}, v_b {KVL, v, H} joined back
        const std::vector<float> kb = s.values(s.info(b + "attn_k_b.weight")), vb = s.values(s.info(b + "attn_v_b.weight"));
        kvb.resize(static_cast<size_t>(KVL * H * (NOPE + VH)));
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t i = 0; i < NOPE; ++i)
            for (int64_t cc = 0; cc < KVL; ++cc)
              kvb[static_cast<size_t>((h * (NOPE + VH) + i) * KVL + cc)] = kb[static_cast<size_t>((h * KVL + cc) * NOPE + i)];
          for (int64_t j = 0; j < VH; ++j)
            for (int64_t cc = 0; cc < KVL; ++cc)
              kvb[static_cast<size_t>((h * (NOPE + VH) + NOPE + j) * KVL + cc)] = vb[static_cast<size_t>((h * VH + j) * KVL + cc)];
        }
      }
      const uint64_t rows = static_cast<uint64_t>(H * (NOPE + VH)), cols = static_cast<uint64_t>(KVL);
      if (k3 && !opt.k3_f32) {
        const std::vector<uint8_t> bb = bf16_bytes(kvb);
        o.st.push_back({pre + a + "kv_b_proj.weight", StDtype::bf16, {rows, cols}, bb});
        o.ref.push_back({b + "attn_kv_b.weight", GgmlType::bf16, {cols, rows}, bb});
      } else {
        o.st.push_back({pre + a + "kv_b_proj.weight", StDtype::f32, {rows, cols}, f32_bytes(kvb)});
        o.ref.push_back({b + "attn_kv_b.weight", GgmlType::f32, {cols, rows}, f32_bytes(kvb)});
      }
      if (c.mla_output_gate) put(b + "attn_gate.weight", a + "g_proj.weight");
      put(b + "attn_output.weight", a + "o_proj.weight");
    }
    if (!c.is_moe(il)) {
      const std::string m = p + (k3 ? "mlp." : "block_sparse_moe.");
      put(b + "ffn_gate.weight", m + "gate_proj.weight");
      put(b + "ffn_up.weight", m + "up_proj.weight");
      put(b + "ffn_down.weight", m + "down_proj.weight");
      continue;
    }
    const std::string m = p + "block_sparse_moe.";
    put(b + "ffn_gate_inp.weight", m + "gate.weight");
    put(b + "exp_probs_b.bias", m + "gate.e_score_correction_bias");
    if (c.expert_latent_dim > 0) {
      put(b + "ffn_routed_down.weight", m + "routed_expert_down_proj.weight");
      put(b + "ffn_routed_up.weight", m + "routed_expert_up_proj.weight");
      if (s.file.find_tensor(b + "ffn_routed_norm.weight")) put(b + "ffn_routed_norm.weight", m + "routed_expert_norm.weight");
    }
    for (const auto &[role, w] : {std::pair{"gate", "w1"}, {"up", "w3"}, {"down", "w2"}}) {
      check(pre + m + "experts.0." + w + ".weight", b + "ffn_" + role + "_exps.weight");
      put_experts(o, s, b + "ffn_" + role + "_exps.weight", pre + m + "experts.", w, k3, k3);
    }
    if (c.n_shared_experts > 0) {
      put(b + "ffn_gate_shexp.weight", m + "shared_experts.gate_proj.weight");
      put(b + "ffn_up_shexp.weight", m + "shared_experts.up_proj.weight");
      put(b + "ffn_down_shexp.weight", m + "shared_experts.down_proj.weight");
    }
  }
  if (c.attn_res_block_size > 0) res_pair("output_res_score.weight", "model.output_attn_res_norm.weight", "model.output_attn_res_proj.weight");
  put("output_norm.weight", "model.norm.weight");
  put("output.weight", "lm_head.weight");
  // config.json
  json layer_types = json::array(), full = json::array(), kda = json::array(), mlp = json::array();
  for (int64_t il = 0; il < c.n_layers; ++il) {
    const bool mla = c.mixer[static_cast<size_t>(il)] == model::KimiMixer::mla;
    layer_types.push_back(mla ? "full_attention" : "linear_attention");
    (mla ? full : kda).push_back(il + 1);
    mlp.push_back(c.is_moe(il) ? "sparse" : "dense");
  }
  json la = {{"num_heads", c.kda_heads}, {"head_dim", c.kda_head_dim}, {"short_conv_kernel_size", c.conv_kernel},
             {"kda_layers", kda}, {"full_attn_layers", full}};
  json t = {
      {"model_type", "kimi_linear"},
      {"vocab_size", c.vocab},
      {"hidden_size", c.hidden},
      {"num_hidden_layers", c.n_layers},
      {"rms_norm_eps", c.rms_eps},
      {"num_attention_heads", c.n_heads},
      {"num_key_value_heads", c.n_heads},
      {"q_lora_rank", c.q_lora_rank > 0 ? json(c.q_lora_rank) : json(nullptr)},
      {"kv_lora_rank", c.kv_lora_rank},
      {"qk_nope_head_dim", c.qk_nope_dim},
      {"qk_rope_head_dim", c.qk_rope_dim},
      {"v_head_dim", c.v_head_dim},
      {"linear_attn_config", la},
      {"first_k_dense_replace", c.n_dense_layers},
      {"intermediate_size", c.dense_ff},
      {"num_experts", c.n_experts},
      {"num_experts_per_token", c.n_experts_used},
      {"moe_intermediate_size", c.moe_ff},
      {"num_shared_experts", c.n_shared_experts},
      {"routed_scaling_factor", c.routed_scale},
      {"moe_renormalize", c.norm_topk},
      {"num_expert_group", 1},
      {"topk_group", 1},
      {"pad_token_id", nullptr},
      {"bos_token_id", nullptr},
      {"eos_token_id", nullptr},
      {"tie_word_embeddings", false},
  };
  json config;
  if (k3) {
    t["hidden_act"] = c.situ ? "situ" : "silu";
    t["activation_situ_beta"] = c.situ_beta;
    t["activation_situ_linear_beta"] = c.situ_linear_beta;
    t["attn_res_block_size"] = c.attn_res_block_size;
    t["routed_expert_hidden_size"] = c.expert_latent_dim;
    t["latent_moe_use_norm"] = true;
    t["moe_router_activation_func"] = "sigmoid";
    t["use_grouped_topk"] = true;
    t["mla_use_nope"] = true;
    t["mla_use_output_gate"] = c.mla_output_gate;
    t["linear_attn_config"]["gate_lower_bound"] = c.kda_gate_lower_bound;
    t["linear_attn_config"]["use_full_rank_gate"] = c.kda_full_rank_gate;
    t["num_nextn_predict_layers"] = 0;
    t["quantization_config"] = {{"quant_method", "compressed-tensors"},
                                {"format", "mxfp4-pack-quantized"},
                                {"ignore", {"re:.*shared_experts.*", "lm_head"}}};
    config = {{"architectures", {"KimiK3ForConditionalGeneration"}}, {"model_type", "kimi_k3"}, {"text_config", t}};
  } else {
    t["architectures"] = {"KimiLinearForCausalLM"};
    t["hidden_act"] = "silu";
    t["layer_types"] = layer_types;
    t["mlp_layer_types"] = mlp;
    config = t;
  }
  write_all(o, s, dir, reference, opt.shards, config);
}

}  // namespace ep::testkit
