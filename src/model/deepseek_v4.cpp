#include "model/deepseek_v4.hpp"


#include "backend/dequant.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "experts/sharded_experts.hpp"
#include "experts/runner.hpp"
#include "format/file_format.hpp"
#include "format/gguf.hpp"
#include "model/backend_memory.hpp"
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

struct DeepseekV4Model::Weights {
  std::vector<DeviceBuffer> bufs;
  struct Hc {
    Tensor fn;
    Tensor base, scale;  // f32 [(2+hc)·hc], f32 [3]
  };
  struct Comp {
    Tensor kv, gate, norm;
    Tensor ape;  // f32 [c·d, ratio]
  };
  struct Layer {
    Hc hc_attn, hc_ffn;
    Tensor attn_norm, ffn_norm, q_a, q_a_norm, q_b, kv, kv_norm, o_a, o_b;
    Tensor sinks;  // f32 [H]
    Comp comp, idx_comp;
    Tensor idx_proj, idx_q_b;
    Tensor gate_inp, tid2eid, bias;
    Tensor sh_gate, sh_up, sh_down;
  };
  Tensor token_embd, output, output_norm, output_hc_fn;
  Tensor output_hc_base, output_hc_scale;  // f32 [hc], f32 [1]
  std::vector<Layer> layers;
};

/// Backend memory for activations, reused call after call (model/backend_memory.hpp). Ops are
/// ordered on the backend's stream, so a buffer reused after reset() is never written while an
/// earlier op still reads it.
struct DeepseekV4Model::Scratch : BackendScratch {
  using BackendScratch::BackendScratch;
};

/// One sequence of a forward pass: its tokens and positions, on the host and in backend memory,
/// where they sit in the pass, and its state.
struct DeepseekV4Model::Step {
  int64_t n = 0;
  int64_t offset = 0;               // its first token's index in the pass
  const int32_t *tokens = nullptr;  // host
  const int32_t *pos = nullptr;     // host
  Tensor tokens_dev, pos_dev;       // i32 [n]
  DeepseekV4State *state = nullptr;
};

/// Every sequence of one forward pass (their tokens back to back): the per-token work runs over
/// all of them at once, the attention per sequence.
struct DeepseekV4Model::Batch {
  int64_t n = 0;
  Tensor tokens_dev, pos_dev;  // i32 [n]
  std::vector<Step> seqs;
};

/// A layer's attention projections of every token of a pass ([rows, n], token t's rows at column
/// t): what each sequence's attention core reads at its offset. Null where the layer has no such
/// input (no compressor on sliding layers; no indexer outside CSA layers, nor while no token of
/// the pass has more compressed entries than the indexer keeps).
struct DeepseekV4Model::AttentionProjections {
  float *q = nullptr;                                // [hd, H, n]: normed, RoPE
  float *kv = nullptr;                               // [hd, n]: normed, RoPE
  float *comp_kv = nullptr, *comp_gate = nullptr;    // [width, n]: the compressor's inputs
  float *index_kv = nullptr, *index_gate = nullptr;  // [width, n]: the indexer's compressor's inputs
  float *index_q = nullptr;                          // [I, IH, n]: RoPE
  float *index_w = nullptr;                          // [IH, n]: scaled by IH^-1/2
};

namespace {

std::vector<float> to_f32(const CatalogEntry &e, const std::vector<uint8_t> &raw) {
  int64_t n = 1;
  for (int64_t v : e.ne) n *= v;
  std::vector<float> out(static_cast<size_t>(n));
  if (e.type == GgmlType::i32 || e.type == GgmlType::i64 || e.type == GgmlType::i16 || e.type == GgmlType::i8)
    fail(Status::format, "{}: integer tensor where floats are expected", e.origin);
  backend::dequantize_row(e.type, raw.data(), out.data(), n);
  return out;
}

class Loader : public WeightUploader {
 public:
  using WeightUploader::WeightUploader;
  /// A matmul / embedding weight {ne0, ne1}, kept in its file type. Off the CPU, f32 / f16 /
  /// bf16 rows whose length is not a multiple of 32 (the CUDA GEMV and dequantize kernels need
  /// one; only tiny test models have such rows) are zero-padded to the next multiple when
  /// @p may_pad: the tensor's ne0 is then the padded length, and DeepseekV4Model::mm pads x.
  Tensor matrix(const std::string &name, int64_t ne0, int64_t ne1, bool may_pad = true) {
    const CatalogEntry *e = cat_.take(name, {ne0, ne1});
    if (!e) return {};
    if (!backend::is_supported_weight_type(e->type))
      fail(Status::unsupported, "{}: ggml type {} is not supported for weights", e->origin, static_cast<uint32_t>(e->type));
    const std::vector<uint8_t> raw = e->read();
    const uint64_t es = e->type == GgmlType::f32 ? 4 : e->type == GgmlType::f16 || e->type == GgmlType::bf16 ? 2 : 0;
    if (!may_pad || be_.device() == Device::cpu || ne0 % 32 == 0 || es == 0)
      return upload(raw.data(), e->type, {ne0, ne1}, raw.size());
    const int64_t padded = (ne0 + 31) / 32 * 32;
    std::vector<uint8_t> rows(static_cast<size_t>(padded * ne1) * es, 0);
    for (int64_t r = 0; r < ne1; ++r)
      std::memcpy(rows.data() + static_cast<uint64_t>(r * padded) * es, raw.data() + static_cast<uint64_t>(r * ne0) * es,
                  static_cast<size_t>(ne0) * es);
    return upload(rows.data(), e->type, {padded, ne1}, rows.size());
  }
  /// A vector used by backend ops (norm weights, router bias), converted to f32.
  Tensor vec(const std::string &name, int64_t n) {
    const CatalogEntry *e = cat_.take(name, {n});
    if (!e) return {};
    const std::vector<float> v = to_f32(*e, e->read());
    return upload(v.data(), GgmlType::f32, {n}, v.size() * 4);
  }
  /// Small f32 parameters (hc base/scale, sinks, position biases) converted to f32, uploaded as
  /// one flat vector of all their values.
  Tensor params(const std::string &name, std::vector<int64_t> ne) {
    const CatalogEntry *e = cat_.take(name, ne);
    if (!e) return {};
    const std::vector<float> v = to_f32(*e, e->read());
    return upload(v.data(), GgmlType::f32, {static_cast<int64_t>(v.size())}, v.size() * 4);
  }
  /// An i32 table whose entries must lie in [0, limit) (checked before upload).
  Tensor i32(const std::string &name, int64_t ne0, int64_t ne1, int64_t limit) {
    const CatalogEntry *e = cat_.take(name, {ne0, ne1});
    if (!e) return {};
    if (e->type != GgmlType::i32) fail(Status::format, "{}: type {}, expected i32", e->origin, static_cast<uint32_t>(e->type));
    const std::vector<uint8_t> raw = e->read();
    for (size_t i = 0; i + 4 <= raw.size(); i += 4) {
      int32_t v;
      std::memcpy(&v, raw.data() + i, 4);
      if (v < 0 || v >= limit)
        fail(Status::corrupt, "{}: entry {} is {}, outside 0..{}", e->origin, i / 4, v, limit - 1);
    }
    return upload(raw.data(), GgmlType::i32, {ne0, ne1}, raw.size());
  }
  const CatalogEntry *entry(const std::string &name, std::vector<int64_t> ne) { return cat_.take(name, std::move(ne)); }
};

/// The compressed entries a token at position @p pos may see on a layer of compression @p ratio:
/// the windows closed through it. The indexer picks among them once there are more than it keeps.
int64_t entries_seen(int64_t pos, int64_t ratio) { return (pos + 1) / ratio; }

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

}  // namespace

