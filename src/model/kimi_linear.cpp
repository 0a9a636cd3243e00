#include "model/kimi_linear.hpp"

#include "backend/dequant.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "format/gguf.hpp"
#include "model/kimi_ops.hpp"
#include "model/weight_catalog.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

namespace ep::model {

using backend::Device;
using backend::GgmlType;
using backend::Tensor;

struct KimiLinearModel::Weights {
  std::vector<DeviceBuffer> bufs;
  struct Layer {
    Tensor attn_norm, ffn_norm;
    // KDA
    Tensor wq, wk, wv, f_a, f_b, beta, g_a, g_b, wo;
    std::vector<float> conv;     // [3 · Di][kernel]: q channels, then k, then v
    std::vector<float> dt_bias;  // [Di]
    std::vector<float> ssm_a;    // [H] = −exp(A_log)
    std::vector<float> o_norm;   // [dk]
    // MLA
    Tensor q, q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b, mla_o;
    // FFN
    Tensor ffn_gate, ffn_up, ffn_down;
    Tensor gate_inp, bias, sh_gate, sh_up, sh_down;
    // Kimi-K3
    std::vector<float> attn_res, ffn_res;  // AttnRes score vectors [D]
    Tensor ssm_g, attn_gate, routed_down, routed_up, routed_norm;
  };
  Tensor token_embd, output, output_norm;
  std::vector<float> output_res;
  std::vector<Layer> layers;
};

namespace {

Tensor f32_view(const float *p, std::initializer_list<int64_t> shape) {
  return Tensor::make(p, GgmlType::f32, Device::cpu, shape);
}

class KimiLoader {
 public:
  KimiLoader(WeightCatalog &cat, backend::Backend &be, std::vector<DeviceBuffer> &bufs, uint64_t &bytes)
      : cat_(cat), be_(be), bufs_(bufs), bytes_(bytes) {}

  Tensor upload(const void *data, GgmlType type, std::initializer_list<int64_t> shape, uint64_t n_bytes) {
    DeviceBuffer buf(be_, n_bytes);
    be_.upload(buf.get(), data, n_bytes);
    Tensor t = Tensor::make(buf.get(), type, be_.device(), shape);
    bufs_.push_back(std::move(buf));
    bytes_ += n_bytes;
    return t;
  }
  /// A matmul / embedding weight {ne0, ne1}, kept in its file type.
  Tensor matrix(const std::string &name, int64_t ne0, int64_t ne1) {
    const CatalogEntry *e = cat_.take(name, {ne0, ne1});
    if (!e) return {};
    if (!backend::is_supported_weight_type(e->type))
      fail(Status::unsupported, "{}: ggml type {} is not supported for weights", e->origin, static_cast<uint32_t>(e->type));
    const std::vector<uint8_t> raw = e->read();
    return upload(raw.data(), e->type, {ne0, ne1}, raw.size());
  }
  /// A vector used by backend ops (norm weights, router bias), converted to f32.
  Tensor vec(const std::string &name, int64_t n) {
    const std::vector<float> v = host(name, {n});
    if (v.empty()) return {};
    return upload(v.data(), GgmlType::f32, {n}, v.size() * 4);
  }
  /// Values read on the host (conv weights, dt bias, A, the gated norm), converted to f32.
  std::vector<float> host(const std::string &name, std::vector<int64_t> ne) {
    const CatalogEntry *e = cat_.take(name, ne);
    if (!e) return {};
    if (e->type == GgmlType::i32 || e->type == GgmlType::i64 || e->type == GgmlType::i16 || e->type == GgmlType::i8)
      fail(Status::format, "{}: integer tensor where floats are expected", e->origin);
    int64_t n = 1;
    for (int64_t v : e->ne) n *= v;
    const std::vector<uint8_t> raw = e->read();
    std::vector<float> out(static_cast<size_t>(n));
    backend::dequantize_row(e->type, raw.data(), out.data(), n);
    return out;
  }
  const CatalogEntry *entry(const std::string &name, std::vector<int64_t> ne) { return cat_.take(name, std::move(ne)); }
  bool has(const std::string &name) const { return cat_.has(name); }

