#include "experts/runner.hpp"

#include "core/error.hpp"
#include "experts/route_override.hpp"

#include <algorithm>
#include <span>
#include <vector>

namespace ep::experts {

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
void run_expert_major(backend::Backend &be, ExpertProvider &experts, const MoeStep &picks,
                      const float *x, float *y, int64_t d, const backend::Activation &act, int64_t max_unique) {
  using backend::GgmlType;
  using backend::Tensor;
  const backend::Device dv = be.device();
  const int64_t k = picks.ids.ne[0], n = picks.ids.n_rows();
  const int64_t row_bytes = k * d * static_cast<int64_t>(sizeof(float));
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(n, static_cast<int64_t>(kPairRowsBytes) / row_bytes));
  backend::DeviceBuffer rows(be, static_cast<uint64_t>(chunk * row_bytes));
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
    be.moe_combine(pc, Tensor::make(picks.weights.as<float>() + t0 * k, GgmlType::f32, dv, {k, m}),
                   Tensor::make(y + t0 * d, GgmlType::f32, dv, {d, m}));
  }
}

}  // namespace

MoeStep start_moe(backend::Backend &be, ExpertProvider &experts, const MoeLayer &layer) {
  if (!layer.route) fail(Status::internal, "experts: MoE layer {} has no router", layer.layer);
  const Routed own = layer.route(false);
  // A benchmark's replayed picks take the router's place before anything reads them.
  if (RouteOverride *route = experts.route_override()) apply_route_override(be, *route, layer.layer, own.ids);
  // Prefetch: the next MoE block's router on this layer's input predicts its picks.
  Routed next;
  const bool hinted = layer.next_layer >= 0 && experts.wants_hints();
  if (hinted) next = layer.route(true);
  MoeStep p;
  p.layer = layer.layer;
  p.ids = own.ids;
  p.weights = own.weights;
  const backend::Tensor &ids = own.ids;
  if (experts.needs_host_ids() || be.moe_reads_host_picks(ids.n_rows(), experts.layout(layer.layer))) {
    auto *host = static_cast<int32_t *>(be.host_buffer(0, ids.n_bytes()));
    be.download_async(host, ids.data, ids.n_bytes());
    p.host_ids = host;
  }
  if (hinted) {
    const backend::Tensor &hint_ids = next.ids;
    auto *host = static_cast<int32_t *>(be.host_buffer(1, hint_ids.n_bytes()));
    be.download_async(host, hint_ids.data, hint_ids.n_bytes());
    p.hint_layer = layer.next_layer;
    p.n_hint = hint_ids.n_elems();
    p.host_hint = host;
  }
  return p;
}

namespace {

/// The staged MoE: the rows of the pairs whose experts are resident first, then of each group of
/// experts as its reads land, then the pick-order sums (moe()'s bits: moe_pairs over disjoint
/// batches covering every pair, then moe_combine).
void run_staged(backend::Backend &be, ExpertProvider &experts, const MoeStep &picks,
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
      be.moe(xt, picks.ids, picks.weights, first, layout, act, yt);
    } else {
      float *rows = experts.staged_rows(be, static_cast<uint64_t>(k * n * d) * sizeof(float));
      const Tensor rt = Tensor::make(rows, GgmlType::f32, dv, {d, k * n});
      if (any) be.moe_pairs(xt, picks.ids, first, layout, act, rt);
      backend::ExpertBatch more;
      while (experts.next_staged(picks.layer, more)) be.moe_pairs(xt, picks.ids, more, layout, act, rt);
      be.moe_combine(rt, picks.weights, yt);
    }
  } catch (...) {
    experts.release(picks.layer);
    throw;
  }
  experts.release(picks.layer);
}

}  // namespace

void finish_moe(backend::Backend &be, ExpertProvider &experts, const MoeStep &picks, const float *x, float *y, int64_t d,
                const backend::Activation &act) {
  const backend::Tensor &weights = picks.weights;
  using backend::GgmlType;
  using backend::Tensor;
  const backend::Device dv = be.device();
  const int64_t k = picks.ids.ne[0], n = picks.ids.n_rows();
  if (picks.host_ids) be.wait_downloads();
  const int64_t max_unique = std::max<int64_t>(experts.max_unique(), k);
  if (picks.host_ids && n > 1 && static_cast<int64_t>(distinct_experts(picks.host_ids, 0, n * k).size()) > max_unique) {
    run_expert_major(be, experts, picks, x, y, d, act, max_unique);
    return;
  }
  if (picks.host_ids && experts.stages_reads()) {
    run_staged(be, experts, picks, x, y, d, act);
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

}  // namespace ep::experts

