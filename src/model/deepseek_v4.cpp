#include "model/deepseek_v4.hpp"

#include "backend/dequant.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "format/gguf.hpp"
#include "model/dsv4_ops.hpp"
#include "model/weight_catalog.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace ep::model {

using backend::Device;
using backend::GgmlType;
using backend::Tensor;

struct DeepseekV4Model::Weights {
  std::vector<DeviceBuffer> bufs;
  struct Hc {
    Tensor fn;
    std::vector<float> base, scale;
  };
  struct Comp {
    Tensor kv, gate, norm;
    std::vector<float> ape;  // [ratio][c·d]
  };
  struct Layer {
    Hc hc_attn, hc_ffn;
    Tensor attn_norm, ffn_norm, q_a, q_a_norm, q_b, kv, kv_norm, o_a, o_b;
    std::vector<float> sinks;
    Comp comp, idx_comp;
    Tensor idx_proj, idx_q_b;
    Tensor gate_inp, tid2eid, bias;
    Tensor sh_gate, sh_up, sh_down;
  };
  Tensor token_embd, output, output_norm, output_hc_fn;
  std::vector<float> output_hc_base, output_hc_scale;
  std::vector<Layer> layers;
};

namespace {

Tensor f32_view(const float *p, std::initializer_list<int64_t> shape) {
  return Tensor::make(p, GgmlType::f32, Device::cpu, shape);
}

std::vector<float> to_f32(const CatalogEntry &e, const std::vector<uint8_t> &raw) {
  int64_t n = 1;
  for (int64_t v : e.ne) n *= v;
  std::vector<float> out(static_cast<size_t>(n));
  if (e.type == GgmlType::i32 || e.type == GgmlType::i64 || e.type == GgmlType::i16 || e.type == GgmlType::i8)
    fail(Status::format, "{}: integer tensor where floats are expected", e.origin);
  backend::dequantize_row(e.type, raw.data(), out.data(), n);
  return out;
}

class Loader {
 public:
  Loader(WeightCatalog &cat, backend::Backend &be, std::vector<DeviceBuffer> &bufs, uint64_t &bytes)
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
    const CatalogEntry *e = cat_.take(name, {n});
    if (!e) return {};
    const std::vector<float> v = to_f32(*e, e->read());
    return upload(v.data(), GgmlType::f32, {n}, v.size() * 4);
  }
  /// Values read on the host (hc base/scale, sinks, position biases), converted to f32.
  std::vector<float> host(const std::string &name, std::vector<int64_t> ne) {
    const CatalogEntry *e = cat_.take(name, ne);
    if (!e) return {};
    return to_f32(*e, e->read());
  }
  Tensor i32(const std::string &name, int64_t ne0, int64_t ne1) {
    const CatalogEntry *e = cat_.take(name, {ne0, ne1});
    if (!e) return {};
    if (e->type != GgmlType::i32) fail(Status::format, "{}: type {}, expected i32", e->origin, static_cast<uint32_t>(e->type));
    const std::vector<uint8_t> raw = e->read();
    return upload(raw.data(), GgmlType::i32, {ne0, ne1}, raw.size());
  }
  const CatalogEntry *entry(const std::string &name, std::vector<int64_t> ne) { return cat_.take(name, std::move(ne)); }

 private:
  WeightCatalog &cat_;
  backend::Backend &be_;
  std::vector<DeviceBuffer> &bufs_;
  uint64_t &bytes_;
};

backend::RopeParams rope_params(const DeepseekV4Config &c, bool compressed, int64_t head_dim, bool inverse) {
  backend::RopeParams p;
  p.n_dims = static_cast<int32_t>(c.rope_dim);
  p.dim_offset = static_cast<int32_t>(head_dim - c.rope_dim);
  p.inverse = inverse;
  if (compressed) {
    p.theta = c.compress_rope_theta;
    p.yarn_factor = c.yarn_factor;
    p.yarn_original_max_positions = c.yarn_original_max_positions;
    p.yarn_beta_fast = c.yarn_beta_fast;
    p.yarn_beta_slow = c.yarn_beta_slow;
    p.attention_factor = c.compress_attention_factor;
  } else {
    p.theta = c.rope_theta;
  }
  return p;
}

