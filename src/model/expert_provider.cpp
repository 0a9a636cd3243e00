#include "model/expert_provider.hpp"

#include "core/error.hpp"
#include "format/ggml_type.hpp"
#include "model/weight_catalog.hpp"

#include <algorithm>
#include <span>

namespace ep::model {

ExpertShape expert_shape_of(const CatalogEntry &gate, const CatalogEntry &up, const CatalogEntry &down) {
  auto shape_of = [](const CatalogEntry &e) {
    if (!backend::is_supported_weight_type(e.type))
      fail(Status::unsupported, "{}: ggml type {} is not supported for experts", e.origin, static_cast<uint32_t>(e.type));
    backend::SlotWeight w;
    w.type = e.type;
    w.ne0 = e.ne[0];
    w.ne1 = e.ne[1];
    return w;
  };
  return ExpertShape{shape_of(gate), shape_of(up), shape_of(down)};
}

void ResidentExperts::add_layer(const CatalogEntry &gate, const CatalogEntry &up, const CatalogEntry &down) {
  if (!gate.read_expert || !up.read_expert || !down.read_expert)
    fail(Status::internal, "experts of layer {}: the source cannot read single experts", layers_.size());
  const int64_t n_exp = gate.ne[2];
  Layer l;
  auto slot_weight = [](const CatalogEntry &e, uint64_t offset) {
    backend::SlotWeight w;
    w.offset = offset;
    w.type = e.type;
    w.ne0 = e.ne[0];
    w.ne1 = e.ne[1];
    return w;
  };
  const uint64_t gate_bytes = format::ggml_row_bytes(gate.type, static_cast<uint64_t>(gate.ne[0]), gate.origin) * static_cast<uint64_t>(gate.ne[1]);
  const uint64_t up_bytes = format::ggml_row_bytes(up.type, static_cast<uint64_t>(up.ne[0]), up.origin) * static_cast<uint64_t>(up.ne[1]);
  const uint64_t down_bytes = format::ggml_row_bytes(down.type, static_cast<uint64_t>(down.ne[0]), down.origin) * static_cast<uint64_t>(down.ne[1]);
  l.layout.gate = slot_weight(gate, 0);
  l.layout.up = slot_weight(up, gate_bytes);
  l.layout.down = slot_weight(down, gate_bytes + up_bytes);
  const uint64_t total = gate_bytes + up_bytes + down_bytes;
  std::vector<uint8_t> host(static_cast<size_t>(total));
  for (int64_t e = 0; e < n_exp; ++e) {
    const std::vector<uint8_t> g = gate.read_expert(e), u = up.read_expert(e), d = down.read_expert(e);
    if (g.size() != gate_bytes || u.size() != up_bytes || d.size() != down_bytes)
      fail(Status::corrupt, "expert {} of {}: read {}+{}+{} bytes, expected {}+{}+{}", e, gate.origin, g.size(), u.size(),
           d.size(), gate_bytes, up_bytes, down_bytes);
    std::copy(g.begin(), g.end(), host.begin());
    std::copy(u.begin(), u.end(), host.begin() + static_cast<std::ptrdiff_t>(gate_bytes));
    std::copy(d.begin(), d.end(), host.begin() + static_cast<std::ptrdiff_t>(gate_bytes + up_bytes));
    DeviceBuffer buf(be_, total);
    be_.upload(buf.get(), host.data(), total);
    l.slots.push_back(buf.get());
    l.objects.push_back(std::move(buf));
    bytes_ += total;
  }
  l.slots_dev = DeviceBuffer(be_, l.slots.size() * sizeof(void *));
  be_.upload(l.slots_dev.get(), l.slots.data(), l.slots.size() * sizeof(void *));
  layers_.push_back(std::move(l));
}

const ResidentExperts::Layer &ResidentExperts::layer_at(int64_t layer) const {
  if (layer < 0 || layer >= static_cast<int64_t>(layers_.size())) fail(Status::invalid_argument, "experts: no layer {}", layer);
  return layers_[static_cast<size_t>(layer)];
}

const backend::SlotLayout &ResidentExperts::layout(int64_t layer) const { return layer_at(layer).layout; }

backend::ExpertBatch ResidentExperts::acquire(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids,
                                              std::span<const int32_t> only) {
  const Layer &l = layer_at(layer);
  const int64_t n = ids.n_elems(), n_exp = static_cast<int64_t>(l.slots.size());
  backend::ExpertBatch b;
  b.n_pairs = n;
  if (host_ids) {
    std::vector<uint8_t> wanted;
    if (!only.empty()) {
      wanted.assign(static_cast<size_t>(n_exp), 0);
      for (int32_t e : only) {
        if (e < 0 || e >= n_exp) fail(Status::invalid_argument, "experts: layer {}: expert {} outside 0..{}", layer, e, n_exp - 1);
        wanted[static_cast<size_t>(e)] = 1;
      }
    }
    pair_slots_.assign(static_cast<size_t>(n), nullptr);
    for (int64_t p = 0; p < n; ++p) {
      const int32_t e = host_ids[p];
      if (e < 0 || e >= n_exp)
        fail(Status::corrupt, "experts: layer {}: expert id {} at pair {} is outside 0..{}", layer, e, p, n_exp - 1);
      if (wanted.empty() || wanted[static_cast<size_t>(e)]) pair_slots_[static_cast<size_t>(p)] = l.slots[static_cast<size_t>(e)];
    }
    b.pair_slots = pair_slots_.data();
    b.pair_experts = host_ids;
  }
  if (only.empty() && !be_.moe_reads_host_picks(ids.n_rows(), l.layout)) {
    const uint64_t bytes = static_cast<uint64_t>(3 * n) * sizeof(void *);
    if (role_table_.bytes() < bytes) role_table_ = DeviceBuffer(be_, bytes);
    auto *table = static_cast<const void **>(role_table_.get());
    be_.gather_role_table(ids, static_cast<const void *const *>(l.slots_dev.get()), n_exp, l.layout, table);
    b.role_table = table;
  }
  return b;
}

namespace {

/// The distinct experts of ids[p0 .. p1), ascending.
std::vector<int32_t> distinct_experts(const int32_t *ids, int64_t p0, int64_t p1) {
  std::vector<int32_t> out(ids + p0, ids + p1);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

/// Bytes of per-pick rows one expert-major pass holds at most (the tokens go in chunks below it).
constexpr uint64_t kPairRowsBytes = uint64_t{256} << 20;

/// Expert-major: for chunks of tokens, every expert the chunk picks goes through the cache once
/// (max_unique at a time), computing the rows of its picks (Backend::moe_pairs); then each token
/// sums its rows in pick order (moe_combine) — moe()'s arithmetic, so the same bits, with each
/// expert read once per chunk instead of once per small group of tokens.
void run_expert_major(backend::Backend &be, ExpertProvider &experts, const RoutedPicks &picks, const backend::Tensor &weights,
                      const float *x, float *y, int64_t d, const backend::Activation &act, int64_t max_unique) {
  using backend::GgmlType;
  using backend::Tensor;
  const backend::Device dv = be.device();
  const int64_t k = picks.ids.ne[0], n = picks.ids.n_rows();
  const int64_t row_bytes = k * d * static_cast<int64_t>(sizeof(float));
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(n, static_cast<int64_t>(kPairRowsBytes) / row_bytes));
  DeviceBuffer rows(be, static_cast<uint64_t>(chunk * row_bytes));
  float *pair_rows = static_cast<float *>(rows.get());
  for (int64_t t0 = 0; t0 < n; t0 += chunk) {
    const int64_t m = std::min(chunk, n - t0);
    const Tensor xc = Tensor::make(x + t0 * d, GgmlType::f32, dv, {d, m});
    const Tensor idc = Tensor::make(picks.ids.as<int32_t>() + t0 * k, GgmlType::i32, dv, {k, m});
    const Tensor pc = Tensor::make(pair_rows, GgmlType::f32, dv, {d, k * m});
    const int32_t *host = picks.host_ids + t0 * k;
    const std::vector<int32_t> need = distinct_experts(host, 0, m * k);
    for (size_t e0 = 0; e0 < need.size(); e0 += static_cast<size_t>(max_unique)) {
      const size_t e1 = std::min(need.size(), e0 + static_cast<size_t>(max_unique));
      const std::span<const int32_t> group(need.data() + e0, e1 - e0);
      const backend::ExpertBatch batch = experts.acquire(picks.layer, idc, host, group);
      try {
        be.moe_pairs(xc, idc, batch, experts.layout(picks.layer), act, pc);
      } catch (...) {
        experts.release(picks.layer);
        throw;
      }
      experts.release(picks.layer);
    }
    be.moe_combine(pc, Tensor::make(weights.as<float>() + t0 * k, GgmlType::f32, dv, {k, m}),
                   Tensor::make(y + t0 * d, GgmlType::f32, dv, {d, m}));
  }
}

}  // namespace

RoutedPicks start_routed_experts(backend::Backend &be, ExpertProvider &experts, int64_t layer, const backend::Tensor &ids,
                                 const backend::Tensor *hint_ids, int64_t hint_layer) {
  RoutedPicks p;
  p.layer = layer;
  p.ids = ids;
  if (experts.needs_host_ids() || be.moe_reads_host_picks(ids.n_rows(), experts.layout(layer))) {
    auto *host = static_cast<int32_t *>(be.host_buffer(0, ids.n_bytes()));
    be.download_async(host, ids.data, ids.n_bytes());
    p.host_ids = host;
  }
  if (hint_ids && hint_layer >= 0 && experts.wants_hints()) {
    auto *host = static_cast<int32_t *>(be.host_buffer(1, hint_ids->n_bytes()));
    be.download_async(host, hint_ids->data, hint_ids->n_bytes());
    p.hint_layer = hint_layer;
    p.n_hint = hint_ids->n_elems();
    p.host_hint = host;
  }
  return p;
}

namespace {

/// The staged MoE: the rows of the pairs whose experts are resident first, then of each group of
/// experts as its reads land, then the pick-order sums (moe()'s bits: moe_pairs over disjoint
/// batches covering every pair, then moe_combine).
void run_staged(backend::Backend &be, ExpertProvider &experts, const RoutedPicks &picks, const backend::Tensor &weights,
                const float *x, float *y, int64_t d, const backend::Activation &act) {
  using backend::GgmlType;
  using backend::Tensor;
  const backend::Device dv = be.device();
  const int64_t k = picks.ids.ne[0], n = picks.ids.n_rows();
  const backend::SlotLayout &layout = experts.layout(picks.layer);
  const Tensor xt = Tensor::make(x, GgmlType::f32, dv, {d, n}), yt = Tensor::make(y, GgmlType::f32, dv, {d, n});
  const backend::ExpertBatch first = experts.acquire_staged(picks.layer, picks.ids, picks.host_ids);
  try {
    if (picks.host_hint) experts.hint(picks.hint_layer, std::span<const int32_t>(picks.host_hint, static_cast<size_t>(picks.n_hint)));
    bool all = first.pair_slots != nullptr, any = false;
    if (first.pair_slots)
      for (int64_t p = 0; p < first.n_pairs; ++p) {
        if (first.pair_slots[p]) any = true;
        else all = false;
      }
    if (all) {
      be.moe(xt, picks.ids, weights, first, layout, act, yt);
    } else {
      float *rows = experts.staged_rows(be, static_cast<uint64_t>(k * n * d) * sizeof(float));
      const Tensor rt = Tensor::make(rows, GgmlType::f32, dv, {d, k * n});
      if (any) be.moe_pairs(xt, picks.ids, first, layout, act, rt);
      backend::ExpertBatch more;
      while (experts.next_staged(picks.layer, more)) be.moe_pairs(xt, picks.ids, more, layout, act, rt);
      be.moe_combine(rt, weights, yt);
    }
  } catch (...) {
    experts.release(picks.layer);
    throw;
  }
  experts.release(picks.layer);
}

}  // namespace

void finish_routed_experts(backend::Backend &be, ExpertProvider &experts, const RoutedPicks &picks,
                           const backend::Tensor &weights, const float *x, float *y, int64_t d,
                           const backend::Activation &act) {
  using backend::GgmlType;
  using backend::Tensor;
  const backend::Device dv = be.device();
  const int64_t k = picks.ids.ne[0], n = picks.ids.n_rows();
  if (picks.host_ids) be.wait_downloads();
  const int64_t max_unique = std::max<int64_t>(experts.max_unique(), k);
  if (picks.host_ids && n > 1 && static_cast<int64_t>(distinct_experts(picks.host_ids, 0, n * k).size()) > max_unique) {
    run_expert_major(be, experts, picks, weights, x, y, d, act, max_unique);
    return;
  }
  if (picks.host_ids && experts.stages_reads()) {
    run_staged(be, experts, picks, weights, x, y, d, act);
    return;
  }
  const backend::ExpertBatch batch = experts.acquire(picks.layer, picks.ids, picks.host_ids, {});
  try {
    if (picks.host_hint) experts.hint(picks.hint_layer, std::span<const int32_t>(picks.host_hint, static_cast<size_t>(picks.n_hint)));
    be.moe(Tensor::make(x, GgmlType::f32, dv, {d, n}), picks.ids, weights, batch, experts.layout(picks.layer), act,
           Tensor::make(y, GgmlType::f32, dv, {d, n}));
  } catch (...) {
    experts.release(picks.layer);
    throw;
  }
  experts.release(picks.layer);
}

}  // namespace ep::model

