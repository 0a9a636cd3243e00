#include "model/expert_provider.hpp"

#include "core/error.hpp"
#include "format/pack_file.hpp"
#include "io/file.hpp"
#include "model/weight_catalog.hpp"
#include "store/expert_store.hpp"
#include "store/device.hpp"
#include "store/pack_object_map.hpp"

#include <unistd.h>

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
  layers_.push_back(std::move(l));
}

const backend::SlotLayout &ResidentExperts::layout(int64_t layer) const {
  if (layer < 0 || layer >= static_cast<int64_t>(layers_.size())) fail(Status::invalid_argument, "experts: no layer {}", layer);
  return layers_[static_cast<size_t>(layer)].layout;
}

backend::ExpertSlots ResidentExperts::acquire(int64_t layer, const int32_t *, int64_t) {
  if (layer < 0 || layer >= static_cast<int64_t>(layers_.size())) fail(Status::invalid_argument, "experts: no layer {}", layer);
  const Layer &l = layers_[static_cast<size_t>(layer)];
  backend::ExpertSlots s;
  s.slot = l.slots.data();
  s.n_experts = static_cast<int32_t>(l.slots.size());
  return s;
}

}  // namespace ep::model

// ---------------------------------------------------------------------------------------------
// PackedExperts

namespace ep::model {

struct PackedExperts::Held {
  bool active = false;
  int64_t layer = -1;
  store::Acquisition acq;
};

namespace {

uint64_t slot_bytes_of(const store::PackObjectMap &pack) {
  return io::align_up(pack.max_object_bytes(), io::kDirectAlignment);
}

}  // namespace

uint64_t PackedExperts::min_cache_bytes(const std::string &pack_path, int64_t top_k) {
  const auto pack = store::PackObjectMap::open(pack_path, false);
  return slot_bytes_of(*pack) * static_cast<uint64_t>(std::min<int64_t>(top_k, pack->num_experts()));
}

PackedExperts::PackedExperts(const std::string &pack_path, const std::vector<ExpertShape> &expected, int64_t top_k,
                             const PackedExpertsOptions &options)
    : held_(std::make_unique<Held>()) {
  pack_ = store::PackObjectMap::open(pack_path, true);
  const format::PackFile &pf = pack_->pack();
  const int64_t n_layers = static_cast<int64_t>(expected.size());
  if (static_cast<int64_t>(pf.first_layer()) != options.first_layer || static_cast<int64_t>(pf.num_layers()) != n_layers)
    fail(Status::format, "{}: the pack holds layers {}..{}, the model has MoE layers {}..{}", pack_path, pf.first_layer(),
         static_cast<int64_t>(pf.first_layer()) + pf.num_layers() - 1, options.first_layer, options.first_layer + n_layers - 1);
  if (top_k <= 0 || top_k > static_cast<int64_t>(pf.num_experts()))
    fail(Status::format, "{}: top_k {} with {} experts per layer", pack_path, top_k, pf.num_experts());
  // The pack's entries → the backend's layout; every expert of a layer must agree (one layout
  // per layer) and match the model's source.
  const format::Role roles[3] = {format::Role::gate, format::Role::up, format::Role::down};
  for (uint32_t l = 0; l < pf.num_layers(); ++l) {
    const ExpertShape &want = expected[l];
    const backend::SlotWeight *want_w[3] = {&want.gate, &want.up, &want.down};
    backend::SlotLayout lay;
    backend::SlotWeight *got_w[3] = {&lay.gate, &lay.up, &lay.down};
    for (uint32_t e = 0; e < pf.num_experts(); ++e) {
      for (int r = 0; r < 3; ++r) {
        const format::RoleEntry &re = pf.entry(l, e, roles[r]);
        backend::SlotWeight w;
        w.offset = re.offset_in_object;
        w.type = re.type;
        w.ne0 = static_cast<int64_t>(re.ne[0]);
        w.ne1 = static_cast<int64_t>(re.ne[1]);
        const bool shape_ok = re.ne[2] == 1 && re.ne[3] == 1 && w.ne0 == want_w[r]->ne0 && w.ne1 == want_w[r]->ne1;
        if (!shape_ok || w.type != want_w[r]->type)
          fail(shape_ok ? Status::format : Status::shape,
               "{}: layer {} expert {} {}: type {} ne [{}, {}, {}, {}] in the pack, the model's source has type {} ne [{}, {}] "
               "(a pack of another model? rebuild it)",
               pack_path, l, e, format::role_name(roles[r]), static_cast<uint32_t>(w.type), re.ne[0], re.ne[1], re.ne[2],
               re.ne[3], static_cast<uint32_t>(want_w[r]->type), want_w[r]->ne0, want_w[r]->ne1);
        const uint64_t row = format::ggml_row_bytes(w.type, static_cast<uint64_t>(w.ne0), pack_path);
        if (re.nbytes != row * static_cast<uint64_t>(w.ne1))
          fail(Status::format, "{}: layer {} expert {} {}: {} bytes, expected {}", pack_path, l, e,
               format::role_name(roles[r]), re.nbytes, row * static_cast<uint64_t>(w.ne1));
        if (e == 0) {
          *got_w[r] = w;
        } else if (w.offset != got_w[r]->offset) {
          fail(Status::unsupported, "{}: layer {}: expert {} puts {} at offset {}, expert 0 at {} (one layout per layer needed)",
               pack_path, l, e, format::role_name(roles[r]), w.offset, got_w[r]->offset);
        }
      }
    }
    layouts_.push_back(lay);
  }
  // How many tokens one acquire may cover: as many as the budget holds top_k experts for, up to
  // every expert of the layer.
  const uint32_t E = pf.num_experts(), K = static_cast<uint32_t>(top_k);
  const uint64_t slot = slot_bytes_of(*pack_);
  const uint64_t total = static_cast<uint64_t>(E) * pf.num_layers();
  // "All of it" on the host device means at most half the physical memory (a full-size model's
  // experts do not fit in RAM); on a GPU, its free memory less a reserve for activations. An
  // explicit budget is taken as given.
  std::unique_ptr<store::StoreDevice> device;
  uint64_t reserve = 0;
  if (options.cuda_device >= 0) {
    device = store::make_cuda_device(options.cuda_device, options.cuda_stream);
    reserve = options.cache_bytes == UINT64_MAX ? options.cuda_reserve_bytes : 0;
  } else {
    store::HostDevice::Options host;
    if (options.cache_bytes == UINT64_MAX) {
      const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
      if (pages > 0 && page > 0) host.free_bytes = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 2;
    }
    device = std::make_unique<store::HostDevice>(host);
  }
  const uint64_t free = device->free_bytes();
  const uint64_t budget = std::min(options.cache_bytes, free > reserve ? free - reserve : 0);
  const uint64_t slots = std::min<uint64_t>(budget / slot, total);
  const uint32_t all_tokens = (E + K - 1) / K;
  const uint32_t tokens = static_cast<uint32_t>(std::clamp<uint64_t>(slots / K, 1, all_tokens));
  max_unique_ = std::min<int64_t>(static_cast<int64_t>(K) * tokens, E);

  store::StoreOptions so;
  so.pack_path = pack_path;
  so.objects = pack_;
  so.cache_bytes = options.cache_bytes;
  so.reserve_bytes = reserve;
  so.top_k = K;
  so.tokens_per_acquire = tokens;
  so.policy = options.policy;
  so.stats_path = options.stats_path;
  if (options.staging_slots) so.staging_slots = options.staging_slots;
  if (options.queue_depth) so.reader.queue_depth = options.queue_depth;
  if (options.read_splits) so.reader.read_splits = options.read_splits;
  so.reader.direct = options.direct_io < 0 ? io::DirectMode::automatic
                     : options.direct_io ? io::DirectMode::direct
                                         : io::DirectMode::buffered;
  so.reader.seam = options.seam;
  store_ = std::make_unique<store::ExpertStore>(std::move(so), std::move(device));
  table_.assign(E, nullptr);
}

PackedExperts::~PackedExperts() {
  if (held_ && held_->active) {
    try {
      store_->release(held_->acq);
    } catch (const std::exception &) {
    }
  }
}

const backend::SlotLayout &PackedExperts::layout(int64_t layer) const {
  if (layer < 0 || layer >= static_cast<int64_t>(layouts_.size())) fail(Status::invalid_argument, "experts: no layer {}", layer);
  return layouts_[static_cast<size_t>(layer)];
}

backend::ExpertSlots PackedExperts::acquire(int64_t layer, const int32_t *ids, int64_t n) {
  if (layer < 0 || layer >= static_cast<int64_t>(layouts_.size())) fail(Status::invalid_argument, "experts: no layer {}", layer);
  if (held_->active)
    fail(Status::internal, "experts: acquire of layer {} while layer {} is still held (release it first)", layer, held_->layer);
  std::vector<uint32_t> unique;
  unique.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= static_cast<int32_t>(table_.size()))
      fail(Status::corrupt, "experts: layer {}: expert id {} outside 0..{}", layer, ids[i], table_.size() - 1);
    unique.push_back(static_cast<uint32_t>(ids[i]));
  }
  std::sort(unique.begin(), unique.end());
  unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
  if (static_cast<int64_t>(unique.size()) > max_unique_)
    fail(Status::internal, "experts: layer {}: {} distinct experts in one acquire, at most {}", layer, unique.size(), max_unique_);
  held_->acq = store_->acquire(static_cast<uint32_t>(layer), unique);
  held_->active = true;
  held_->layer = layer;
  std::fill(table_.begin(), table_.end(), nullptr);
  for (size_t i = 0; i < unique.size(); ++i) table_[unique[i]] = held_->acq.pointers[i];
  backend::ExpertSlots s;
  s.slot = table_.data();
  s.n_experts = static_cast<int32_t>(table_.size());
  return s;
}