std::string read_text(const std::filesystem::path &p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) fail(Status::not_found, "{}: cannot open", p.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

std::unique_ptr<DeepseekV4Model> DeepseekV4Model::open(const std::string &path, backend::Backend &be,
                                                       const DeepseekV4LoadOptions &options) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  if (p.extension() == ".gguf") {
    WeightCatalog cat = WeightCatalog::from_gguf(path);
    const DeepseekV4Config cfg = DeepseekV4Config::from_gguf(format::GgufSet::open(path));
    return std::make_unique<DeepseekV4Model>(cfg, cat, be, options);
  }
  const fs::path dir = fs::is_directory(p) ? p : p.parent_path();
  const fs::path config = dir / "config.json";
  if (!fs::exists(config)) fail(Status::not_found, "{}: no config.json beside the safetensors checkpoint", dir.string());
  const DeepseekV4Config cfg = DeepseekV4Config::from_hf_json(read_text(config), config.string());
  WeightCatalog cat = WeightCatalog::from_dsv4_safetensors(path);
  return std::make_unique<DeepseekV4Model>(cfg, cat, be, options);
}

DeepseekV4Model::~DeepseekV4Model() = default;

DeepseekV4Model::DeepseekV4Model(const DeepseekV4Config &c, WeightCatalog &cat, backend::Backend &be,
                                 const DeepseekV4LoadOptions &options)
    : cfg_(c), be_(be), w_(std::make_unique<Weights>()) {
  if (be.device() != Device::cpu)
    fail(Status::unsupported, "DeepSeek-V4: the {} backend lacks the hyper-connection / sink-attention / compressor ops; "
                              "only the CPU backend runs this model for now", backend::device_name(be.device()));
  c.validate(cat.source());
  Loader ld(cat, be, w_->bufs, weight_bytes_);
  const int64_t D = c.hidden, V = c.vocab, H = c.n_heads, hd = c.head_dim, R = c.q_lora_rank, G = c.o_groups,
                O = c.o_lora_rank, E = c.n_experts, F = c.moe_ff, hc = c.hc_mult, M = c.hc_mix(), IH = c.index_n_heads,
                I = c.index_head_dim, K = c.n_experts_used, FS = c.moe_ff * c.n_shared_experts;
  w_->token_embd = ld.matrix("token_embd.weight", D, V);
  w_->output = ld.matrix("output.weight", D, V);
  w_->output_norm = ld.vec("output_norm.weight", D);
  w_->output_hc_fn = ld.matrix("output_hc_fn.weight", hc * D, hc);
  w_->output_hc_base = ld.host("output_hc_base.weight", {hc});
  w_->output_hc_scale = ld.host("output_hc_scale.weight", {1});
  auto resident = std::make_unique<ResidentExperts>(be);
  bool experts_ok = true;
  for (int64_t il = 0; il < c.n_layers; ++il) {
    const std::string b = fmt::format("blk.{}.", il);
    Weights::Layer L;
    for (int site = 0; site < 2; ++site) {
      Weights::Hc &h = site ? L.hc_ffn : L.hc_attn;
      const std::string s = site ? "hc_ffn_" : "hc_attn_";
      h.fn = ld.matrix(b + s + "fn.weight", hc * D, M);
      h.base = ld.host(b + s + "base.weight", {M});
      h.scale = ld.host(b + s + "scale.weight", {3});
    }
    L.attn_norm = ld.vec(b + "attn_norm.weight", D);
    L.ffn_norm = ld.vec(b + "ffn_norm.weight", D);
    L.q_a = ld.matrix(b + "attn_q_a.weight", D, R);
    L.q_a_norm = ld.vec(b + "attn_q_a_norm.weight", R);
    L.q_b = ld.matrix(b + "attn_q_b.weight", R, H * hd);
    L.kv = ld.matrix(b + "attn_kv.weight", D, hd);
    L.kv_norm = ld.vec(b + "attn_kv_a_norm.weight", hd);
    L.o_a = ld.matrix(b + "attn_output_a.weight", H * hd / G, G * O);
    L.o_b = ld.matrix(b + "attn_output_b.weight", G * O, D);
    L.sinks = ld.host(b + "attn_sinks.weight", {H});
    const AttnKind kind = c.attn_kind[static_cast<size_t>(il)];
    const int64_t ratio = c.compress_ratio[static_cast<size_t>(il)];
    if (kind != AttnKind::sliding) {
      const int64_t cw = kind == AttnKind::csa ? 2 : 1;
      L.comp.kv = ld.matrix(b + "attn_compressor_kv.weight", D, cw * hd);
      L.comp.gate = ld.matrix(b + "attn_compressor_gate.weight", D, cw * hd);
      L.comp.ape = ld.host(b + "attn_compressor_ape.weight", {cw * hd, ratio});
      L.comp.norm = ld.vec(b + "attn_compressor_norm.weight", hd);
      if (kind == AttnKind::csa) {
        L.idx_proj = ld.matrix(b + "indexer.proj.weight", D, IH);
        L.idx_q_b = ld.matrix(b + "indexer.attn_q_b.weight", R, IH * I);
        L.idx_comp.kv = ld.matrix(b + "indexer_compressor_kv.weight", D, 2 * I);
        L.idx_comp.gate = ld.matrix(b + "indexer_compressor_gate.weight", D, 2 * I);
        L.idx_comp.ape = ld.host(b + "indexer_compressor_ape.weight", {2 * I, ratio});
        L.idx_comp.norm = ld.vec(b + "indexer_compressor_norm.weight", I);
      }
    }
    L.gate_inp = ld.matrix(b + "ffn_gate_inp.weight", D, E);
    if (il < c.n_hash_layers) {
      L.tid2eid = ld.i32(b + "ffn_gate_tid2eid.weight", K, V);
      if (L.tid2eid.data) {
        const int32_t *ids = L.tid2eid.as<int32_t>();  // CPU backend: device memory is host memory
        for (int64_t i = 0; i < K * V; ++i)
          if (ids[i] < 0 || ids[i] >= E)
            fail(Status::corrupt, "{}: {}ffn_gate_tid2eid.weight entry {} is expert {}, outside 0..{}", cat.source(), b, i, ids[i], E - 1);
      }
    } else {
      L.bias = ld.vec(b + "exp_probs_b.bias", E);
    }
    const CatalogEntry *ge = ld.entry(b + "ffn_gate_exps.weight", {D, F, E});
    const CatalogEntry *ue = ld.entry(b + "ffn_up_exps.weight", {D, F, E});
    const CatalogEntry *de = ld.entry(b + "ffn_down_exps.weight", {F, D, E});
    if (ge && ue && de && experts_ok) {
      for (const CatalogEntry *e : {ge, ue, de})
        if (!backend::is_supported_weight_type(e->type))
          fail(Status::unsupported, "{}: ggml type {} is not supported for experts", e->origin, static_cast<uint32_t>(e->type));
      auto shape_of = [](const CatalogEntry &e) {
        backend::SlotWeight w;
        w.type = e.type;
        w.ne0 = e.ne[0];
        w.ne1 = e.ne[1];
        return w;
      };
      expert_shapes_.push_back(ExpertShape{shape_of(*ge), shape_of(*ue), shape_of(*de)});
      if (options.resident_experts) resident->add_layer(*ge, *ue, *de);
    } else {
      experts_ok = false;
    }
    L.sh_gate = ld.matrix(b + "ffn_gate_shexp.weight", D, FS);
    L.sh_up = ld.matrix(b + "ffn_up_shexp.weight", D, FS);
    L.sh_down = ld.matrix(b + "ffn_down_shexp.weight", FS, D);
    w_->layers.push_back(std::move(L));
  }
  for (int64_t il = c.n_layers; il < c.n_layers + c.n_mtp_layers; ++il) cat.skip_prefix(fmt::format("blk.{}.", il));
  cat.finish();
  if (options.resident_experts) {
    weight_bytes_ += resident->bytes();
    experts_ = std::move(resident);
  }
  log::info("{} loaded from {} ({} MiB in backend memory)", c.summary(), cat.source(), weight_bytes_ >> 20);
}