std::unique_ptr<DeepseekV4Model> DeepseekV4Model::open(const std::string &path, backend::Backend &be,
                                                       const DeepseekV4LoadOptions &options) {
  if (format::detect_file_format(path) == format::FileFormat::gguf) {
    WeightCatalog cat = WeightCatalog::from_gguf(path);
    const DeepseekV4Config cfg = DeepseekV4Config::from_gguf(format::GgufSet::open(path));
    return std::make_unique<DeepseekV4Model>(cfg, cat, be, options);
  }
  const SafetensorsCheckpoint ck = open_safetensors_checkpoint(path, "DeepSeek-V4");
  const DeepseekV4Config cfg = DeepseekV4Config::from_hf_json(ck.config_text, ck.config_path);
  WeightCatalog cat = WeightCatalog::from_deepseek_v4_safetensors(ck.weights, ck.quant);
  return std::make_unique<DeepseekV4Model>(cfg, cat, be, options);
}

DeepseekV4Model::~DeepseekV4Model() = default;

DeepseekV4Model::DeepseekV4Model(const DeepseekV4Config &c, WeightCatalog &cat, backend::Backend &be,
                                 const DeepseekV4LoadOptions &options)
    : cfg_(c), be_(be), w_(std::make_unique<Weights>()), fwd_scratch_(std::make_unique<Scratch>(be)),
      site_scratch_(std::make_unique<Scratch>(be)) {
  c.validate(cat.source());
  Loader ld(cat, be, w_->bufs, weight_bytes_);
  const int64_t D = c.hidden, V = c.vocab, H = c.n_heads, hd = c.head_dim, R = c.q_lora_rank, G = c.o_groups,
                O = c.o_lora_rank, E = c.n_experts, F = c.moe_ff, hc = c.hc_mult, M = c.hc_mix(), IH = c.index_n_heads,
                I = c.index_head_dim, K = c.n_experts_used, FS = c.moe_ff * c.n_shared_experts;
  w_->token_embd = ld.matrix("token_embd.weight", D, V, false);
  w_->output = ld.matrix("output.weight", D, V);
  w_->output_norm = ld.vec("output_norm.weight", D);
  w_->output_hc_fn = ld.matrix("output_hc_fn.weight", hc * D, hc);
  w_->output_hc_base = ld.params("output_hc_base.weight", {hc});
  w_->output_hc_scale = ld.params("output_hc_scale.weight", {1});
  experts::ResidentShards resident(be, options.expert_devices);
  bool experts_ok = true;
  for (int64_t il = 0; il < c.n_layers; ++il) {
    const std::string b = fmt::format("blk.{}.", il);
    Weights::Layer L;
    for (int site = 0; site < 2; ++site) {
      Weights::Hc &h = site ? L.hc_ffn : L.hc_attn;
      const std::string s = site ? "hc_ffn_" : "hc_attn_";
      h.fn = ld.matrix(b + s + "fn.weight", hc * D, M);
      h.base = ld.params(b + s + "base.weight", {M});
      h.scale = ld.params(b + s + "scale.weight", {3});
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
    L.sinks = ld.params(b + "attn_sinks.weight", {H});
    const AttnKind kind = c.attn_kind[static_cast<size_t>(il)];
    const int64_t ratio = c.compress_ratio[static_cast<size_t>(il)];
    if (kind != AttnKind::sliding) {
      const int64_t cw = kind == AttnKind::csa ? 2 : 1;
      L.comp.kv = ld.matrix(b + "attn_compressor_kv.weight", D, cw * hd);
      L.comp.gate = ld.matrix(b + "attn_compressor_gate.weight", D, cw * hd);
      L.comp.ape = ld.params(b + "attn_compressor_ape.weight", {cw * hd, ratio});
      L.comp.norm = ld.vec(b + "attn_compressor_norm.weight", hd);
      if (kind == AttnKind::csa) {
        L.idx_proj = ld.matrix(b + "indexer.proj.weight", D, IH);
        L.idx_q_b = ld.matrix(b + "indexer.attn_q_b.weight", R, IH * I);
        L.idx_comp.kv = ld.matrix(b + "indexer_compressor_kv.weight", D, 2 * I);
        L.idx_comp.gate = ld.matrix(b + "indexer_compressor_gate.weight", D, 2 * I);
        L.idx_comp.ape = ld.params(b + "indexer_compressor_ape.weight", {2 * I, ratio});
        L.idx_comp.norm = ld.vec(b + "indexer_compressor_norm.weight", I);
      }
    }
    L.gate_inp = ld.matrix(b + "ffn_gate_inp.weight", D, E);
    if (il < c.n_hash_layers) {
      L.tid2eid = ld.i32(b + "ffn_gate_tid2eid.weight", K, V, E);
    } else {
      L.bias = ld.vec(b + "exp_probs_b.bias", E);
    }
    const CatalogEntry *ge = ld.entry(b + "ffn_gate_exps.weight", {D, F, E});
    const CatalogEntry *ue = ld.entry(b + "ffn_up_exps.weight", {D, F, E});
    const CatalogEntry *de = ld.entry(b + "ffn_down_exps.weight", {F, D, E});
    if (ge && ue && de && experts_ok) {
      const experts::StackedRole gr = stacked_role(*ge), ur = stacked_role(*ue), dr = stacked_role(*de);
      expert_shapes_.push_back(experts::expert_shape_of(gr, ur, dr));
      if (options.resident_experts) resident.add_layer(gr, ur, dr);
    } else {
      experts_ok = false;
    }
    L.sh_gate = ld.matrix(b + "ffn_gate_shexp.weight", D, FS, false);  // used by be_.ffn as they are
    L.sh_up = ld.matrix(b + "ffn_up_shexp.weight", D, FS, false);
    L.sh_down = ld.matrix(b + "ffn_down_shexp.weight", FS, D, false);
    w_->layers.push_back(std::move(L));
  }
  for (int64_t il = c.n_layers; il < c.n_layers + c.n_mtp_layers; ++il) cat.skip_prefix(fmt::format("blk.{}.", il));
  cat.finish();
  if (options.resident_experts) {
    weight_bytes_ += resident.bytes();
    experts_ = resident.finish();
  }
  log::info("{} loaded from {} ({} MiB in backend memory)", c.summary(), cat.source(), weight_bytes_ >> 20);
}

DeepseekV4State DeepseekV4Model::new_state() const {
  DeepseekV4State s;
  s.layers.resize(static_cast<size_t>(cfg_.n_layers));
  return s;
}

uint64_t DeepseekV4Model::state_bytes(int64_t tokens) const {
  const DeepseekV4Config &c = cfg_;
  if (tokens <= 0) return 0;
  // What compress() and attention() allocate (ensure(), the entries' growth), in f32.
  const auto compressor = [&](int64_t m, int64_t d, bool overlap) {
    const int64_t width = (overlap ? 2 : 1) * d, windows = tokens / m;
    int64_t floats = m > 1 ? 2 * m * width : 0;  // buf_kv, buf_gate: rows of an unfinished window
    if (overlap && windows > 0) floats += 2 * m * d;  // overlap_kv, overlap_gate
    if (windows > 0) floats += state_capacity(windows) * d;
    return static_cast<uint64_t>(floats) * 4;
  };
  uint64_t b = 0;
  for (int64_t il = 0; il < c.n_layers; ++il) {
    if (c.sliding_window > 1) b += static_cast<uint64_t>((c.sliding_window - 1) * c.head_dim) * 4;
    const int64_t m = c.compress_ratio[static_cast<size_t>(il)];
    const AttnKind kind = c.attn_kind[static_cast<size_t>(il)];
    if (kind == AttnKind::sliding || m <= 0) continue;
    b += compressor(m, c.head_dim, kind == AttnKind::csa);
    if (kind == AttnKind::csa) b += compressor(m, c.index_head_dim, true);
  }
  return b;
}

namespace {

/// An f32 / i32 / i8 view of backend memory.
Tensor dev_f32(Device d, const float *p, std::initializer_list<int64_t> shape) { return Tensor::make(p, GgmlType::f32, d, shape); }
Tensor dev_i32(Device d, const int32_t *p, std::initializer_list<int64_t> shape) { return Tensor::make(p, GgmlType::i32, d, shape); }
Tensor dev_i8(Device d, const int8_t *p, std::initializer_list<int64_t> shape) { return Tensor::make(p, GgmlType::i8, d, shape); }

/// dst[0..n) = src[0..n) floats, both in backend memory.
void copy_f32(backend::Backend &be, float *dst, const float *src, int64_t n) {
  if (n > 0) be.copy(dev_f32(be.device(), src, {n}), dev_f32(be.device(), dst, {n}));
}

/// Makes @p buf hold at least @p n floats (new memory, contents not kept).
float *ensure(backend::Backend &be, StateBuffer &buf, int64_t n) {
  const uint64_t bytes = static_cast<uint64_t>(std::max<int64_t>(n, 1)) * 4;
  if (buf.bytes() < bytes) buf = StateBuffer(be, bytes);
  return static_cast<float *>(buf.get());
}

}  // namespace

void DeepseekV4Model::mm(const Tensor &w, const float *x, int64_t k, int64_t n, float *y) {
  const Device dv = be_.device();
  const int64_t kp = w.ne[0];
  if (kp == k) {
    be_.matmul(w, dev_f32(dv, x, {k, n}), dev_f32(dv, y, {w.ne[1], n}));
    return;
  }
  float *xp = site_scratch_->f32(kp * n);
  be_.fill_zero(xp, static_cast<uint64_t>(kp * n) * 4);
  be_.copy_2d(xp, static_cast<uint64_t>(kp) * 4, x, static_cast<uint64_t>(k) * 4, static_cast<uint64_t>(k) * 4, static_cast<uint64_t>(n));
  be_.matmul(w, dev_f32(dv, xp, {kp, n}), dev_f32(dv, y, {w.ne[1], n}));
}

void DeepseekV4Model::compress(int64_t il, bool indexer, const float *kv_in, const float *gate_in, const Step &s,
                               CompressorState &st) {
  const DeepseekV4Config &c = cfg_;
  const Device dv = be_.device();
  Scratch &sc = *site_scratch_;
  const Weights::Comp &W = indexer ? w_->layers[static_cast<size_t>(il)].idx_comp : w_->layers[static_cast<size_t>(il)].comp;
  const bool overlap = c.attn_kind[static_cast<size_t>(il)] == AttnKind::csa;
  const int64_t d = indexer ? c.index_head_dim : c.head_dim, cw = overlap ? 2 : 1, width = cw * d;
  const int64_t m = c.compress_ratio[static_cast<size_t>(il)], n = s.n;
  // The pending rows of earlier calls, then this call's projections: [rows][width].
  const int64_t rows = st.buf_rows + n;
  float *kv = sc.f32(width * rows), *gate = sc.f32(width * rows);
  copy_f32(be_, kv, static_cast<const float *>(st.buf_kv.get()), st.buf_rows * width);
  copy_f32(be_, gate, static_cast<const float *>(st.buf_gate.get()), st.buf_rows * width);
  copy_f32(be_, kv + st.buf_rows * width, kv_in, n * width);
  copy_f32(be_, gate + st.buf_rows * width, gate_in, n * width);
  const int64_t n_win = rows / m;
  if (n_win > 0) {
    // The position bias on every closed window's gates.
    const Tensor ape = dev_f32(dv, W.ape.as<float>(), {width, m});
    for (int64_t w = 0; w < n_win; ++w) {
      const Tensor g = dev_f32(dv, gate + w * m * width, {width, m});
      be_.add(g, ape, g);
    }
    // The pooled slots per window, [d][slots][n_win]: HCA's window rows are that already; CSA
    // takes the previous window's first half then this window's second half (the first window
    // ever has no previous one: its slots get gate −inf, weight 0).
    const int64_t slots = overlap ? 2 * m : m;
    const float *pk = kv, *pg = gate;
    if (overlap) {
      float *gk = sc.f32(d * slots * n_win), *gg = sc.f32(d * slots * n_win);
      const uint64_t row = static_cast<uint64_t>(d) * 4, pitch = static_cast<uint64_t>(width) * 4;
      for (int64_t w = 0; w < n_win; ++w) {
        float *dk = gk + w * slots * d, *dg = gg + w * slots * d;
        if (w > 0) {
          be_.copy_2d(dk, row, kv + (w - 1) * m * width, pitch, row, static_cast<uint64_t>(m));
          be_.copy_2d(dg, row, gate + (w - 1) * m * width, pitch, row, static_cast<uint64_t>(m));
        } else if (st.has_overlap) {
          copy_f32(be_, dk, static_cast<const float *>(st.overlap_kv.get()), m * d);
          copy_f32(be_, dg, static_cast<const float *>(st.overlap_gate.get()), m * d);
        } else {
          const std::vector<float> neg_inf(static_cast<size_t>(m * d), -INFINITY);
          be_.fill_zero(dk, static_cast<uint64_t>(m * d) * 4);
          be_.upload(dg, neg_inf.data(), static_cast<uint64_t>(m * d) * 4);
        }
        be_.copy_2d(dk + m * d, row, kv + w * m * width + d, pitch, row, static_cast<uint64_t>(m));
        be_.copy_2d(dg + m * d, row, gate + w * m * width + d, pitch, row, static_cast<uint64_t>(m));
      }
      pk = gk;
      pg = gg;
      // The last closed window's first half is the next window's overlap.
      float *ok = ensure(be_, st.overlap_kv, m * d), *og = ensure(be_, st.overlap_gate, m * d);
      be_.copy_2d(ok, row, kv + (n_win - 1) * m * width, pitch, row, static_cast<uint64_t>(m));
      be_.copy_2d(og, row, gate + (n_win - 1) * m * width, pitch, row, static_cast<uint64_t>(m));
      st.has_overlap = true;
    }
    float *pooled = sc.f32(d * n_win);
    be_.pool_windows(dev_f32(dv, pk, {d, slots, n_win}), dev_f32(dv, pg, {d, slots, n_win}), dev_f32(dv, pooled, {d, n_win}));
    // Norm and RoPE at each window's first position, appended to the entries.
    if (st.n_entries + n_win > st.entries_capacity) {
      const int64_t cap = state_capacity(st.n_entries + n_win);
      StateBuffer grown(be_, static_cast<uint64_t>(cap * d) * 4);
      copy_f32(be_, static_cast<float *>(grown.get()), static_cast<const float *>(st.entries.get()), st.n_entries * d);
      st.entries = std::move(grown);
      st.entries_capacity = cap;
    }
    float *dst = static_cast<float *>(st.entries.get()) + st.n_entries * d;
    be_.rms_norm(dev_f32(dv, pooled, {d, n_win}), &W.norm, c.rms_eps, dev_f32(dv, dst, {d, n_win}));
    std::vector<int32_t> pos(static_cast<size_t>(n_win));
    for (int64_t w = 0; w < n_win; ++w) pos[static_cast<size_t>(w)] = static_cast<int32_t>((st.n_entries + w) * m);
    int32_t *pos_d = sc.i32(n_win);
    be_.upload(pos_d, pos.data(), pos.size() * 4);
    const Tensor e = dev_f32(dv, dst, {d, 1, n_win});
    be_.rope(e, dev_i32(dv, pos_d, {n_win}), rope_params(c, true, d, false), e);
    st.n_entries += n_win;
  }
  // Rows of the unfinished window wait for the next call.
  st.buf_rows = rows - n_win * m;
  if (st.buf_rows > 0) {
    copy_f32(be_, ensure(be_, st.buf_kv, m * width), kv + n_win * m * width, st.buf_rows * width);
    copy_f32(be_, ensure(be_, st.buf_gate, m * width), gate + n_win * m * width, st.buf_rows * width);
  }
}

void DeepseekV4Model::project_attention(int64_t il, const float *x, const Batch &b, AttentionProjections &p) {
  const DeepseekV4Config &c = cfg_;
  const Device dv = be_.device();
  Scratch &sc = *site_scratch_;
  const Weights::Layer &L = w_->layers[static_cast<size_t>(il)];
  const int64_t D = c.hidden, H = c.n_heads, hd = c.head_dim, R = c.q_lora_rank, n = b.n;
  const AttnKind kind = c.attn_kind[static_cast<size_t>(il)];
  const bool compressed = kind != AttnKind::sliding;
  const backend::RopeParams rp = rope_params(c, compressed, hd, false);
  // query: low-rank, weighted norm, per-head unweighted norm, RoPE
  float *qa = sc.f32(R * n), *qr = sc.f32(R * n);
  p.q = sc.f32(H * hd * n);
  mm(L.q_a, x, D, n, qa);
  be_.rms_norm(dev_f32(dv, qa, {R, n}), &L.q_a_norm, c.rms_eps, dev_f32(dv, qr, {R, n}));
  mm(L.q_b, qr, R, n, p.q);
  be_.rms_norm(dev_f32(dv, p.q, {hd, H * n}), nullptr, c.rms_eps, dev_f32(dv, p.q, {hd, H * n}));
  be_.rope(dev_f32(dv, p.q, {hd, H, n}), b.pos_dev, rp, dev_f32(dv, p.q, {hd, H, n}));
  // this pass's key rows: weighted norm, RoPE
  float *kv0 = sc.f32(hd * n);
  p.kv = sc.f32(hd * n);
  mm(L.kv, x, D, n, kv0);
  be_.rms_norm(dev_f32(dv, kv0, {hd, n}), &L.kv_norm, c.rms_eps, dev_f32(dv, p.kv, {hd, n}));
  be_.rope(dev_f32(dv, p.kv, {hd, 1, n}), b.pos_dev, rp, dev_f32(dv, p.kv, {hd, 1, n}));
  if (!compressed) return;
  const int64_t cw = kind == AttnKind::csa ? 2 : 1;
  p.comp_kv = sc.f32(cw * hd * n);
  p.comp_gate = sc.f32(cw * hd * n);
  mm(L.comp.kv, x, D, n, p.comp_kv);
  mm(L.comp.gate, x, D, n, p.comp_gate);
  if (kind != AttnKind::csa) return;
  const int64_t I = c.index_head_dim, IH = c.index_n_heads;
  p.index_kv = sc.f32(cw * I * n);
  p.index_gate = sc.f32(cw * I * n);
  mm(L.idx_comp.kv, x, D, n, p.index_kv);
  mm(L.idx_comp.gate, x, D, n, p.index_gate);
  // The indexer's query and head weights, where some token of the pass sees more compressed
  // entries than the indexer keeps (entries_seen).
  const int64_t ratio = c.compress_ratio[static_cast<size_t>(il)];
  bool need_index = false;
  for (const Step &st : b.seqs)
    for (int64_t t = 0; t < st.n && !need_index; ++t) need_index = entries_seen(st.pos[t], ratio) > c.index_topk;
  if (!need_index) return;
  p.index_q = sc.f32(IH * I * n);
  p.index_w = sc.f32(IH * n);
  mm(L.idx_q_b, qr, R, n, p.index_q);
  be_.rope(dev_f32(dv, p.index_q, {I, IH, n}), b.pos_dev, rope_params(c, true, I, false), dev_f32(dv, p.index_q, {I, IH, n}));
  mm(L.idx_proj, x, D, n, p.index_w);
  be_.scale(dev_f32(dv, p.index_w, {IH, n}), 1.0f / std::sqrt(static_cast<float>(IH)), dev_f32(dv, p.index_w, {IH, n}));
}

void DeepseekV4Model::attention_core(int64_t il, const AttentionProjections &p, const Step &s, LayerState &st, float *att) {
  const DeepseekV4Config &c = cfg_;
  const Device dv = be_.device();
  Scratch &sc = *site_scratch_;
  const Weights::Layer &L = w_->layers[static_cast<size_t>(il)];
  const int64_t H = c.n_heads, hd = c.head_dim, n = s.n, o = s.offset;
  const AttnKind kind = c.attn_kind[static_cast<size_t>(il)];
  const int64_t ratio = c.compress_ratio[static_cast<size_t>(il)];
  const bool compressed = kind != AttnKind::sliding;
  const int64_t cw = kind == AttnKind::csa ? 2 : 1;
  // compressed entries first (the keys buffer needs their count)
  if (compressed) compress(il, false, p.comp_kv + o * cw * hd, p.comp_gate + o * cw * hd, s, st.comp);
  const int64_t n_comp = compressed ? st.comp.n_entries : 0;
  // keys: the kept window rows, this call's rows, the compressed entries
  const int64_t n_win = static_cast<int64_t>(st.window_pos.size()), n_raw = n_win + n, n_keys = n_raw + n_comp;
  float *keys = sc.f32(hd * n_keys);
  copy_f32(be_, keys, static_cast<const float *>(st.window.get()), n_win * hd);
  copy_f32(be_, keys + n_win * hd, p.kv + o * hd, n * hd);
  copy_f32(be_, keys + n_raw * hd, static_cast<const float *>(st.comp.entries.get()), n_comp * hd);
  // Visibility [n_keys][n]: the window by position; compressed entry w once w < (P+1)/ratio
  // (HCA: all of those; CSA: the indexer's top index_topk of them, marked on the device).
  std::vector<int32_t> key_pos(st.window_pos);
  key_pos.insert(key_pos.end(), s.pos, s.pos + n);
  std::vector<int8_t> vis(static_cast<size_t>(n * n_keys), 0);
  std::vector<int64_t> valid(static_cast<size_t>(n), 0);
  bool need_index = false;
  for (int64_t t = 0; t < n; ++t) {
    int8_t *v = vis.data() + t * n_keys;
    const int64_t P = s.pos[t];
    for (int64_t j = 0; j < n_raw; ++j) v[j] = key_pos[static_cast<size_t>(j)] <= P && key_pos[static_cast<size_t>(j)] > P - c.sliding_window;
    if (!n_comp) continue;
    valid[static_cast<size_t>(t)] = std::min<int64_t>(entries_seen(P, ratio), n_comp);
    if (kind == AttnKind::csa && valid[static_cast<size_t>(t)] > c.index_topk)
      need_index = true;
    else
      for (int64_t e = 0; e < valid[static_cast<size_t>(t)]; ++e) v[n_raw + e] = 1;
  }
  int8_t *vis_d = sc.i8(n * n_keys);
  be_.upload(vis_d, vis.data(), vis.size());
  const Tensor vis_t = dev_i8(dv, vis_d, {n_keys, n});
  if (kind == AttnKind::csa) {
    const int64_t IH = c.index_n_heads, I = c.index_head_dim;
    compress(il, true, p.index_kv + o * cw * I, p.index_gate + o * cw * I, s, st.index);
    if (st.index.n_entries != n_comp)
      fail(Status::internal, "layer {}: indexer has {} entries, compressor {}", il, st.index.n_entries, n_comp);
    if (need_index) {
      if (!p.index_q) fail(Status::internal, "layer {}: a token needs the indexer, but the pass made no indexer projections", il);
      // score[e, t] = Σ_h w_h·ReLU(q_h·k_e)·I^-½ over the entries token t may see, top index_topk
      const int64_t k = std::min<int64_t>(c.index_topk, n_comp);
      float *scores = sc.f32(n_comp * n), *top_v = sc.f32(k * n);
      int32_t *top_i = sc.i32(k * n);
      std::vector<int8_t> ivis(static_cast<size_t>(n * n_comp), 0);
      for (int64_t t = 0; t < n; ++t)
        if (valid[static_cast<size_t>(t)] > c.index_topk)  // the others already see all of theirs
          std::fill_n(ivis.data() + t * n_comp, valid[static_cast<size_t>(t)], int8_t{1});
      int8_t *ivis_d = sc.i8(n * n_comp);
      be_.upload(ivis_d, ivis.data(), ivis.size());
      be_.indexer_scores(dev_f32(dv, p.index_q + o * IH * I, {I, IH, n}), dev_f32(dv, p.index_w + o * IH, {IH, n}),
                         dev_f32(dv, static_cast<const float *>(st.index.entries.get()), {I, n_comp}),
                         dev_i8(dv, ivis_d, {n_comp, n}), 1.0f / std::sqrt(static_cast<float>(I)),
                         dev_f32(dv, scores, {n_comp, n}));
      be_.top_k(dev_f32(dv, scores, {n_comp, n}), static_cast<int32_t>(k), dev_i32(dv, top_i, {k, n}), dev_f32(dv, top_v, {k, n}));
      be_.set_visible(dev_i32(dv, top_i, {k, n}), dev_f32(dv, top_v, {k, n}), n_raw, vis_t);
    }
  }
  be_.attention_sinks(dev_f32(dv, p.q + o * H * hd, {hd, H, n}), dev_f32(dv, keys, {hd, n_keys}), vis_t, L.sinks,
                      1.0f / std::sqrt(static_cast<float>(hd)), dev_f32(dv, att, {hd, H, n}));
  // keep the last W − 1 raw rows for the next call
  const int64_t keep = std::min<int64_t>(n_raw, std::max<int64_t>(c.sliding_window - 1, 0));
  if (keep > 0) copy_f32(be_, ensure(be_, st.window, std::max<int64_t>(c.sliding_window - 1, 1) * hd), keys + (n_raw - keep) * hd, keep * hd);
  st.window_pos.assign(key_pos.begin() + (n_raw - keep), key_pos.begin() + n_raw);
}

void DeepseekV4Model::attention(int64_t il, const float *x, const Batch &b, float *out) {
  const DeepseekV4Config &c = cfg_;
  const Device dv = be_.device();
  Scratch &sc = *site_scratch_;
  const Weights::Layer &L = w_->layers[static_cast<size_t>(il)];
  const int64_t H = c.n_heads, hd = c.head_dim, G = c.o_groups, O = c.o_lora_rank, n = b.n;
  const bool compressed = c.attn_kind[static_cast<size_t>(il)] != AttnKind::sliding;
  AttentionProjections p;
  project_attention(il, x, b, p);
  // The core per sequence (its own state and positions); the scratch it takes is reused by the
  // next sequence (ops are ordered on the stream).
  float *att = sc.f32(hd * H * n);
  const BackendScratch::Mark mark = sc.mark();
  for (const Step &st : b.seqs) {
    attention_core(il, p, st, st.state->layers[static_cast<size_t>(il)], att + st.offset * hd * H);
    sc.release(mark);
  }
  // inverse RoPE at the query positions, then the grouped low-rank output
  be_.rope(dev_f32(dv, att, {hd, H, n}), b.pos_dev, rope_params(c, compressed, hd, true), dev_f32(dv, att, {hd, H, n}));
  // (o_a's rows may be zero-padded to gin_p values: see Loader::matrix)
  const int64_t gin = H * hd / G, gin_p = L.o_a.ne[0];
  float *oa = sc.f32(G * O * n);
  if (gin_p == gin) {
    be_.grouped_matmul(L.o_a, G, dev_f32(dv, att, {H * hd, n}), dev_f32(dv, oa, {G * O, n}));
  } else {
    // o_a's rows were zero-padded to gin_p values: each group's input is padded the same way
    float *xg = sc.f32(gin_p * n), *yg = sc.f32(O * n);
    be_.fill_zero(xg, static_cast<uint64_t>(gin_p * n) * 4);
    const uint64_t oa_row = L.o_a.row_bytes();
    for (int64_t g = 0; g < G; ++g) {
      be_.copy_2d(xg, static_cast<uint64_t>(gin_p) * 4, att + g * gin, static_cast<uint64_t>(H * hd) * 4,
                  static_cast<uint64_t>(gin) * 4, static_cast<uint64_t>(n));
      const Tensor wg =
          Tensor::make(static_cast<const uint8_t *>(L.o_a.data) + static_cast<uint64_t>(g * O) * oa_row, L.o_a.type, dv, {gin_p, O});
      be_.matmul(wg, dev_f32(dv, xg, {gin_p, n}), dev_f32(dv, yg, {O, n}));
      be_.copy_2d(oa + g * O, static_cast<uint64_t>(G * O) * 4, yg, static_cast<uint64_t>(O) * 4, static_cast<uint64_t>(O) * 4,
                  static_cast<uint64_t>(n));
    }
  }
  mm(L.o_b, oa, G * O, n, out);
}

void DeepseekV4Model::moe(int64_t il, const float *x, const Batch &s, float *out) {
  const DeepseekV4Config &c = cfg_;
  const Device dv = be_.device();
  Scratch &sc = *site_scratch_;
  const Weights::Layer &L = w_->layers[static_cast<size_t>(il)];
  const int64_t D = c.hidden, E = c.n_experts, K = c.n_experts_used, n = s.n;
  float *shared = sc.f32(D * n);
  if (!experts_) fail(Status::internal, "DeepSeek-V4: no routed-expert provider (set_experts() was not called)");
  // Every block is a MoE block: provider layer = block. The router of block l on x: its picks
  // (ids) and weights.
  experts::MoeLayer ml;
  ml.layer = il;
  ml.next_layer = il + 1 < c.n_layers ? il + 1 : -1;
  ml.route = [&](bool next) {
    const int64_t layer = next ? il + 1 : il;
    const Weights::Layer &RL = w_->layers[static_cast<size_t>(layer)];
    log::trace("DeepSeek-V4 layer {}: the router over {} tokens{}", layer, n, next ? " (a prefetch hint)" : "");
    float *lg = sc.f32(E * n), *w = sc.f32(K * n);
    int32_t *ids = sc.i32(K * n);
    mm(RL.gate_inp, x, D, n, lg);
    backend::RouterParams rp;
    rp.scoring = backend::Scoring::sqrt_softplus;
    rp.k = static_cast<int32_t>(K);
    rp.renormalize = c.norm_topk;
    rp.scale = c.routed_scale;
    if (RL.tid2eid.data) {
      rp.hash_table = &RL.tid2eid;
      rp.token_ids = &s.tokens_dev;
    } else {
      rp.bias = &RL.bias;
    }
    experts::Routed r{dev_i32(dv, ids, {K, n}), dev_f32(dv, w, {K, n})};
    be_.route(dev_f32(dv, lg, {E, n}), rp, r.ids, r.weights);
    return r;
  };
  backend::Activation act;
  act.kind = backend::ActivationKind::swiglu;
  act.limit = c.swiglu_limit[static_cast<size_t>(il)];
  // The shared experts are queued while the router's ids travel to the host (when the provider
  // needs them there: a cache decides hits and misses on the host).
  const experts::MoeStep step = experts::start_moe(be_, *experts_, ml);
  backend::Activation sact = act;
  sact.limit = c.swiglu_limit_shared[static_cast<size_t>(il)];
  be_.ffn(dev_f32(dv, x, {D, n}), L.sh_gate, L.sh_up, L.sh_down, sact, dev_f32(dv, shared, {D, n}));
  experts::finish_moe(be_, *experts_, step, x, out, D, act);
  be_.add(dev_f32(dv, out, {D, n}), dev_f32(dv, shared, {D, n}), dev_f32(dv, out, {D, n}));
}

void DeepseekV4Model::hc_site(int64_t il, bool ffn, float *h, const Batch &b) {
  const DeepseekV4Config &c = cfg_;
  const Device dv = be_.device();
  Scratch &sc = *site_scratch_;
  sc.reset();
  const Weights::Layer &L = w_->layers[static_cast<size_t>(il)];
  const Weights::Hc &W = ffn ? L.hc_ffn : L.hc_attn;
  const int64_t D = c.hidden, hc = c.hc_mult, M = c.hc_mix(), n = b.n;
  float *flat = sc.f32(hc * D * n), *mix = sc.f32(M * n), *pre = sc.f32(hc * n), *post = sc.f32(hc * n),
        *comb = sc.f32(hc * hc * n), *col = sc.f32(D * n), *xin = sc.f32(D * n), *y = sc.f32(D * n);
  be_.rms_norm(dev_f32(dv, h, {hc * D, n}), nullptr, c.rms_eps, dev_f32(dv, flat, {hc * D, n}));
  mm(W.fn, flat, hc * D, n, mix);
  const Tensor post_t = dev_f32(dv, post, {hc, n}), comb_t = dev_f32(dv, comb, {hc * hc, n});
  be_.hc_weights(dev_f32(dv, mix, {M, n}), W.scale, W.base, c.hc_eps, static_cast<int32_t>(c.hc_sinkhorn_iters),
                 dev_f32(dv, pre, {hc, n}), &post_t, &comb_t);
  be_.hc_collapse(dev_f32(dv, h, {D, hc, n}), dev_f32(dv, pre, {hc, n}), dev_f32(dv, col, {D, n}));
  be_.rms_norm(dev_f32(dv, col, {D, n}), ffn ? &L.ffn_norm : &L.attn_norm, c.rms_eps, dev_f32(dv, xin, {D, n}));
  if (ffn) {
    moe(il, xin, b, y);
  } else {
    attention(il, xin, b, y);
  }
  const Tensor streams = dev_f32(dv, h, {D, hc, n});
  be_.hc_expand(streams, dev_f32(dv, y, {D, n}), post_t, comb_t, streams);
}

void DeepseekV4Model::forward(const int32_t *tokens, int64_t n, DeepseekV4State &state, float *logits) {
  const Tensor out = forward(tokens, n, state, logits ? LogitRows::all : LogitRows::none);
  if (logits && out.data) be_.download(logits, out.data, out.n_bytes());
}

Tensor DeepseekV4Model::forward(const int32_t *tokens, int64_t n, DeepseekV4State &state, LogitRows rows) {
  if (n <= 0) return {};
  const int64_t offsets[2] = {0, n};
  DeepseekV4State *states[1] = {&state};
  return forward_batch(std::span<const int32_t>(tokens, static_cast<size_t>(n)), offsets, states, rows);
}

Tensor DeepseekV4Model::forward_batch(std::span<const int32_t> tokens, std::span<const int64_t> offsets,
                                      std::span<DeepseekV4State *const> states, LogitRows rows) {
  const DeepseekV4Config &c = cfg_;
  const int64_t S = static_cast<int64_t>(states.size()), n = static_cast<int64_t>(tokens.size());
  if (S == 0 || offsets.size() != states.size() + 1 || offsets.front() != 0 || offsets.back() != n)
    fail(Status::invalid_argument, "DeepSeek-V4 forward: {} sequence offsets for {} states and {} tokens", offsets.size(), S, n);
  for (int64_t i = 0; i < S; ++i) {
    const DeepseekV4State &st = *states[static_cast<size_t>(i)];
    if (static_cast<int64_t>(st.layers.size()) != c.n_layers)
      fail(Status::invalid_argument, "DeepSeek-V4 forward: state has {} layers, the model {}", st.layers.size(), c.n_layers);
    const int64_t len = offsets[static_cast<size_t>(i) + 1] - offsets[static_cast<size_t>(i)];
    if (len <= 0) fail(Status::invalid_argument, "DeepSeek-V4 forward: sequence {} has no tokens", i);
    if (st.n_past + len > INT32_MAX) fail(Status::invalid_argument, "DeepSeek-V4 forward: position overflow");
    for (int64_t j = 0; j < i; ++j)
      if (states[static_cast<size_t>(j)] == states[static_cast<size_t>(i)])
        fail(Status::invalid_argument, "DeepSeek-V4 forward: sequences {} and {} share one state", j, i);
  }
  for (int64_t t = 0; t < n; ++t)
    if (tokens[static_cast<size_t>(t)] < 0 || tokens[static_cast<size_t>(t)] >= c.vocab)
      fail(Status::invalid_argument, "DeepSeek-V4 forward: token {} at {} is outside 0..{}", tokens[static_cast<size_t>(t)], t,
           c.vocab - 1);
  const Device dv = be_.device();
  const int64_t D = c.hidden, hc = c.hc_mult, V = c.vocab;
  Scratch &fs = *fwd_scratch_;
  fs.reset();
  std::vector<int32_t> pos(static_cast<size_t>(n));
  int32_t *tok_d = fs.i32(n), *pos_d = fs.i32(n);
  Batch b;
  b.n = n;
  b.tokens_dev = dev_i32(dv, tok_d, {n});
  b.pos_dev = dev_i32(dv, pos_d, {n});
  for (int64_t i = 0; i < S; ++i) {
    Step st;
    st.offset = offsets[static_cast<size_t>(i)];
    st.n = offsets[static_cast<size_t>(i) + 1] - st.offset;
    st.state = states[static_cast<size_t>(i)];
    for (int64_t t = 0; t < st.n; ++t) pos[static_cast<size_t>(st.offset + t)] = static_cast<int32_t>(st.state->n_past + t);
    st.tokens = tokens.data() + st.offset;
    st.pos = pos.data() + st.offset;
    st.tokens_dev = dev_i32(dv, tok_d + st.offset, {st.n});
    st.pos_dev = dev_i32(dv, pos_d + st.offset, {st.n});
    b.seqs.push_back(st);
  }
  be_.upload(tok_d, tokens.data(), static_cast<uint64_t>(n) * 4);
  be_.upload(pos_d, pos.data(), static_cast<uint64_t>(n) * 4);
  // the embedding, copied into each of the hc streams: h [D, hc, n]
  float *emb = fs.f32(D * n), *h = fs.f32(hc * D * n);
  be_.embed(w_->token_embd, b.tokens_dev, dev_f32(dv, emb, {D, n}));
  for (int64_t j = 0; j < hc; ++j)
    be_.copy_2d(h + j * D, static_cast<uint64_t>(hc * D) * 4, emb, static_cast<uint64_t>(D) * 4, static_cast<uint64_t>(D) * 4,
                static_cast<uint64_t>(n));
  for (int64_t il = 0; il < c.n_layers; ++il) {
    hc_site(il, false, h, b);
    hc_site(il, true, h, b);
  }
  for (const Step &st : b.seqs) st.state->n_past += st.n;
  if (rows == LogitRows::none) return {};
  // final hyper-connection head (pre weights only), norm, lm_head: on each sequence's last token
  // only when that is all the caller needs (generation)
  const int64_t m = rows == LogitRows::last ? S : n;
  const float *hm = h;
  if (rows == LogitRows::last) {
    if (S == 1) {
      hm = h + (n - 1) * hc * D;
    } else {
      float *last = fs.f32(hc * D * S);
      for (int64_t i = 0; i < S; ++i)
        copy_f32(be_, last + i * hc * D, h + (offsets[static_cast<size_t>(i) + 1] - 1) * hc * D, hc * D);
      hm = last;
    }
  }
  Scratch &sc = *site_scratch_;
  sc.reset();
  float *flat = sc.f32(hc * D * m), *mix = sc.f32(hc * m), *pre = sc.f32(hc * m), *col = sc.f32(D * m), *normed = sc.f32(D * m);
  float *out = fs.f32(V * m);
  be_.rms_norm(dev_f32(dv, hm, {hc * D, m}), nullptr, c.rms_eps, dev_f32(dv, flat, {hc * D, m}));
  mm(w_->output_hc_fn, flat, hc * D, m, mix);
  be_.hc_weights(dev_f32(dv, mix, {hc, m}), w_->output_hc_scale, w_->output_hc_base, c.hc_eps, 0, dev_f32(dv, pre, {hc, m}),
                 nullptr, nullptr);
  be_.hc_collapse(dev_f32(dv, hm, {D, hc, m}), dev_f32(dv, pre, {hc, m}), dev_f32(dv, col, {D, m}));
  be_.rms_norm(dev_f32(dv, col, {D, m}), &w_->output_norm, c.rms_eps, dev_f32(dv, normed, {D, m}));
  mm(w_->output, normed, D, m, out);
  return rows == LogitRows::last && S == 1 ? dev_f32(dv, out, {V}) : dev_f32(dv, out, {V, m});
}

}  // namespace ep::model