void PackedExperts::release(int64_t layer) {
  if (!held_->active || held_->layer != layer)
    fail(Status::internal, "experts: release of layer {} without its acquire", layer);
  held_->active = false;
  std::fill(table_.begin(), table_.end(), nullptr);
  store_->release(held_->acq);
}

store::StoreStats PackedExperts::stats() const { return store_->stats(); }
uint32_t PackedExperts::num_slots() const { return store_->num_slots(); }
uint64_t PackedExperts::slot_bytes() const { return store_->slot_bytes(); }

namespace {

/// The distinct valid experts of ids[p0 .. p1), ascending.
std::vector<int32_t> distinct_experts(const std::vector<int32_t> &ids, int64_t n_experts, int64_t p0, int64_t p1) {
  std::vector<uint8_t> seen(static_cast<size_t>(n_experts));
  for (int64_t p = p0; p < p1; ++p) {
    const int32_t e = ids[static_cast<size_t>(p)];
    if (e >= 0 && e < n_experts) seen[static_cast<size_t>(e)] = 1;
  }
  std::vector<int32_t> out;
  for (int64_t e = 0; e < n_experts; ++e)
    if (seen[static_cast<size_t>(e)]) out.push_back(static_cast<int32_t>(e));
  return out;
}

/// Bytes of per-pick rows one expert-major pass holds at most (the tokens go in chunks below it).
constexpr uint64_t kPairRowsBytes = uint64_t{256} << 20;

/// Expert-major: for chunks of tokens, every expert the chunk picks goes through the cache once
/// (max_unique at a time), computing the rows of its picks (Backend::moe_pairs); then each token
/// sums its rows in pick order (moe_combine) — moe()'s arithmetic, so the same bits, with each
/// expert read once per chunk instead of once per small group of tokens.
void run_routed_experts_by_expert(backend::Backend &be, ExpertProvider &experts, int64_t layer, int64_t n_experts,
                                  const std::vector<int32_t> &ids, const int32_t *ids_dev, const float *weights_dev,
                                  int64_t k, const float *x, float *y, int64_t d, int64_t n, const backend::Activation &act,
                                  int64_t max_unique) {
  using backend::GgmlType;
  using backend::Tensor;
  const backend::Device dv = be.device();
  const int64_t row_bytes = k * d * static_cast<int64_t>(sizeof(float));
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(n, static_cast<int64_t>(kPairRowsBytes) / row_bytes));
  DeviceBuffer rows(be, static_cast<uint64_t>(chunk * row_bytes));
  float *pair_rows = static_cast<float *>(rows.get());
  for (int64_t t0 = 0; t0 < n; t0 += chunk) {
    const int64_t m = std::min(chunk, n - t0);
    const Tensor xc = Tensor::make(x + t0 * d, GgmlType::f32, dv, {d, m});
    const Tensor idc = Tensor::make(ids_dev + t0 * k, GgmlType::i32, dv, {k, m});
    const Tensor pc = Tensor::make(pair_rows, GgmlType::f32, dv, {d, k * m});
    const std::vector<int32_t> need = distinct_experts(ids, n_experts, t0 * k, (t0 + m) * k);
    for (size_t e0 = 0; e0 < need.size(); e0 += static_cast<size_t>(max_unique)) {
      const size_t e1 = std::min(need.size(), e0 + static_cast<size_t>(max_unique));
      const std::span<const int32_t> group(need.data() + e0, e1 - e0);
      const backend::ExpertSlots slots = experts.acquire(layer, group.data(), static_cast<int64_t>(group.size()));
      try {
        be.moe_pairs(xc, idc, slots, experts.layout(layer), act, group, pc);
      } catch (...) {
        experts.release(layer);
        throw;
      }
      experts.release(layer);
    }
    be.moe_combine(pc, Tensor::make(weights_dev + t0 * k, GgmlType::f32, dv, {k, m}),
                   Tensor::make(y + t0 * d, GgmlType::f32, dv, {d, m}));
  }
}

}  // namespace