DeepseekV4State DeepseekV4Model::new_state() const {
  DeepseekV4State s;
  s.layers.resize(static_cast<size_t>(cfg_.n_layers));
  return s;
}

void DeepseekV4Model::compress(int64_t il, bool indexer, const float *x, int64_t n, CompressorState &st) {
  const DeepseekV4Config &c = cfg_;
  const Weights::Comp &W = indexer ? w_->layers[static_cast<size_t>(il)].idx_comp : w_->layers[static_cast<size_t>(il)].comp;
  const bool overlap = c.attn_kind[static_cast<size_t>(il)] == AttnKind::csa;
  const int64_t d = indexer ? c.index_head_dim : c.head_dim, cw = overlap ? 2 : 1, width = cw * d;
  const int64_t m = c.compress_ratio[static_cast<size_t>(il)], D = c.hidden;
  std::vector<float> kv(static_cast<size_t>(width * n)), gate(static_cast<size_t>(width * n));
  be_.matmul(W.kv, f32_view(x, {D, n}), f32_view(kv.data(), {width, n}));
  be_.matmul(W.gate, f32_view(x, {D, n}), f32_view(gate.data(), {width, n}));
  st.buf_kv.insert(st.buf_kv.end(), kv.begin(), kv.end());
  st.buf_gate.insert(st.buf_gate.end(), gate.begin(), gate.end());
  st.buf_rows += n;
  const backend::RopeParams rp = rope_params(c, true, d, false);
  std::vector<float> pooled(static_cast<size_t>(d)), normed(static_cast<size_t>(d));
  std::vector<const float *> kvp, gp;
  int64_t used = 0;
  while (st.buf_rows - used >= m) {
    float *wkv = st.buf_kv.data() + used * width;
    float *wg = st.buf_gate.data() + used * width;
    for (int64_t r = 0; r < m; ++r)
      for (int64_t ch = 0; ch < width; ++ch) wg[r * width + ch] += W.ape[static_cast<size_t>(r * width + ch)];
    kvp.clear();
    gp.clear();
    if (overlap) {
      if (st.has_overlap)
        for (int64_t r = 0; r < m; ++r) {
          kvp.push_back(st.overlap_kv.data() + r * d);
          gp.push_back(st.overlap_gate.data() + r * d);
        }
      for (int64_t r = 0; r < m; ++r) {
        kvp.push_back(wkv + r * width + d);
        gp.push_back(wg + r * width + d);
      }
    } else {
      for (int64_t r = 0; r < m; ++r) {
        kvp.push_back(wkv + r * width);
        gp.push_back(wg + r * width);
      }
    }
    dsv4::pool_window(kvp.data(), gp.data(), static_cast<int64_t>(kvp.size()), d, pooled.data());
    if (overlap) {
      st.overlap_kv.resize(static_cast<size_t>(m * d));
      st.overlap_gate.resize(static_cast<size_t>(m * d));
      for (int64_t r = 0; r < m; ++r) {
        std::memcpy(st.overlap_kv.data() + r * d, wkv + r * width, static_cast<size_t>(d) * 4);
        std::memcpy(st.overlap_gate.data() + r * d, wg + r * width, static_cast<size_t>(d) * 4);
      }
      st.has_overlap = true;
    }
    be_.rms_norm(f32_view(pooled.data(), {d, 1}), &W.norm, c.rms_eps, f32_view(normed.data(), {d, 1}));
    const int32_t pos = static_cast<int32_t>(st.n_entries * m);
    be_.rope(f32_view(normed.data(), {d, 1, 1}), Tensor::make(&pos, GgmlType::i32, Device::cpu, {1}), rp,
             f32_view(normed.data(), {d, 1, 1}));
    st.entries.insert(st.entries.end(), normed.begin(), normed.end());
    ++st.n_entries;
    used += m;
  }
  if (used) {
    st.buf_kv.erase(st.buf_kv.begin(), st.buf_kv.begin() + used * width);
    st.buf_gate.erase(st.buf_gate.begin(), st.buf_gate.begin() + used * width);
    st.buf_rows -= used;
  }
}

