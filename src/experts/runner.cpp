#include "experts/runner.hpp"

#include "core/error.hpp"
#include "experts/route_override.hpp"
#include "experts/sharded_experts.hpp"

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

/// One device's part of a sharded MoE chunk: its backend, its shard, its picks' tensors and rows.
struct DevicePart {
  int32_t dev = 0;
  backend::Backend *be = nullptr;
  ExpertProvider *shard = nullptr;
  backend::Tensor x, ids, rows;
  const std::vector<int32_t> *need = nullptr;  // the distinct experts it owns, ascending
  bool held = false;                           // an acquisition not released yet
};

/// The MoE over several devices (sharded_experts.hpp), for chunks of tokens: every other device
/// that owns some of the chunk's picks gets the chunk's activations (a copy from the first device)
/// and picks (from the host); each device computes the rows of its picks (moe_pairs) into its rows,
/// the other devices' rows come back into the first device's, and each token sums its rows in pick
/// order there (moe_combine): moe()'s bits. When every device's share fits one acquire and the
/// shards stage their reads, every device's reads are submitted first (acquire_staged_only) and
/// each device computes its resident experts' rows meanwhile, then each expert's as it lands;
/// otherwise each device goes through its experts in groups of at most max_unique().
void run_sharded(backend::Backend &be, ShardedExperts &sharded, const MoeStep &picks, const float *x, float *y, int64_t d,
                 const backend::Activation &act) {
  using backend::GgmlType;
  using backend::Tensor;
  const backend::Device dv = be.device();
  const int64_t k = picks.ids.ne[0], n = picks.ids.n_rows();
  const int32_t n_dev = sharded.n_devices();
  if (!picks.host_ids) fail(Status::internal, "experts: layer {}: the picks of several devices' experts are not on the host", picks.layer);
  const uint64_t col_bytes = static_cast<uint64_t>(d) * sizeof(float);
  const int64_t row_bytes = k * static_cast<int64_t>(col_bytes);
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(n, static_cast<int64_t>(kPairRowsBytes) / row_bytes));
  const backend::SlotLayout &layout = sharded.layout(picks.layer);
  std::vector<std::vector<int32_t>> owned(static_cast<size_t>(n_dev));
  std::vector<int32_t> pair_owner;
  std::vector<DevicePart> parts;
  for (int64_t t0 = 0; t0 < n; t0 += chunk) {
    const int64_t m = std::min(chunk, n - t0), np = m * k;
    const int32_t *host = picks.host_ids + t0 * k;
    for (auto &o : owned) o.clear();
    for (int32_t e : distinct_experts(host, 0, np)) owned[static_cast<size_t>(sharded.owner(picks.layer, e))].push_back(e);
    pair_owner.resize(static_cast<size_t>(np));
    for (int64_t p = 0; p < np; ++p) pair_owner[static_cast<size_t>(p)] = sharded.owner(picks.layer, host[p]);
    auto *rows0 = static_cast<float *>(sharded.exchange_buffer(0, 2, static_cast<uint64_t>(np) * col_bytes));
    // The devices with picks, the others first (their rows come back to the first device).
    parts.clear();
    bool staged = true;
    for (int32_t i = 1; i <= n_dev; ++i) {
      const int32_t dev = i % n_dev;
      if (owned[static_cast<size_t>(dev)].empty()) continue;
      DevicePart part;
      part.dev = dev;
      part.be = &sharded.backend(dev);
      part.shard = &sharded.shard(dev);
      part.need = &owned[static_cast<size_t>(dev)];
      staged = staged && part.shard->stages_reads() && static_cast<int64_t>(part.need->size()) <= part.shard->max_unique();
      parts.push_back(part);
    }
    // Release every acquisition still held on the way out of an error.
    auto release_all = [&] {
      for (DevicePart &part : parts)
        if (part.held) {
          part.held = false;
          part.be->make_current();
          part.shard->release(picks.layer);
        }
      be.make_current();
    };
    try {
      for (DevicePart &part : parts) {
        backend::Backend &bd = *part.be;
        bd.make_current();
        if (part.dev == 0) {
          part.x = Tensor::make(x + t0 * d, GgmlType::f32, dv, {d, m});
          part.ids = Tensor::make(picks.ids.as<int32_t>() + t0 * k, GgmlType::i32, dv, {k, m});
          part.rows = Tensor::make(rows0, GgmlType::f32, dv, {d, np});
        } else {
          const backend::Device dd = bd.device();
          auto *xd = static_cast<float *>(sharded.exchange_buffer(part.dev, 0, static_cast<uint64_t>(m) * col_bytes));
          auto *idd = static_cast<int32_t *>(sharded.exchange_buffer(part.dev, 1, static_cast<uint64_t>(np) * sizeof(int32_t)));
          auto *rowsd = static_cast<float *>(sharded.exchange_buffer(part.dev, 2, static_cast<uint64_t>(np) * col_bytes));
          // The activations are the first device's work; the picks come from their host copy.
          bd.wait_for(be);
          bd.copy_from(be, xd, x + t0 * d, static_cast<uint64_t>(m) * col_bytes);
          bd.upload(idd, host, static_cast<uint64_t>(np) * sizeof(int32_t));
          part.x = Tensor::make(xd, GgmlType::f32, dd, {d, m});
          part.ids = Tensor::make(idd, GgmlType::i32, dd, {k, m});
          part.rows = Tensor::make(rowsd, GgmlType::f32, dd, {d, np});
        }
        if (!staged) {
          // In groups of the device's max_unique experts, each acquire complete.
          const auto max_unique = static_cast<size_t>(std::max<int64_t>(part.shard->max_unique(), 1));
          for (size_t e0 = 0; e0 < part.need->size(); e0 += max_unique) {
            const std::span<const int32_t> group(part.need->data() + e0, std::min(part.need->size(), e0 + max_unique) - e0);
            const backend::ExpertBatch batch = part.shard->acquire(picks.layer, part.ids, host, group);
            part.held = true;
            bd.moe_pairs(part.x, part.ids, batch, layout, act, part.rows);
            part.held = false;
            part.shard->release(picks.layer);
          }
          continue;
        }
        // Staged: this device's reads are submitted; the rows of its resident experts meanwhile.
        const backend::ExpertBatch first = part.shard->acquire_staged_only(picks.layer, part.ids, host, *part.need);
        part.held = true;
        bool any = false;
        for (int64_t p = 0; p < np && !any; ++p) any = first.pair_slots && first.pair_slots[p];
        if (any) bd.moe_pairs(part.x, part.ids, first, layout, act, part.rows);
      }
      // Staged: each device's other experts as their reads land.
      for (DevicePart &part : parts) {
        if (!part.held) continue;
        part.be->make_current();
        backend::ExpertBatch more;
        while (part.shard->next_staged(picks.layer, more)) part.be->moe_pairs(part.x, part.ids, more, layout, act, part.rows);
        part.held = false;
        part.shard->release(picks.layer);
      }
    } catch (...) {
      release_all();
      throw;
    }
    // The other devices' rows into the first device's, one copy per run of consecutive pairs.
    be.make_current();
    for (const DevicePart &part : parts) {
      if (part.dev == 0) continue;
      be.wait_for(*part.be);
      const float *rowsd = part.rows.as<float>();
      for (int64_t p = 0; p < np;) {
        if (pair_owner[static_cast<size_t>(p)] != part.dev) {
          ++p;
          continue;
        }
        int64_t q = p + 1;
        while (q < np && pair_owner[static_cast<size_t>(q)] == part.dev) ++q;
        be.copy_from(*part.be, rows0 + p * d, rowsd + p * d, static_cast<uint64_t>(q - p) * col_bytes);
        p = q;
      }
    }
    be.moe_combine(Tensor::make(rows0, GgmlType::f32, dv, {d, np}),
                   Tensor::make(picks.weights.as<float>() + t0 * k, GgmlType::f32, dv, {k, m}),
                   Tensor::make(y + t0 * d, GgmlType::f32, dv, {d, m}));
  }
  if (picks.host_hint) sharded.hint(picks.hint_layer, std::span<const int32_t>(picks.host_hint, static_cast<size_t>(picks.n_hint)));
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
  // Experts on several devices: the exchange (one device is the same provider, run below as is).
  if (ShardedExperts *sharded = experts.sharded(); sharded && sharded->n_devices() > 1) {
    run_sharded(be, *sharded, picks, x, y, d, act);
    return;
  }
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

