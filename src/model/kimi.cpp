#include "model/kimi.hpp"

#include "backend/dequant.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "experts/sharded_experts.hpp"
#include "experts/runner.hpp"
#include "format/file_format.hpp"
#include "format/gguf.hpp"
#include "model/stacked_experts.hpp"
#include "model/weight_catalog.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

namespace ep::model {

using backend::Device;
using backend::GgmlType;
using backend::Tensor;

struct KimiModel::Weights {
  std::vector<DeviceBuffer> bufs;
  struct Layer {
    Tensor attn_norm, ffn_norm;
    // KDA
    Tensor wq, wk, wv, f_a, f_b, beta, g_a, g_b, wo;
    Tensor conv[3];  // q, k, v: f32 [kernel, Di]
    Tensor dt_bias;  // f32 [Di]
    Tensor ssm_a;    // f32 [H] = −exp(A_log)
    Tensor o_norm;   // f32 [dk]
    // MLA
    Tensor q, q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b, mla_o;
    // FFN
    Tensor ffn_gate, ffn_up, ffn_down;
    Tensor gate_inp, bias, sh_gate, sh_up, sh_down;
    // Kimi-K3
    Tensor attn_res, ffn_res;  // AttnRes score vectors f32 [D]
    Tensor ssm_g, attn_gate, routed_down, routed_up, routed_norm;
  };
  Tensor token_embd, output, output_norm;
  Tensor output_res;
  std::vector<Layer> layers;
};

namespace {

Tensor dev_f32(Device d, const float *p, std::initializer_list<int64_t> shape) { return Tensor::make(p, GgmlType::f32, d, shape); }
Tensor dev_i32(Device d, const int32_t *p, std::initializer_list<int64_t> shape) { return Tensor::make(p, GgmlType::i32, d, shape); }

class KimiLoader : public WeightUploader {
 public:
  using WeightUploader::WeightUploader;
  /// A matmul / embedding weight {ne0, ne1}, kept in its file type.
  Tensor matrix(const std::string &name, int64_t ne0, int64_t ne1) {
    const CatalogEntry *e = cat_.take(name, {ne0, ne1});
    if (!e) return {};
    if (!backend::is_supported_weight_type(e->type))
      fail(Status::unsupported, "{}: ggml type {} is not supported for weights", e->origin, static_cast<uint32_t>(e->type));
    const std::vector<uint8_t> raw = e->read();
    return upload(raw.data(), e->type, {ne0, ne1}, raw.size());
  }
  /// A vector used by backend ops (norm weights, router bias, dt bias, A), converted to f32.
  Tensor vec(const std::string &name, int64_t n) {
    const std::vector<float> v = host(name, {n});
    if (v.empty()) return {};
    return upload(v.data(), GgmlType::f32, {n}, v.size() * 4);
  }
  /// A tensor of file shape @p ne converted to f32 and uploaded with shape @p shape (same count).
  Tensor f32(const std::string &name, std::vector<int64_t> ne, std::initializer_list<int64_t> shape) {
    const std::vector<float> v = host(name, std::move(ne));
    if (v.empty()) return {};
    return upload(v.data(), GgmlType::f32, shape, v.size() * 4);
  }
  /// Values read on the host, converted to f32.
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
};

backend::Activation glu_activation(const KimiConfig &c) {
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

std::unique_ptr<KimiModel> KimiModel::open(const std::string &path, backend::Backend &be, const KimiLoadOptions &options) {
  if (format::detect_file_format(path) == format::FileFormat::gguf) {
    WeightCatalog cat = WeightCatalog::from_gguf(path);
    const KimiConfig cfg = KimiConfig::from_gguf(format::GgufSet::open(path));
    return std::make_unique<KimiModel>(cfg, cat, be, options);
  }
  const SafetensorsCheckpoint ck = open_safetensors_checkpoint(path, "Kimi");
  const KimiConfig cfg = KimiConfig::from_hf_json(ck.config_text, ck.config_path);
  WeightCatalog cat = WeightCatalog::from_kimi_safetensors(ck.weights, cfg, ck.quant);
  return std::make_unique<KimiModel>(cfg, cat, be, options);
}

KimiModel::~KimiModel() = default;

KimiModel::KimiModel(const KimiConfig &c, WeightCatalog &cat, backend::Backend &be,
                                 const KimiLoadOptions &options)
    : cfg_(c), be_(be), w_(std::make_unique<Weights>()), fwd_scratch_(std::make_unique<BackendScratch>(be)),
      site_scratch_(std::make_unique<BackendScratch>(be)) {
  c.validate(cat.source());
  cat.set_model("Kimi");
  KimiLoader ld(cat, be, w_->bufs, weight_bytes_);
  const int64_t D = c.hidden, V = c.vocab, H = c.n_heads, R = c.q_lora_rank, KVL = c.kv_lora_rank, QK = c.qk_head_dim(),
                NOPE = c.qk_nope_dim, ROPE = c.qk_rope_dim, VH = c.v_head_dim, KH = c.kda_heads, dk = c.kda_head_dim,
                Di = c.kda_inner(), CK = c.conv_kernel, E = c.n_experts, F = c.moe_ff, FS = c.moe_ff * c.n_shared_experts;
  w_->token_embd = ld.matrix("token_embd.weight", D, V);
  w_->output = ld.matrix("output.weight", D, V);
  w_->output_norm = ld.vec("output_norm.weight", D);
  if (c.attn_res_block_size > 0) w_->output_res = ld.vec("output_res_score.weight", D);
  const int64_t LAT = c.expert_latent_dim > 0 ? c.expert_latent_dim : D;
  experts::ResidentShards resident(be, options.expert_devices);
  bool experts_ok = true;
  for (int64_t il = 0; il < c.n_layers; ++il) {
    const std::string b = fmt::format("blk.{}.", il);
    Weights::Layer L;
    L.attn_norm = ld.vec(b + "attn_norm.weight", D);
    L.ffn_norm = ld.vec(b + "ffn_norm.weight", D);
    if (c.attn_res_block_size > 0) {
      L.attn_res = ld.vec(b + "attn_res_score.weight", D);
      L.ffn_res = ld.vec(b + "ffn_res_score.weight", D);
    }
    if (c.mixer[static_cast<size_t>(il)] == KimiMixer::kda) {
      L.wq = ld.matrix(b + "attn_q.weight", D, Di);
      L.wk = ld.matrix(b + "attn_k.weight", D, Di);
      L.wv = ld.matrix(b + "attn_v.weight", D, Di);
      const char *const qkv[3] = {"q", "k", "v"};
      for (int j = 0; j < 3; ++j) L.conv[j] = ld.f32(b + "ssm_conv1d_" + qkv[j] + ".weight", {CK, 1, Di}, {CK, Di});
      L.f_a = ld.matrix(b + "ssm_f_a.weight", D, dk);
      L.f_b = ld.matrix(b + "ssm_f_b.weight", dk, Di);
      L.dt_bias = ld.vec(b + "ssm_dt.bias", Di);
      L.ssm_a = ld.vec(b + "ssm_a", KH);
      L.beta = ld.matrix(b + "ssm_beta.weight", D, KH);
      if (c.kda_full_rank_gate) {
        L.ssm_g = ld.matrix(b + "ssm_g.weight", D, Di);
      } else {
        L.g_a = ld.matrix(b + "ssm_g_a.weight", D, dk);
        L.g_b = ld.matrix(b + "ssm_g_b.weight", dk, Di);
      }
      L.o_norm = ld.vec(b + "ssm_norm.weight", dk);
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
        const experts::StackedRole gr = stacked_role(*ge), ur = stacked_role(*ue), dr = stacked_role(*de);
        expert_shapes_.push_back(experts::expert_shape_of(gr, ur, dr));
        if (options.resident_experts) resident.add_layer(gr, ur, dr);
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
    weight_bytes_ += resident.bytes();
    experts_ = resident.finish();
  }
  log::info("{} loaded from {} ({} KiB in backend memory)", c.summary(), cat.source(), weight_bytes_ >> 10);
}


KimiState KimiModel::new_state() const {
  const KimiConfig &c = cfg_;
  KimiState s;
  s.model = this;
  s.layers.resize(static_cast<size_t>(c.n_layers));
  for (int64_t il = 0; il < c.n_layers; ++il) {
    if (c.mixer[static_cast<size_t>(il)] != KimiMixer::kda) continue;
    KimiLayerState &l = s.layers[static_cast<size_t>(il)];
    l.conv = StateBuffer(be_, static_cast<uint64_t>(3 * (c.conv_kernel - 1) * c.kda_inner()) * 4);
    l.S = StateBuffer(be_, static_cast<uint64_t>(c.kda_heads * c.kda_head_dim * c.kda_head_dim) * 4);
  }
  return s;
}

uint64_t KimiModel::state_bytes(int64_t tokens) const {
  const KimiConfig &c = cfg_;
  uint64_t b = 0;
  for (int64_t il = 0; il < c.n_layers; ++il) {
    if (c.mixer[static_cast<size_t>(il)] == KimiMixer::kda) {
      b += static_cast<uint64_t>(3 * (c.conv_kernel - 1) * c.kda_inner() + c.kda_heads * c.kda_head_dim * c.kda_head_dim) * 4;
    } else if (tokens > 0) {
      b += static_cast<uint64_t>(state_capacity(tokens) * c.n_heads * (c.qk_head_dim() + c.v_head_dim)) * 4;
    }
  }
  return b;
}

void KimiModel::check_state(const KimiState &state) const {
  const KimiConfig &c = cfg_;
  if (state.model != this || static_cast<int64_t>(state.layers.size()) != c.n_layers)
    fail(Status::invalid_argument, "Kimi-Linear forward: the state ({} layers) is not this model's ({} layers; use new_state())",
         state.layers.size(), c.n_layers);
  for (int64_t il = 0; il < c.n_layers; ++il) {
    const KimiLayerState &st = state.layers[static_cast<size_t>(il)];
    bool ok = true;
    if (c.mixer[static_cast<size_t>(il)] == KimiMixer::kda) {
      ok = st.conv.owner() == &be_ && st.S.owner() == &be_ &&
           st.conv.bytes() == static_cast<uint64_t>(3 * (c.conv_kernel - 1) * c.kda_inner()) * 4 &&
           st.S.bytes() == static_cast<uint64_t>(c.kda_heads * c.kda_head_dim * c.kda_head_dim) * 4;
    } else {
      ok = st.capacity >= state.n_past &&
           st.keys.bytes() == static_cast<uint64_t>(st.capacity * c.n_heads * c.qk_head_dim()) * 4 &&
           st.values.bytes() == static_cast<uint64_t>(st.capacity * c.n_heads * c.v_head_dim) * 4 &&
           (st.capacity == 0 || (st.keys.owner() == &be_ && st.values.owner() == &be_));
    }
    if (!ok) fail(Status::invalid_argument, "Kimi-Linear layer {}: the state is not this model's (use new_state())", il);
  }
}

void KimiModel::kda(int64_t il, const float *x, int64_t n, std::span<const MixerSeq> seqs, float *out) {
  const KimiConfig &c = cfg_;
  const Weights::Layer &L = w_->layers[static_cast<size_t>(il)];
  const Device dv = be_.device();
  BackendScratch &sc = *site_scratch_;
  sc.reset();
  const int64_t D = c.hidden, KH = c.kda_heads, dk = c.kda_head_dim, Di = c.kda_inner(), hist = c.conv_kernel - 1;
  const Tensor xt = dev_f32(dv, x, {D, n});
  // q, k, v: projection, then the short convolution + SiLU continuing each sequence's state rows
  float *proj[3] = {sc.f32(Di * n), sc.f32(Di * n), sc.f32(Di * n)}, *qkv[3] = {sc.f32(Di * n), sc.f32(Di * n), sc.f32(Di * n)};
  const Tensor *w3[3] = {&L.wq, &L.wk, &L.wv};
  for (int64_t j = 0; j < 3; ++j) {
    be_.matmul(*w3[j], xt, dev_f32(dv, proj[j], {Di, n}));
    for (const MixerSeq &s : seqs)
      be_.short_conv_silu(dev_f32(dv, proj[j] + s.offset * Di, {Di, s.n}), L.conv[j],
                          dev_f32(dv, s.state->conv.f32() + j * hist * Di, {Di, hist}), dev_f32(dv, qkv[j] + s.offset * Di, {Di, s.n}));
  }
  // decay, beta, output gate
  float *fa = sc.f32(dk * n), *g = sc.f32(Di * n), *beta = sc.f32(KH * n), *gate = sc.f32(Di * n), *o = sc.f32(Di * n);
  be_.matmul(L.f_a, xt, dev_f32(dv, fa, {dk, n}));
  be_.matmul(L.f_b, dev_f32(dv, fa, {dk, n}), dev_f32(dv, g, {Di, n}));
  be_.matmul(L.beta, xt, dev_f32(dv, beta, {KH, n}));
  if (L.ssm_g.data) {
    be_.matmul(L.ssm_g, xt, dev_f32(dv, gate, {Di, n}));
  } else {
    be_.matmul(L.g_a, xt, dev_f32(dv, fa, {dk, n}));
    be_.matmul(L.g_b, dev_f32(dv, fa, {dk, n}), dev_f32(dv, gate, {Di, n}));
  }
  // Kimi-Linear: −exp(A_log)·softplus(f + dt); K3: lb·σ(exp(A_log)·(f + dt)) (ssm_a = −exp(A_log))
  const Tensor g3 = dev_f32(dv, g, {dk, KH, n});
  be_.kda_gate(g3, L.dt_bias, L.ssm_a, c.kda_gate_lower_bound, g3);
  const Tensor q_rows = dev_f32(dv, qkv[0], {dk, KH * n}), k_rows = dev_f32(dv, qkv[1], {dk, KH * n});
  be_.l2_normalize(q_rows, 1e-6f, 1.0f / std::sqrt(static_cast<float>(dk)), q_rows);
  be_.l2_normalize(k_rows, 1e-6f, 1.0f, k_rows);
  be_.sigmoid(dev_f32(dv, beta, {KH, n}), dev_f32(dv, beta, {KH, n}));
  // the recurrence over each sequence's tokens in order, on its state; then the gated norm per head
  for (const MixerSeq &s : seqs) {
    const int64_t at = s.offset * Di;
    be_.kda_recurrence(dev_f32(dv, qkv[0] + at, {dk, KH, s.n}), dev_f32(dv, qkv[1] + at, {dk, KH, s.n}),
                       dev_f32(dv, qkv[2] + at, {dk, KH, s.n}), dev_f32(dv, g + at, {dk, KH, s.n}),
                       dev_f32(dv, beta + s.offset * KH, {KH, s.n}), dev_f32(dv, s.state->S.f32(), {dk, dk, KH}),
                       dev_f32(dv, o + at, {dk, KH, s.n}));
  }
  const Tensor o_rows = dev_f32(dv, o, {dk, KH * n});
  be_.gated_rms_norm(o_rows, L.o_norm, dev_f32(dv, gate, {dk, KH * n}), c.rms_eps, o_rows);
  be_.matmul(L.wo, dev_f32(dv, o, {Di, n}), dev_f32(dv, out, {D, n}));
}

void KimiModel::mla(int64_t il, const float *x, int64_t n, std::span<const MixerSeq> seqs, float *out) {
  const KimiConfig &c = cfg_;
  const Weights::Layer &L = w_->layers[static_cast<size_t>(il)];
  const Device dv = be_.device();
  BackendScratch &sc = *site_scratch_;
  sc.reset();
  const int64_t D = c.hidden, H = c.n_heads, R = c.q_lora_rank, KVL = c.kv_lora_rank, QK = c.qk_head_dim(),
                NOPE = c.qk_nope_dim, ROPE = c.qk_rope_dim, VH = c.v_head_dim;
  const Tensor xt = dev_f32(dv, x, {D, n});
  float *q = sc.f32(H * QK * n);
  if (R > 0) {
    float *qa = sc.f32(R * n);
    be_.matmul(L.q_a, xt, dev_f32(dv, qa, {R, n}));
    be_.rms_norm(dev_f32(dv, qa, {R, n}), &L.q_a_norm, c.rms_eps, dev_f32(dv, qa, {R, n}));
    be_.matmul(L.q_b, dev_f32(dv, qa, {R, n}), dev_f32(dv, q, {H * QK, n}));
  } else {
    be_.matmul(L.q, xt, dev_f32(dv, q, {H * QK, n}));
  }
  // compressed KV: [KVL | shared un-rotated key dims], the latent normalised, then expanded
  float *ckv = sc.f32((KVL + ROPE) * n), *lat = sc.f32(KVL * n), *kv = sc.f32(H * (NOPE + VH) * n);
  be_.matmul(L.kv_a, xt, dev_f32(dv, ckv, {KVL + ROPE, n}));
  be_.copy_2d(lat, static_cast<uint64_t>(KVL) * 4, ckv, static_cast<uint64_t>(KVL + ROPE) * 4, static_cast<uint64_t>(KVL) * 4,
              static_cast<uint64_t>(n));
  be_.rms_norm(dev_f32(dv, lat, {KVL, n}), &L.kv_a_norm, c.rms_eps, dev_f32(dv, lat, {KVL, n}));
  be_.matmul(L.kv_b, dev_f32(dv, lat, {KVL, n}), dev_f32(dv, kv, {H * (NOPE + VH), n}));
  float *att = sc.f32(H * VH * n);
  for (const MixerSeq &s : seqs) {
    KimiLayerState &st = *s.state;
    const int64_t n_past = s.n_past, m = s.n;
    // the cache grows to state_capacity rows (at most 1/8 unused); a copy keeps the rows so far
    if (n_past + m > st.capacity) {
      const int64_t cap = state_capacity(n_past + m);
      StateBuffer keys(be_, static_cast<uint64_t>(cap * H * QK) * 4), values(be_, static_cast<uint64_t>(cap * H * VH) * 4);
      if (n_past > 0) {
        be_.copy(dev_f32(dv, st.keys.f32(), {n_past * H * QK}), dev_f32(dv, keys.f32(), {n_past * H * QK}));
        be_.copy(dev_f32(dv, st.values.f32(), {n_past * H * VH}), dev_f32(dv, values.f32(), {n_past * H * VH}));
      }
      st.keys = std::move(keys);
      st.values = std::move(values);
      st.capacity = cap;
    }
    // keys (t, h) = [kv nope part | the shared un-rotated dims], values (t, h) = kv value part
    float *keys_new = st.keys.f32() + n_past * H * QK, *values_new = st.values.f32() + n_past * H * VH;
    const float *kv_s = kv + s.offset * H * (NOPE + VH), *ckv_s = ckv + s.offset * (KVL + ROPE);
    const uint64_t kv_pitch = static_cast<uint64_t>(NOPE + VH) * 4, rows = static_cast<uint64_t>(m * H);
    if (NOPE > 0) be_.copy_2d(keys_new, static_cast<uint64_t>(QK) * 4, kv_s, kv_pitch, static_cast<uint64_t>(NOPE) * 4, rows);
    if (ROPE > 0)
      for (int64_t h = 0; h < H; ++h)
        be_.copy_2d(keys_new + h * QK + NOPE, static_cast<uint64_t>(H * QK) * 4, ckv_s + KVL, static_cast<uint64_t>(KVL + ROPE) * 4,
                    static_cast<uint64_t>(ROPE) * 4, static_cast<uint64_t>(m));
    be_.copy_2d(values_new, static_cast<uint64_t>(VH) * 4, kv_s + NOPE, kv_pitch, static_cast<uint64_t>(VH) * 4, rows);
    be_.causal_attention(dev_f32(dv, q + s.offset * H * QK, {QK, H, m}), dev_f32(dv, st.keys.f32(), {QK, H, n_past + m}),
                         dev_f32(dv, st.values.f32(), {VH, H, n_past + m}), n_past, 1.0f / std::sqrt(static_cast<float>(QK)),
                         dev_f32(dv, att + s.offset * H * VH, {VH, H, m}));
  }
  if (L.attn_gate.data) {  // K3: the output gate σ(W_gate·x) per head and value dim
    float *gt = sc.f32(H * VH * n);
    const Tensor gt_t = dev_f32(dv, gt, {H * VH, n}), att_t = dev_f32(dv, att, {H * VH, n});
    be_.matmul(L.attn_gate, xt, gt_t);
    be_.sigmoid(gt_t, gt_t);
    be_.mul(att_t, gt_t, att_t);
  }
  be_.matmul(L.mla_o, dev_f32(dv, att, {H * VH, n}), dev_f32(dv, out, {D, n}));
}

void KimiModel::ffn(int64_t il, const float *x, int64_t n, float *out) {
  const KimiConfig &c = cfg_;
  const Weights::Layer &L = w_->layers[static_cast<size_t>(il)];
  const Device dv = be_.device();
  BackendScratch &sc = *site_scratch_;
  sc.reset();
  const int64_t D = c.hidden;
  const backend::Activation act = glu_activation(c);
  if (!c.is_moe(il)) {
    be_.ffn(dev_f32(dv, x, {D, n}), L.ffn_gate, L.ffn_up, L.ffn_down, act, dev_f32(dv, out, {D, n}));
    return;
  }
  const int64_t E = c.n_experts, K = c.n_experts_used, mi = moe_index_[static_cast<size_t>(il)];
  if (!experts_) fail(Status::internal, "Kimi-Linear: no routed-expert provider (set_experts() was not called)");
  // The router of block l on x: its picks (ids) and weights.
  experts::MoeLayer ml;
  ml.layer = mi;
  ml.next_layer = il + 1 < c.n_layers && c.is_moe(il + 1) ? moe_index_[static_cast<size_t>(il + 1)] : -1;
  ml.route = [&](bool next) {
    const int64_t layer = next ? il + 1 : il;
    const Weights::Layer &RL = w_->layers[static_cast<size_t>(layer)];
    log::trace("Kimi layer {}: the router over {} tokens{}", layer, n, next ? " (a prefetch hint)" : "");
    float *lg = sc.f32(E * n), *w = sc.f32(K * n);
    int32_t *ids = sc.i32(K * n);
    be_.matmul(RL.gate_inp, dev_f32(dv, x, {D, n}), dev_f32(dv, lg, {E, n}));
    backend::RouterParams rp;
    rp.scoring = backend::Scoring::sigmoid;
    rp.k = static_cast<int32_t>(K);
    rp.renormalize = c.norm_topk;
    rp.scale = c.routed_scale;
    rp.bias = &RL.bias;
    experts::Routed r{dev_i32(dv, ids, {K, n}), dev_f32(dv, w, {K, n})};
    be_.route(dev_f32(dv, lg, {E, n}), rp, r.ids, r.weights);
    return r;
  };
  // The ids travel to the host (when the provider needs them there) while the latent projection
  // and the shared experts are queued.
  const experts::MoeStep step = experts::start_moe(be_, *experts_, ml);
  // K3 latent MoE: the experts run on routed_down(x) and write a latent result
  const int64_t DX = c.expert_latent_dim > 0 ? c.expert_latent_dim : D;
  const float *xe = x;
  float *ye = out;
  if (c.expert_latent_dim > 0) {
    float *xl = sc.f32(DX * n);
    ye = sc.f32(DX * n);
    be_.matmul(L.routed_down, dev_f32(dv, x, {D, n}), dev_f32(dv, xl, {DX, n}));
    xe = xl;
  }
  float *shared = c.n_shared_experts > 0 ? sc.f32(D * n) : nullptr;
  if (shared) be_.ffn(dev_f32(dv, x, {D, n}), L.sh_gate, L.sh_up, L.sh_down, act, dev_f32(dv, shared, {D, n}));
  experts::finish_moe(be_, *experts_, step, xe, ye, DX, act);
  if (c.expert_latent_dim > 0) {
    be_.rms_norm(dev_f32(dv, ye, {DX, n}), L.routed_norm.data ? &L.routed_norm : nullptr, c.rms_eps, dev_f32(dv, ye, {DX, n}));
    be_.matmul(L.routed_up, dev_f32(dv, ye, {DX, n}), dev_f32(dv, out, {D, n}));
  }
  if (shared) be_.add(dev_f32(dv, out, {D, n}), dev_f32(dv, shared, {D, n}), dev_f32(dv, out, {D, n}));
}

void KimiModel::forward(const int32_t *tokens, int64_t n, KimiState &state, float *logits) {
  const Tensor out = forward(tokens, n, state, logits ? LogitRows::all : LogitRows::none);
  if (logits && out.data) be_.download(logits, out.data, out.n_bytes());
}

Tensor KimiModel::forward(const int32_t *tokens, int64_t n, KimiState &state, LogitRows rows) {
  if (n <= 0) return {};
  const int64_t offsets[2] = {0, n};
  KimiState *states[1] = {&state};
  return forward_batch(std::span<const int32_t>(tokens, static_cast<size_t>(n)), offsets, states, rows);
}

Tensor KimiModel::forward_batch(std::span<const int32_t> tokens_in, std::span<const int64_t> offsets,
                                std::span<KimiState *const> states, LogitRows rows) {
  const KimiConfig &c = cfg_;
  const int64_t S = static_cast<int64_t>(states.size()), n = static_cast<int64_t>(tokens_in.size());
  const int32_t *tokens = tokens_in.data();
  if (S == 0 || offsets.size() != states.size() + 1 || offsets.front() != 0 || offsets.back() != n)
    fail(Status::invalid_argument, "Kimi forward: {} sequence offsets for {} states and {} tokens", offsets.size(), S, n);
  for (int64_t i = 0; i < S; ++i) {
    check_state(*states[static_cast<size_t>(i)]);
    if (offsets[static_cast<size_t>(i) + 1] <= offsets[static_cast<size_t>(i)])
      fail(Status::invalid_argument, "Kimi forward: sequence {} has no tokens", i);
    for (int64_t j = 0; j < i; ++j)
      if (states[static_cast<size_t>(j)] == states[static_cast<size_t>(i)])
        fail(Status::invalid_argument, "Kimi forward: sequences {} and {} share one state", j, i);
  }
  for (int64_t t = 0; t < n; ++t)
    if (tokens[t] < 0 || tokens[t] >= c.vocab)
      fail(Status::invalid_argument, "Kimi-Linear forward: token {} at {} is outside 0..{}", tokens[t], t, c.vocab - 1);
  const Device dv = be_.device();
  const int64_t D = c.hidden, V = c.vocab;
  BackendScratch &fs = *fwd_scratch_;
  fs.reset();
  int32_t *tok_d = fs.i32(n);
  be_.upload(tok_d, tokens, static_cast<uint64_t>(n) * 4);
  float *h = fs.f32(D * n), *xn = fs.f32(D * n), *y = fs.f32(D * n);
  const Tensor ht = dev_f32(dv, h, {D, n}), xt = dev_f32(dv, xn, {D, n}), yt = dev_f32(dv, y, {D, n});
  be_.embed(w_->token_embd, dev_i32(dv, tok_d, {n}), ht);
  // K3 AttnRes: block sums banked per token ([D, n] slices of bank); each sublayer input is a
  // softmax mix of them and the current stream (docs/models/kimi-k3.md)
  const int64_t B = c.attn_res_block_size;
  const int64_t max_banked = B > 0 ? (c.n_layers + B - 1) / B : 0;
  float *bank = B > 0 ? fs.f32(max_banked * D * n) : nullptr, *mixed = B > 0 ? fs.f32(D * n) : nullptr;
  int64_t n_banked = 0;
  auto mix = [&](const Tensor &w) -> Tensor {
    const Tensor banked = dev_f32(dv, bank, {D, n, n_banked}), out = dev_f32(dv, mixed, {D, n});
    be_.attn_res_mix(n_banked > 0 ? &banked : nullptr, ht, w, c.rms_eps, out);
    return out;
  };
  for (int64_t il = 0; il < c.n_layers; ++il) {
    const Weights::Layer &L = w_->layers[static_cast<size_t>(il)];
    be_.rms_norm(B > 0 ? mix(L.attn_res) : ht, &L.attn_norm, c.rms_eps, xt);
    // the mixer: its projections over every token at once, its state's part per sequence
    std::vector<MixerSeq> seqs(static_cast<size_t>(S));
    for (int64_t i = 0; i < S; ++i) {
      KimiState &state = *states[static_cast<size_t>(i)];
      MixerSeq &m = seqs[static_cast<size_t>(i)];
      m.offset = offsets[static_cast<size_t>(i)];
      m.n = offsets[static_cast<size_t>(i) + 1] - m.offset;
      m.n_past = state.n_past;
      m.state = &state.layers[static_cast<size_t>(il)];
    }
    if (c.mixer[static_cast<size_t>(il)] == KimiMixer::kda)
      kda(il, xn, n, seqs, y);
    else
      mla(il, xn, n, seqs, y);
    if (B > 0 && il % B == 0) {
      // the raw layer input is banked; the stream restarts from the attention output
      be_.copy(dev_f32(dv, h, {D * n}), dev_f32(dv, bank + n_banked * D * n, {D * n}));
      ++n_banked;
      be_.copy(dev_f32(dv, y, {D * n}), dev_f32(dv, h, {D * n}));
    } else {
      be_.add(ht, yt, ht);
    }
    be_.rms_norm(B > 0 ? mix(L.ffn_res) : ht, &L.ffn_norm, c.rms_eps, xt);
    ffn(il, xn, n, y);
    be_.add(ht, yt, ht);
  }
  for (int64_t i = 0; i < S; ++i)
    states[static_cast<size_t>(i)]->n_past += offsets[static_cast<size_t>(i) + 1] - offsets[static_cast<size_t>(i)];
  if (rows == LogitRows::none) return {};
  be_.rms_norm(B > 0 ? mix(w_->output_res) : ht, &w_->output_norm, c.rms_eps, xt);
  // the output head on each sequence's last token only when that is all the caller needs
  // (generation)
  const int64_t m = rows == LogitRows::last ? S : n;
  const float *xm = xn;
  if (rows == LogitRows::last) {
    if (S == 1) {
      xm = xn + (n - 1) * D;
    } else {
      float *last = fs.f32(D * S);
      for (int64_t i = 0; i < S; ++i)
        be_.copy(dev_f32(dv, xn + (offsets[static_cast<size_t>(i) + 1] - 1) * D, {D}), dev_f32(dv, last + i * D, {D}));
      xm = last;
    }
  }
  float *out = fs.f32(V * m);
  be_.matmul(w_->output, dev_f32(dv, xm, {D, m}), dev_f32(dv, out, {V, m}));
  return rows == LogitRows::last && S == 1 ? dev_f32(dv, out, {V}) : dev_f32(dv, out, {V, m});
}

}  // namespace ep::model