void DeepseekV4Model::attention(int64_t il, const float *x, int64_t n, const int32_t *pos, LayerState &st, float *out) {
  const DeepseekV4Config &c = cfg_;
  const Weights::Layer &L = w_->layers[static_cast<size_t>(il)];
  const int64_t D = c.hidden, H = c.n_heads, hd = c.head_dim, R = c.q_lora_rank, G = c.o_groups, O = c.o_lora_rank;
  const AttnKind kind = c.attn_kind[static_cast<size_t>(il)];
  const int64_t ratio = c.compress_ratio[static_cast<size_t>(il)];
  const bool compressed = kind != AttnKind::sliding;
  const backend::RopeParams rp = rope_params(c, compressed, hd, false);
  const Tensor positions = Tensor::make(pos, GgmlType::i32, Device::cpu, {n});
  // query: low-rank, weighted norm, per-head unweighted norm, RoPE
  std::vector<float> qa(static_cast<size_t>(R * n)), qr(static_cast<size_t>(R * n)), q(static_cast<size_t>(H * hd * n));
  be_.matmul(L.q_a, f32_view(x, {D, n}), f32_view(qa.data(), {R, n}));
  be_.rms_norm(f32_view(qa.data(), {R, n}), &L.q_a_norm, c.rms_eps, f32_view(qr.data(), {R, n}));
  be_.matmul(L.q_b, f32_view(qr.data(), {R, n}), f32_view(q.data(), {H * hd, n}));
  be_.rms_norm(f32_view(q.data(), {hd, H * n}), nullptr, c.rms_eps, f32_view(q.data(), {hd, H * n}));
  be_.rope(f32_view(q.data(), {hd, H, n}), positions, rp, f32_view(q.data(), {hd, H, n}));
  // the shared K=V head
  std::vector<float> kv0(static_cast<size_t>(hd * n)), kv(static_cast<size_t>(hd * n));
  be_.matmul(L.kv, f32_view(x, {D, n}), f32_view(kv0.data(), {hd, n}));
  be_.rms_norm(f32_view(kv0.data(), {hd, n}), &L.kv_norm, c.rms_eps, f32_view(kv.data(), {hd, n}));
  be_.rope(f32_view(kv.data(), {hd, 1, n}), positions, rp, f32_view(kv.data(), {hd, 1, n}));
  // raw keys: the kept window, then this call's rows
  const int64_t n_win = static_cast<int64_t>(st.window_pos.size());
  std::vector<float> keys(st.window);
  keys.insert(keys.end(), kv.begin(), kv.end());
  std::vector<int32_t> key_pos(st.window_pos);
  key_pos.insert(key_pos.end(), pos, pos + n);
  const int64_t n_raw = n_win + n;
  // compressed entries (and the indexer's selection for CSA)
  int64_t n_comp = 0;
  std::vector<uint8_t> selected;  // [n][n_comp] for CSA
  if (compressed) {
    compress(il, false, x, n, st.comp);
    n_comp = st.comp.n_entries;
    keys.insert(keys.end(), st.comp.entries.begin(), st.comp.entries.end());
    if (kind == AttnKind::csa) {
      compress(il, true, x, n, st.index);
      if (st.index.n_entries != n_comp)
        fail(Status::internal, "layer {}: indexer has {} entries, compressor {}", il, st.index.n_entries, n_comp);
      const int64_t IH = c.index_n_heads, I = c.index_head_dim;
      std::vector<float> qi(static_cast<size_t>(IH * I * n)), wts(static_cast<size_t>(IH * n));
      be_.matmul(L.idx_q_b, f32_view(qr.data(), {R, n}), f32_view(qi.data(), {IH * I, n}));
      be_.rope(f32_view(qi.data(), {I, IH, n}), positions, rope_params(c, true, I, false), f32_view(qi.data(), {I, IH, n}));
      be_.matmul(L.idx_proj, f32_view(x, {D, n}), f32_view(wts.data(), {IH, n}));
      const float wscale = 1.0f / std::sqrt(static_cast<float>(IH));
      for (float &v : wts) v *= wscale;
      selected.assign(static_cast<size_t>(n * n_comp), 0);
      std::vector<float> scores(static_cast<size_t>(n_comp));
      std::vector<int32_t> top(static_cast<size_t>(n_comp));
      for (int64_t t = 0; t < n; ++t) {
        const int64_t valid = std::min<int64_t>((pos[t] + 1) / ratio, n_comp);
        if (valid <= 0) continue;
        uint8_t *sel = selected.data() + t * n_comp;
        if (valid <= c.index_topk) {
          std::fill(sel, sel + valid, 1);
          continue;
        }
        dsv4::indexer_scores(qi.data() + t * IH * I, wts.data() + t * IH, I, IH, st.index.entries.data(), valid,
                             1.0f / std::sqrt(static_cast<float>(I)), scores.data());
        dsv4::top_k(scores.data(), valid, c.index_topk, top.data());
        for (int64_t j = 0; j < c.index_topk; ++j) sel[top[static_cast<size_t>(j)]] = 1;
      }
    }
  }
  const int64_t n_keys = n_raw + n_comp;
  std::vector<uint8_t> visible(static_cast<size_t>(n * n_keys), 0);
  for (int64_t t = 0; t < n; ++t) {
    uint8_t *vis = visible.data() + t * n_keys;
    const int64_t P = pos[t];
    for (int64_t j = 0; j < n_raw; ++j) vis[j] = key_pos[static_cast<size_t>(j)] <= P && key_pos[static_cast<size_t>(j)] > P - c.sliding_window;
    if (n_comp) {
      const int64_t valid = std::min<int64_t>((P + 1) / ratio, n_comp);
      for (int64_t e = 0; e < valid; ++e)
        vis[n_raw + e] = kind == AttnKind::csa ? selected[static_cast<size_t>(t * n_comp + e)] : 1;
    }
  }
  std::vector<float> att(static_cast<size_t>(hd * H * n));
  dsv4::attention_sinks(q.data(), hd, H, n, keys.data(), n_keys, visible.data(), L.sinks.data(),
                        1.0f / std::sqrt(static_cast<float>(hd)), att.data());
  // inverse RoPE at the query positions, then the grouped low-rank output
  be_.rope(f32_view(att.data(), {hd, H, n}), positions, rope_params(c, compressed, hd, true), f32_view(att.data(), {hd, H, n}));
  const int64_t gin = H * hd / G;
  std::vector<float> xg(static_cast<size_t>(gin * n)), yg(static_cast<size_t>(O * n)), oa(static_cast<size_t>(G * O * n));
  const uint64_t oa_row = L.o_a.row_bytes();
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t t = 0; t < n; ++t) std::memcpy(xg.data() + t * gin, att.data() + t * H * hd + g * gin, static_cast<size_t>(gin) * 4);
    const Tensor wg = Tensor::make(static_cast<const uint8_t *>(L.o_a.data) + static_cast<uint64_t>(g * O) * oa_row, L.o_a.type,
                                   be_.device(), {gin, O});
    be_.matmul(wg, f32_view(xg.data(), {gin, n}), f32_view(yg.data(), {O, n}));
    for (int64_t t = 0; t < n; ++t) std::memcpy(oa.data() + t * G * O + g * O, yg.data() + t * O, static_cast<size_t>(O) * 4);
  }
  be_.matmul(L.o_b, f32_view(oa.data(), {G * O, n}), f32_view(out, {D, n}));
  // keep the last W − 1 raw rows for the next call
  const int64_t keep = std::min<int64_t>(n_raw, std::max<int64_t>(c.sliding_window - 1, 0));
  st.window.assign(keys.begin() + (n_raw - keep) * hd, keys.begin() + n_raw * hd);
  st.window_pos.assign(key_pos.begin() + (n_raw - keep), key_pos.begin() + n_raw);
}