void run_routed_experts(backend::Backend &be, ExpertProvider &experts, int64_t layer, int64_t n_experts,
                        const std::vector<int32_t> &ids, const int32_t *ids_dev, const float *weights_dev, int64_t k,
                        const float *x, float *y, int64_t d, int64_t n, const backend::Activation &act) {
  using backend::GgmlType;
  using backend::Tensor;
  const backend::Device dv = be.device();
  const int64_t max_unique = std::max<int64_t>(experts.max_unique(), k);
  if (be.has_moe_pairs() && n > 1 && distinct_experts(ids, n_experts, 0, n * k).size() > static_cast<size_t>(max_unique)) {
    run_routed_experts_by_expert(be, experts, layer, n_experts, ids, ids_dev, weights_dev, k, x, y, d, n, act, max_unique);
    return;
  }
  std::vector<uint8_t> seen(static_cast<size_t>(n_experts));
  for (int64_t t0 = 0; t0 < n;) {
    std::fill(seen.begin(), seen.end(), 0);
    int64_t t1 = t0, distinct = 0;
    while (t1 < n) {
      // the experts of token t1 not seen yet in this chunk
      int64_t add = 0;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = ids[static_cast<size_t>(t1 * k + j)];
        if (e >= 0 && e < n_experts && !seen[static_cast<size_t>(e)]) {
          bool dup = false;
          for (int64_t i = 0; i < j; ++i) dup = dup || ids[static_cast<size_t>(t1 * k + i)] == e;
          if (!dup) ++add;
        }
      }
      if (t1 > t0 && distinct + add > max_unique) break;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = ids[static_cast<size_t>(t1 * k + j)];
        if (e >= 0 && e < n_experts) seen[static_cast<size_t>(e)] = 1;
      }
      distinct += add;
      ++t1;
    }
    const int64_t m = t1 - t0;
    const backend::ExpertSlots slots = experts.acquire(layer, ids.data() + t0 * k, k * m);
    try {
      be.moe(Tensor::make(x + t0 * d, GgmlType::f32, dv, {d, m}), Tensor::make(ids_dev + t0 * k, GgmlType::i32, dv, {k, m}),
             Tensor::make(weights_dev + t0 * k, GgmlType::f32, dv, {k, m}), slots, experts.layout(layer), act,
             Tensor::make(y + t0 * d, GgmlType::f32, dv, {d, m}));
    } catch (...) {
      experts.release(layer);
      throw;
    }
    experts.release(layer);
    t0 = t1;
  }
}

}  // namespace ep::model