 private:
  WeightCatalog &cat_;
  backend::Backend &be_;
  std::vector<DeviceBuffer> &bufs_;
  uint64_t &bytes_;
};

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

backend::Activation glu_activation(const KimiLinearConfig &c) {
  backend::Activation act;
  if (c.situ) {
    act.kind = backend::ActivationKind::situ;
    act.beta_g = c.situ_beta;
    act.beta_u = c.situ_linear_beta;
  } else {
    act.kind = backend::ActivationKind::swiglu;
    act.limit = 0.0f;  // plain SiLU-GLU
  }
  return act;
}

}  // namespace

std::unique_ptr<KimiLinearModel> KimiLinearModel::open(const std::string &path, backend::Backend &be,
                                                       const KimiLinearLoadOptions &options) {
  if (std::filesystem::path(path).extension() != ".gguf")
    fail(Status::unsupported, "{}: Kimi-Linear loads from GGUF only for now (no safetensors name map yet)", path);
  WeightCatalog cat = WeightCatalog::from_gguf(path);
  const KimiLinearConfig cfg = KimiLinearConfig::from_gguf(format::GgufSet::open(path));
  return std::make_unique<KimiLinearModel>(cfg, cat, be, options);
}

KimiLinearModel::~KimiLinearModel() = default;

KimiLinearModel::KimiLinearModel(const KimiLinearConfig &c, WeightCatalog &cat, backend::Backend &be,
                                 const KimiLinearLoadOptions &options)
    : cfg_(c), be_(be), w_(std::make_unique<Weights>()) {
  if (be.device() != Device::cpu)
    fail(Status::unsupported, "Kimi-Linear: the {} backend lacks the short-conv / KDA / attention ops; only the CPU backend "
                              "runs this model for now", backend::device_name(be.device()));
  c.validate(cat.source());
  KimiLoader ld(cat, be, w_->bufs, weight_bytes_);
  const int64_t D = c.hidden, V = c.vocab, H = c.n_heads, R = c.q_lora_rank, KVL = c.kv_lora_rank, QK = c.qk_head_dim(),
                NOPE = c.qk_nope_dim, ROPE = c.qk_rope_dim, VH = c.v_head_dim, KH = c.kda_heads, dk = c.kda_head_dim,
                Di = c.kda_inner(), CK = c.conv_kernel, E = c.n_experts, F = c.moe_ff, FS = c.moe_ff * c.n_shared_experts;
  w_->token_embd = ld.matrix("token_embd.weight", D, V);
  w_->output = ld.matrix("output.weight", D, V);
  w_->output_norm = ld.vec("output_norm.weight", D);
  if (c.attn_res_block_size > 0) w_->output_res = ld.host("output_res_score.weight", {D});
  const int64_t LAT = c.expert_latent_dim > 0 ? c.expert_latent_dim : D;
  auto resident = std::make_unique<ResidentExperts>(be);
  bool experts_ok = true;
  for (int64_t il = 0; il < c.n_layers; ++il) {
    const std::string b = fmt::format("blk.{}.", il);
    Weights::Layer L;
    L.attn_norm = ld.vec(b + "attn_norm.weight", D);
    L.ffn_norm = ld.vec(b + "ffn_norm.weight", D);
    if (c.attn_res_block_size > 0) {
      L.attn_res = ld.host(b + "attn_res_score.weight", {D});
      L.ffn_res = ld.host(b + "ffn_res_score.weight", {D});
    }
    if (c.mixer[static_cast<size_t>(il)] == KimiMixer::kda) {
      L.wq = ld.matrix(b + "attn_q.weight", D, Di);
      L.wk = ld.matrix(b + "attn_k.weight", D, Di);
      L.wv = ld.matrix(b + "attn_v.weight", D, Di);
      for (const char *x : {"q", "k", "v"}) {
        const std::vector<float> w = ld.host(b + "ssm_conv1d_" + x + ".weight", {CK, 1, Di});
        L.conv.insert(L.conv.end(), w.begin(), w.end());
      }
      L.f_a = ld.matrix(b + "ssm_f_a.weight", D, dk);
      L.f_b = ld.matrix(b + "ssm_f_b.weight", dk, Di);
      L.dt_bias = ld.host(b + "ssm_dt.bias", {Di});
      L.ssm_a = ld.host(b + "ssm_a", {KH});
      L.beta = ld.matrix(b + "ssm_beta.weight", D, KH);
      if (c.kda_full_rank_gate) {
        L.ssm_g = ld.matrix(b + "ssm_g.weight", D, Di);
      } else {
        L.g_a = ld.matrix(b + "ssm_g_a.weight", D, dk);
        L.g_b = ld.matrix(b + "ssm_g_b.weight", dk, Di);
      }
      L.o_norm = ld.host(b + "ssm_norm.weight", {dk});
      L.wo = ld.matrix(b + "attn_output.weight", Di, D);
    } else {
      if (R > 0) {
        L.q_a = ld.matrix(b + "attn_q_a.weight", D, R);
        L.q_a_norm = ld.vec(b + "attn_q_a_norm.weight", R);
        L.q_b = ld.matrix(b + "attn_q_b.weight", R, H * QK);
      } else {
        L.q = ld.matrix(b + "attn_q.weight", D, H * QK);
      }
      L.kv_a = ld.matrix(b + "attn_kv_a_mqa.weight", D, KVL + ROPE);
      L.kv_a_norm = ld.vec(b + "attn_kv_a_norm.weight", KVL);
      if (ld.has(b + "attn_kv_b.weight") || !ld.has(b + "attn_k_b.weight")) {
        L.kv_b = ld.matrix(b + "attn_kv_b.weight", KVL, H * (NOPE + VH));
      } else {
        // llama.cpp's split: k_b {nope, KVL, H} (each head's k part transposed), v_b {KVL, v, H};
        // rebuilt here as the f32 kv_b {KVL, H·(nope + v)}
        const std::vector<float> kb = ld.host(b + "attn_k_b.weight", {NOPE, KVL, H});
        const std::vector<float> vb = ld.host(b + "attn_v_b.weight", {KVL, VH, H});
        if (!kb.empty() && !vb.empty()) {
          std::vector<float> kvb(static_cast<size_t>(KVL * H * (NOPE + VH)));
          for (int64_t h = 0; h < H; ++h) {
            for (int64_t i = 0; i < NOPE; ++i)
              for (int64_t cc = 0; cc < KVL; ++cc)
                kvb[static_cast<size_t>((h * (NOPE + VH) + i) * KVL + cc)] = kb[static_cast<size_t>((h * KVL + cc) * NOPE + i)];
            for (int64_t j = 0; j < VH; ++j)
              std::memcpy(kvb.data() + (h * (NOPE + VH) + NOPE + j) * KVL, vb.data() + (h * VH + j) * KVL,
                          static_cast<size_t>(KVL) * 4);
          }
          L.kv_b = ld.upload(kvb.data(), GgmlType::f32, {KVL, H * (NOPE + VH)}, kvb.size() * 4);
        }
      }
      if (c.mla_output_gate) L.attn_gate = ld.matrix(b + "attn_gate.weight", D, H * VH);
      L.mla_o = ld.matrix(b + "attn_output.weight", H * VH, D);
    }
    if (!c.is_moe(il)) {
      L.ffn_gate = ld.matrix(b + "ffn_gate.weight", D, c.dense_ff);
      L.ffn_up = ld.matrix(b + "ffn_up.weight", D, c.dense_ff);
      L.ffn_down = ld.matrix(b + "ffn_down.weight", c.dense_ff, D);
      moe_index_.push_back(-1);
    } else {
      moe_index_.push_back(static_cast<int64_t>(expert_shapes_.size()));
      L.gate_inp = ld.matrix(b + "ffn_gate_inp.weight", D, E);
      L.bias = ld.vec(b + "exp_probs_b.bias", E);
      if (c.expert_latent_dim > 0) {
        L.routed_down = ld.matrix(b + "ffn_routed_down.weight", D, LAT);
        L.routed_up = ld.matrix(b + "ffn_routed_up.weight", LAT, D);
        if (ld.has(b + "ffn_routed_norm.weight")) L.routed_norm = ld.vec(b + "ffn_routed_norm.weight", LAT);
      }
      const CatalogEntry *ge = ld.entry(b + "ffn_gate_exps.weight", {LAT, F, E});
      const CatalogEntry *ue = ld.entry(b + "ffn_up_exps.weight", {LAT, F, E});
      const CatalogEntry *de = ld.entry(b + "ffn_down_exps.weight", {F, LAT, E});
      if (ge && ue && de && experts_ok) {
        expert_shapes_.push_back(expert_shape_of(*ge, *ue, *de));
        if (options.resident_experts) resident->add_layer(*ge, *ue, *de);
      } else {
        experts_ok = false;
      }
      if (FS > 0) {
        L.sh_gate = ld.matrix(b + "ffn_gate_shexp.weight", D, FS);
        L.sh_up = ld.matrix(b + "ffn_up_shexp.weight", D, FS);
        L.sh_down = ld.matrix(b + "ffn_down_shexp.weight", FS, D);
      }
    }
    w_->layers.push_back(std::move(L));
  }
  cat.finish();
  if (options.resident_experts) {
    weight_bytes_ += resident->bytes();
    experts_ = std::move(resident);
  }
  log::info("{} loaded from {} ({} KiB in backend memory)", c.summary(), cat.source(), weight_bytes_ >> 10);
}

KimiLinearState KimiLinearModel::new_state() const {
  const KimiLinearConfig &c = cfg_;
  KimiLinearState s;
  s.layers.resize(static_cast<size_t>(c.n_layers));
  for (int64_t il = 0; il < c.n_layers; ++il) {
    if (c.mixer[static_cast<size_t>(il)] != KimiMixer::kda) continue;
    KimiLayerState &l = s.layers[static_cast<size_t>(il)];
    l.conv.assign(static_cast<size_t>((c.conv_kernel - 1) * 3 * c.kda_inner()), 0.0f);
    l.S.assign(static_cast<size_t>(c.kda_heads * c.kda_head_dim * c.kda_head_dim), 0.0f);
  }
  return s;
}

void KimiLinearModel::kda(int64_t il, const float *x, int64_t n, KimiLayerState &st, float *out) {
  const KimiLinearConfig &c = cfg_;
  const Weights::Layer &L = w_->layers[static_cast<size_t>(il)];
  const int64_t D = c.hidden, KH = c.kda_heads, dk = c.kda_head_dim, Di = c.kda_inner();
  if (st.S.size() != static_cast<size_t>(KH * dk * dk) || st.conv.size() != static_cast<size_t>((c.conv_kernel - 1) * 3 * Di))
    fail(Status::invalid_argument, "Kimi-Linear layer {}: the state is not this model's (use new_state())", il);
  const Tensor xt = f32_view(x, {D, n});
  // projections, then q | k | v per token for the convolution
  std::vector<float> proj(static_cast<size_t>(Di * n)), mixed(static_cast<size_t>(3 * Di * n)),
      conv(static_cast<size_t>(3 * Di * n));
  const Tensor *w3[3] = {&L.wq, &L.wk, &L.wv};
  for (int64_t j = 0; j < 3; ++j) {
    be_.matmul(*w3[j], xt, f32_view(proj.data(), {Di, n}));
    for (int64_t t = 0; t < n; ++t)
      std::memcpy(mixed.data() + (t * 3 + j) * Di, proj.data() + t * Di, static_cast<size_t>(Di) * 4);
  }
  kimi::short_conv_silu(mixed.data(), n, 3 * Di, L.conv.data(), c.conv_kernel, st.conv.data(), conv.data());
  // decay, beta, output gate
  std::vector<float> fa(static_cast<size_t>(dk * n)), g(static_cast<size_t>(Di * n)), beta(static_cast<size_t>(KH * n)),
      gate(static_cast<size_t>(Di * n));
  be_.matmul(L.f_a, xt, f32_view(fa.data(), {dk, n}));
  be_.matmul(L.f_b, f32_view(fa.data(), {dk, n}), f32_view(g.data(), {Di, n}));
  be_.matmul(L.beta, xt, f32_view(beta.data(), {KH, n}));
  if (L.ssm_g.data) {
    be_.matmul(L.ssm_g, xt, f32_view(gate.data(), {Di, n}));
  } else {
    be_.matmul(L.g_a, xt, f32_view(fa.data(), {dk, n}));
    be_.matmul(L.g_b, f32_view(fa.data(), {dk, n}), f32_view(gate.data(), {Di, n}));
  }
  const float lb = c.kda_gate_lower_bound;
  // the recurrence, token by token, then the gated norm per head
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  std::vector<float> q(static_cast<size_t>(dk)), k(static_cast<size_t>(dk)), o(static_cast<size_t>(dk)),
      normed(static_cast<size_t>(Di * n));
  for (int64_t t = 0; t < n; ++t) {
    const float *row = conv.data() + t * 3 * Di;
    float *gt = g.data() + t * Di;
    for (int64_t ch = 0; ch < Di; ++ch) {
      const float a = L.ssm_a[static_cast<size_t>(ch / dk)], f = gt[ch] + L.dt_bias[static_cast<size_t>(ch)];
      // Kimi-Linear: −exp(A_log)·softplus(f); K3: lb·σ(exp(A_log)·f) (ssm_a = −exp(A_log))
      gt[ch] = lb < 0.0f ? lb * sigmoid(-a * f) : a * kimi::softplus20(f);
    }
    for (int64_t h = 0; h < KH; ++h) {
      std::memcpy(q.data(), row + h * dk, static_cast<size_t>(dk) * 4);
      std::memcpy(k.data(), row + Di + h * dk, static_cast<size_t>(dk) * 4);
      kimi::l2_normalize(q.data(), dk, 1e-6f);
      kimi::l2_normalize(k.data(), dk, 1e-6f);
      for (float &v : q) v *= q_scale;
      const float b = sigmoid(beta[static_cast<size_t>(t * KH + h)]);
      kimi::kda_step(st.S.data() + h * dk * dk, q.data(), k.data(), row + 2 * Di + h * dk, gt + h * dk, b, dk, dk, o.data());
      kimi::gated_rms_norm(o.data(), L.o_norm.data(), gate.data() + t * Di + h * dk, dk, c.rms_eps,
                           normed.data() + t * Di + h * dk);
    }
  }
  be_.matmul(L.wo, f32_view(normed.data(), {Di, n}), f32_view(out, {D, n}));
}

void KimiLinearModel::mla(int64_t il, const float *x, int64_t n, int64_t n_past, KimiLayerState &st, float *out) {
  const KimiLinearConfig &c = cfg_;
  const Weights::Layer &L = w_->layers[static_cast<size_t>(il)];
  const int64_t D = c.hidden, H = c.n_heads, R = c.q_lora_rank, KVL = c.kv_lora_rank, QK = c.qk_head_dim(),
                NOPE = c.qk_nope_dim, ROPE = c.qk_rope_dim, VH = c.v_head_dim;
  const Tensor xt = f32_view(x, {D, n});
  std::vector<float> q(static_cast<size_t>(H * QK * n));
  if (R > 0) {
    std::vector<float> qa(static_cast<size_t>(R * n));
    be_.matmul(L.q_a, xt, f32_view(qa.data(), {R, n}));
    be_.rms_norm(f32_view(qa.data(), {R, n}), &L.q_a_norm, c.rms_eps, f32_view(qa.data(), {R, n}));
    be_.matmul(L.q_b, f32_view(qa.data(), {R, n}), f32_view(q.data(), {H * QK, n}));
  } else {
    be_.matmul(L.q, xt, f32_view(q.data(), {H * QK, n}));
  }
  // compressed KV: [KVL | shared un-rotated key dims], the latent normalised, then expanded
  std::vector<float> ckv(static_cast<size_t>((KVL + ROPE) * n)), lat(static_cast<size_t>(KVL * n)),
      kv(static_cast<size_t>(H * (NOPE + VH) * n));
  be_.matmul(L.kv_a, xt, f32_view(ckv.data(), {KVL + ROPE, n}));
  for (int64_t t = 0; t < n; ++t) std::memcpy(lat.data() + t * KVL, ckv.data() + t * (KVL + ROPE), static_cast<size_t>(KVL) * 4);
  be_.rms_norm(f32_view(lat.data(), {KVL, n}), &L.kv_a_norm, c.rms_eps, f32_view(lat.data(), {KVL, n}));
  be_.matmul(L.kv_b, f32_view(lat.data(), {KVL, n}), f32_view(kv.data(), {H * (NOPE + VH), n}));
  const size_t k0 = st.keys.size(), v0 = st.values.size();
  st.keys.resize(k0 + static_cast<size_t>(n * H * QK));
  st.values.resize(v0 + static_cast<size_t>(n * H * VH));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const float *src = kv.data() + (t * H + h) * (NOPE + VH);
      float *kd = st.keys.data() + k0 + static_cast<size_t>((t * H + h) * QK);
      std::memcpy(kd, src, static_cast<size_t>(NOPE) * 4);
      std::memcpy(kd + NOPE, ckv.data() + t * (KVL + ROPE) + KVL, static_cast<size_t>(ROPE) * 4);
      std::memcpy(st.values.data() + v0 + static_cast<size_t>((t * H + h) * VH), src + NOPE, static_cast<size_t>(VH) * 4);
    }
  if (static_cast<int64_t>(st.keys.size()) != (n_past + n) * H * QK)
    fail(Status::internal, "Kimi-Linear layer {}: MLA cache holds {} floats, expected {} tokens", il, st.keys.size(), n_past + n);
  std::vector<float> att(static_cast<size_t>(H * VH * n));
  kimi::causal_attention(q.data(), n, n_past, H, QK, VH, st.keys.data(), st.values.data(),
                         1.0f / std::sqrt(static_cast<float>(QK)), att.data());
  if (L.attn_gate.data) {  // K3: the output gate σ(W_gate·x) per head and value dim
    std::vector<float> gt(static_cast<size_t>(H * VH * n));
    be_.matmul(L.attn_gate, xt, f32_view(gt.data(), {H * VH, n}));
    for (size_t i = 0; i < att.size(); ++i) att[i] *= sigmoid(gt[i]);
  }
  be_.matmul(L.mla_o, f32_view(att.data(), {H * VH, n}), f32_view(out, {D, n}));
}