void DeepseekV4Model::moe(int64_t il, const float *x, int64_t n, const int32_t *tokens, float *out) {
  const DeepseekV4Config &c = cfg_;
  const Weights::Layer &L = w_->layers[static_cast<size_t>(il)];
  const int64_t D = c.hidden, E = c.n_experts, K = c.n_experts_used;
  std::vector<float> logits(static_cast<size_t>(E * n)), wts(static_cast<size_t>(K * n)), shared(static_cast<size_t>(D * n));
  std::vector<int32_t> ids(static_cast<size_t>(K * n));
  be_.matmul(L.gate_inp, f32_view(x, {D, n}), f32_view(logits.data(), {E, n}));
  backend::RouterParams rp;
  rp.scoring = backend::Scoring::sqrt_softplus;
  rp.k = static_cast<int32_t>(K);
  rp.renormalize = c.norm_topk;
  rp.scale = c.routed_scale;
  const Tensor tok = Tensor::make(tokens, GgmlType::i32, Device::cpu, {n});
  if (L.tid2eid.data) {
    rp.hash_table = &L.tid2eid;
    rp.token_ids = &tok;
  } else {
    rp.bias = &L.bias;
  }
  const Tensor ids_t = Tensor::make(ids.data(), GgmlType::i32, Device::cpu, {K, n});
  const Tensor w_t = f32_view(wts.data(), {K, n});
  be_.route(f32_view(logits.data(), {E, n}), rp, ids_t, w_t);
  backend::Activation act;
  act.kind = backend::ActivationKind::swiglu;
  act.limit = c.swiglu_limit[static_cast<size_t>(il)];
  if (!experts_) fail(Status::internal, "DeepSeek-V4: no routed-expert provider (set_experts() was not called)");
  // Tokens in chunks whose distinct experts fit one acquire (the CPU moe op is per token, so
  // chunking does not change a bit of the result).
  const int64_t max_unique = std::max<int64_t>(experts_->max_unique(), K);
  std::vector<uint8_t> seen(static_cast<size_t>(E));
  for (int64_t t0 = 0; t0 < n;) {
    std::fill(seen.begin(), seen.end(), 0);
    int64_t t1 = t0, distinct = 0;
    while (t1 < n) {
      int64_t add = 0;
      for (int64_t j = 0; j < K; ++j) {
        const int32_t e = ids[static_cast<size_t>(t1 * K + j)];
        if (e >= 0 && e < E && !seen[static_cast<size_t>(e)]) {
          bool dup = false;
          for (int64_t i = 0; i < j; ++i) dup = dup || ids[static_cast<size_t>(t1 * K + i)] == e;
          if (!dup) ++add;
        }
      }
      if (t1 > t0 && distinct + add > max_unique) break;
      for (int64_t j = 0; j < K; ++j) {
        const int32_t e = ids[static_cast<size_t>(t1 * K + j)];
        if (e >= 0 && e < E) seen[static_cast<size_t>(e)] = 1;
      }
      distinct += add;
      ++t1;
    }
    const int64_t m = t1 - t0;
    const backend::ExpertSlots slots = experts_->acquire(il, ids.data() + t0 * K, K * m);
    try {
      be_.moe(f32_view(x + t0 * D, {D, m}), Tensor::make(ids.data() + t0 * K, GgmlType::i32, Device::cpu, {K, m}),
              f32_view(wts.data() + t0 * K, {K, m}), slots, experts_->layout(il), act, f32_view(out + t0 * D, {D, m}));
    } catch (...) {
      experts_->release(il);
      throw;
    }
    experts_->release(il);
    t0 = t1;
  }
  backend::Activation sact = act;
  sact.limit = c.swiglu_limit_shared[static_cast<size_t>(il)];
  be_.ffn(f32_view(x, {D, n}), L.sh_gate, L.sh_up, L.sh_down, sact, f32_view(shared.data(), {D, n}));
  be_.add(f32_view(out, {D, n}), f32_view(shared.data(), {D, n}), f32_view(out, {D, n}));
}

void DeepseekV4Model::hc_site(int64_t il, bool ffn, std::vector<float> &h, int64_t n, const int32_t *pos,
                              const int32_t *tokens, DeepseekV4State &state) {
  const DeepseekV4Config &c = cfg_;
  const Weights::Layer &L = w_->layers[static_cast<size_t>(il)];
  const Weights::Hc &W = ffn ? L.hc_ffn : L.hc_attn;
  const int64_t D = c.hidden, hc = c.hc_mult, M = c.hc_mix();
  std::vector<float> flat(static_cast<size_t>(hc * D * n)), mix(static_cast<size_t>(M * n));
  be_.rms_norm(f32_view(h.data(), {hc * D, n}), nullptr, c.rms_eps, f32_view(flat.data(), {hc * D, n}));
  be_.matmul(W.fn, f32_view(flat.data(), {hc * D, n}), f32_view(mix.data(), {M, n}));
  std::vector<float> pre(static_cast<size_t>(hc * n)), post(static_cast<size_t>(hc * n)), comb(static_cast<size_t>(hc * hc * n));
  std::vector<float> col(static_cast<size_t>(D * n)), xin(static_cast<size_t>(D * n)), y(static_cast<size_t>(D * n));
  for (int64_t t = 0; t < n; ++t) {
    dsv4::hc_weights(mix.data() + t * M, hc, W.scale.data(), W.base.data(), c.hc_eps, c.hc_sinkhorn_iters, pre.data() + t * hc,
                     post.data() + t * hc, comb.data() + t * hc * hc);
    dsv4::hc_collapse(h.data() + t * hc * D, pre.data() + t * hc, hc, D, col.data() + t * D);
  }
  be_.rms_norm(f32_view(col.data(), {D, n}), ffn ? &L.ffn_norm : &L.attn_norm, c.rms_eps, f32_view(xin.data(), {D, n}));
  if (ffn)
    moe(il, xin.data(), n, tokens, y.data());
  else
    attention(il, xin.data(), n, pos, state.layers[static_cast<size_t>(il)], y.data());
  for (int64_t t = 0; t < n; ++t)
    dsv4::hc_expand(h.data() + t * hc * D, y.data() + t * D, post.data() + t * hc, comb.data() + t * hc * hc, hc, D);
}