void KimiLinearModel::ffn(int64_t il, const float *x, int64_t n, float *out) {
  const KimiLinearConfig &c = cfg_;
  const Weights::Layer &L = w_->layers[static_cast<size_t>(il)];
  const int64_t D = c.hidden;
  const backend::Activation act = glu_activation(c);
  if (!c.is_moe(il)) {
    be_.ffn(f32_view(x, {D, n}), L.ffn_gate, L.ffn_up, L.ffn_down, act, f32_view(out, {D, n}));
    return;
  }
  const int64_t E = c.n_experts, K = c.n_experts_used, mi = moe_index_[static_cast<size_t>(il)];
  std::vector<float> logits(static_cast<size_t>(E * n)), wts(static_cast<size_t>(K * n));
  std::vector<int32_t> ids(static_cast<size_t>(K * n));
  be_.matmul(L.gate_inp, f32_view(x, {D, n}), f32_view(logits.data(), {E, n}));
  backend::RouterParams rp;
  rp.scoring = backend::Scoring::sigmoid;
  rp.k = static_cast<int32_t>(K);
  rp.renormalize = c.norm_topk;
  rp.scale = c.routed_scale;
  rp.bias = &L.bias;
  be_.route(f32_view(logits.data(), {E, n}), rp, Tensor::make(ids.data(), GgmlType::i32, Device::cpu, {K, n}),
            f32_view(wts.data(), {K, n}));
  if (!experts_) fail(Status::internal, "Kimi-Linear: no routed-expert provider (set_experts() was not called)");
  // K3 latent MoE: the experts run on routed_down(x) and write a latent result
  const int64_t DX = c.expert_latent_dim > 0 ? c.expert_latent_dim : D;
  std::vector<float> xl, yl;
  const float *xe = x;
  float *ye = out;
  if (c.expert_latent_dim > 0) {
    xl.resize(static_cast<size_t>(DX * n));
    yl.resize(static_cast<size_t>(DX * n));
    be_.matmul(L.routed_down, f32_view(x, {D, n}), f32_view(xl.data(), {DX, n}));
    xe = xl.data();
    ye = yl.data();
  }
  // tokens in chunks whose distinct experts fit one acquire (the CPU moe op is per token)
  const int64_t max_unique = std::max<int64_t>(experts_->max_unique(), K);
  std::vector<uint8_t> seen(static_cast<size_t>(E));
  for (int64_t t0 = 0; t0 < n;) {
    std::fill(seen.begin(), seen.end(), 0);
    int64_t t1 = t0, distinct = 0;
    while (t1 < n) {
      int64_t add = 0;
      std::vector<int32_t> fresh;
      for (int64_t j = 0; j < K; ++j) {
        const int32_t e = ids[static_cast<size_t>(t1 * K + j)];
        if (e >= 0 && e < E && !seen[static_cast<size_t>(e)] && std::find(fresh.begin(), fresh.end(), e) == fresh.end()) {
          fresh.push_back(e);
          ++add;
        }
      }
      if (t1 > t0 && distinct + add > max_unique) break;
      for (int32_t e : fresh) seen[static_cast<size_t>(e)] = 1;
      distinct += add;
      ++t1;
    }
    const int64_t m = t1 - t0;
    const backend::ExpertSlots slots = experts_->acquire(mi, ids.data() + t0 * K, K * m);
    try {
      be_.moe(f32_view(xe + t0 * DX, {DX, m}), Tensor::make(ids.data() + t0 * K, GgmlType::i32, Device::cpu, {K, m}),
              f32_view(wts.data() + t0 * K, {K, m}), slots, experts_->layout(mi), act, f32_view(ye + t0 * DX, {DX, m}));
    } catch (...) {
      experts_->release(mi);
      throw;
    }
    experts_->release(mi);
    t0 = t1;
  }
  if (c.expert_latent_dim > 0) {
    be_.rms_norm(f32_view(yl.data(), {DX, n}), L.routed_norm.data ? &L.routed_norm : nullptr, c.rms_eps,
                 f32_view(yl.data(), {DX, n}));
    be_.matmul(L.routed_up, f32_view(yl.data(), {DX, n}), f32_view(out, {D, n}));
  }
  if (c.n_shared_experts > 0) {
    std::vector<float> shared(static_cast<size_t>(D * n));
    be_.ffn(f32_view(x, {D, n}), L.sh_gate, L.sh_up, L.sh_down, act, f32_view(shared.data(), {D, n}));
    be_.add(f32_view(out, {D, n}), f32_view(shared.data(), {D, n}), f32_view(out, {D, n}));
  }
}