void DeepseekV4Model::forward(const int32_t *tokens, int64_t n, DeepseekV4State &state, float *logits) {
  const DeepseekV4Config &c = cfg_;
  if (n <= 0) return;
  if (static_cast<int64_t>(state.layers.size()) != c.n_layers)
    fail(Status::invalid_argument, "DeepSeek-V4 forward: state has {} layers, the model {}", state.layers.size(), c.n_layers);
  for (int64_t t = 0; t < n; ++t)
    if (tokens[t] < 0 || tokens[t] >= c.vocab)
      fail(Status::invalid_argument, "DeepSeek-V4 forward: token {} at {} is outside 0..{}", tokens[t], t, c.vocab - 1);
  if (state.n_past + n > INT32_MAX) fail(Status::invalid_argument, "DeepSeek-V4 forward: position overflow");
  const int64_t D = c.hidden, hc = c.hc_mult, V = c.vocab;
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>(state.n_past + t);
  std::vector<float> emb(static_cast<size_t>(D * n)), h(static_cast<size_t>(hc * D * n));
  be_.embed(w_->token_embd, Tensor::make(tokens, GgmlType::i32, Device::cpu, {n}), f32_view(emb.data(), {D, n}));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < hc; ++j) std::memcpy(h.data() + (t * hc + j) * D, emb.data() + t * D, static_cast<size_t>(D) * 4);
  for (int64_t il = 0; il < c.n_layers; ++il) {
    hc_site(il, false, h, n, pos.data(), tokens, state);
    hc_site(il, true, h, n, pos.data(), tokens, state);
  }
  state.n_past += n;
  if (!logits) return;
  // final hyper-connection head, norm, lm_head
  std::vector<float> flat(static_cast<size_t>(hc * D * n)), mix(static_cast<size_t>(hc * n)), col(static_cast<size_t>(D * n)),
      normed(static_cast<size_t>(D * n));
  be_.rms_norm(f32_view(h.data(), {hc * D, n}), nullptr, c.rms_eps, f32_view(flat.data(), {hc * D, n}));
  be_.matmul(w_->output_hc_fn, f32_view(flat.data(), {hc * D, n}), f32_view(mix.data(), {hc, n}));
  std::vector<float> pre(static_cast<size_t>(hc));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < hc; ++j)
      pre[static_cast<size_t>(j)] =
          1.0f / (1.0f + std::exp(-(mix[static_cast<size_t>(t * hc + j)] * w_->output_hc_scale[0] + w_->output_hc_base[static_cast<size_t>(j)]))) + c.hc_eps;
    dsv4::hc_collapse(h.data() + t * hc * D, pre.data(), hc, D, col.data() + t * D);
  }
  be_.rms_norm(f32_view(col.data(), {D, n}), &w_->output_norm, c.rms_eps, f32_view(normed.data(), {D, n}));
  be_.matmul(w_->output, f32_view(normed.data(), {D, n}), f32_view(logits, {V, n}));
}

}  // namespace ep::model