void KimiLinearModel::forward(const int32_t *tokens, int64_t n, KimiLinearState &state, float *logits) {
  const KimiLinearConfig &c = cfg_;
  if (n <= 0) return;
  if (static_cast<int64_t>(state.layers.size()) != c.n_layers)
    fail(Status::invalid_argument, "Kimi-Linear forward: state has {} layers, the model {}", state.layers.size(), c.n_layers);
  for (int64_t t = 0; t < n; ++t)
    if (tokens[t] < 0 || tokens[t] >= c.vocab)
      fail(Status::invalid_argument, "Kimi-Linear forward: token {} at {} is outside 0..{}", tokens[t], t, c.vocab - 1);
  const int64_t D = c.hidden, V = c.vocab;
  std::vector<float> h(static_cast<size_t>(D * n)), xn(static_cast<size_t>(D * n)), y(static_cast<size_t>(D * n));
  be_.embed(w_->token_embd, Tensor::make(tokens, GgmlType::i32, Device::cpu, {n}), f32_view(h.data(), {D, n}));
  const Tensor ht = f32_view(h.data(), {D, n}), xt = f32_view(xn.data(), {D, n}), yt = f32_view(y.data(), {D, n});
  // K3 AttnRes: block sums banked per token; each sublayer input is a softmax mix of them and the
  // current stream (docs/models/kimi-k3.md)
  const int64_t B = c.attn_res_block_size;
  std::vector<std::vector<float>> banked;
  std::vector<float> mixed(B > 0 ? static_cast<size_t>(D * n) : 0);
  std::vector<const float *> srcs;
  auto mix = [&](const std::vector<float> &w) -> Tensor {
    for (int64_t t = 0; t < n; ++t) {
      srcs.clear();
      for (const auto &bk : banked) srcs.push_back(bk.data() + t * D);
      srcs.push_back(h.data() + t * D);
      kimi::attn_res_mix(srcs.data(), static_cast<int64_t>(srcs.size()), D, w.data(), c.rms_eps, mixed.data() + t * D);
    }
    return f32_view(mixed.data(), {D, n});
  };
  for (int64_t il = 0; il < c.n_layers; ++il) {
    const Weights::Layer &L = w_->layers[static_cast<size_t>(il)];
    KimiLayerState &st = state.layers[static_cast<size_t>(il)];
    be_.rms_norm(B > 0 ? mix(L.attn_res) : ht, &L.attn_norm, c.rms_eps, xt);
    if (c.mixer[static_cast<size_t>(il)] == KimiMixer::kda)
      kda(il, xn.data(), n, st, y.data());
    else
      mla(il, xn.data(), n, state.n_past, st, y.data());
    if (B > 0 && il % B == 0) {
      banked.push_back(h);  // the raw layer input; the stream restarts from the attention output
      std::copy(y.begin(), y.end(), h.begin());
    } else {
      be_.add(ht, yt, ht);
    }
    be_.rms_norm(B > 0 ? mix(L.ffn_res) : ht, &L.ffn_norm, c.rms_eps, xt);
    ffn(il, xn.data(), n, y.data());
    be_.add(ht, yt, ht);
  }
  state.n_past += n;
  if (!logits) return;
  if (B > 0) {
    mix(w_->output_res);
    std::copy(mixed.begin(), mixed.end(), h.begin());
  }
  be_.rms_norm(ht, &w_->output_norm, c.rms_eps, xt);
  be_.matmul(w_->output, xt, f32_view(logits, {V, n}));
}

}  // namespace ep::model
