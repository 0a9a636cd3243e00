#include "experts/packed_experts.hpp"

#include "core/error.hpp"
#include "core/log.hpp"
#include "format/ggml_type.hpp"
#include "format/pack_file.hpp"
#include "io/file.hpp"
#include "store/device.hpp"
#include "store/expert_store.hpp"
#include "store/pack_object_map.hpp"


#include <algorithm>
#include <limits>
#include <numeric>
#include <span>

namespace ep::experts {

struct PackedExperts::Held {
  bool active = false;
  int64_t layer = -1;
  store::Acquisition acq;
  std::vector<uint32_t> ids;              // what the store was asked for
  std::vector<const void *> pair_slots;   // per pair (expert-major passes, staged batches: null for others)
  const int32_t *host_ids = nullptr;      // the picks of a staged acquire
  int64_t n_pairs = 0;
  // An acquire of some experts (`only`): per pair, its expert's position in ids, or -1.
  bool some = false;
  std::vector<int32_t> pair_index;
};

namespace {

/// The store's table of the acquisition's latest wave (its pairs, ascending), when it has one.
void set_wave(const store::Acquisition &acq, backend::ExpertBatch &batch) {
  batch.wave_table = acq.wave_table;
  batch.wave_lists = acq.wave_lists;
  batch.n_wave = acq.n_wave;
}

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
  const uint32_t K = static_cast<uint32_t>(top_k);
  store::StoreOptions so;
  std::unique_ptr<store::StoreDevice> device =
      store::configure_store(options.store, options.cuda_device, options.cuda_stream, options.cuda_reserve_bytes, so);
  so.pack_path = pack_path;
  so.data_paths = pf.data_files();
  so.objects = pack_;
  so.top_k = K;
  // As many tokens per acquire as the slots hold top_k experts for (the store's one budget,
  // cache::compute_budget): the step's distinct experts beyond that go expert-major.
  so.tokens_per_acquire = 0;
  so.stats_path = options.stats_path;
  overlap_reads_ = options.store.overlap_reads;
  prefetch_ = options.store.prefetch;
  // The device table: per pair, the gate, up and down addresses inside its slot (the rows the
  // decode MoE kernels read), for steps of up to table_tokens tokens.
  so.table_rows = 3;
  so.table_ids = static_cast<uint32_t>(std::max<int64_t>(options.table_tokens, 1) * top_k);
  so.reader.seam = options.seam;
  store_ = std::make_unique<store::ExpertStore>(std::move(so), std::move(device));
  max_unique_ = store_->max_unique();
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

backend::ExpertBatch PackedExperts::every_batch(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids,
                                                std::span<const int32_t> only) {
  if (layer < 0 || layer >= static_cast<int64_t>(every_.size())) fail(Status::invalid_argument, "experts: no layer {}", layer);
  return fixed_experts_batch(*every_be_, layer, every_[static_cast<size_t>(layer)], layouts_[static_cast<size_t>(layer)], ids,
                             host_ids, only, every_pairs_, every_table_);
}

int64_t PackedExperts::max_unique() const {
  return every_.empty() ? max_unique_ : std::numeric_limits<int64_t>::max();
}

bool PackedExperts::load_every_expert(backend::Backend &be) {
  if (!every_.empty()) return true;
  if (held_->active) fail(Status::internal, "experts: load_every_expert while layer {} is held", held_->layer);
  const uint32_t n_layers = static_cast<uint32_t>(layouts_.size()), n_exp = pack_->num_experts();
  const uint64_t total = static_cast<uint64_t>(n_layers) * n_exp;
  if (store_->num_slots() < total) return false;
  log::info("experts: the cache's {} slots hold every expert ({} layers x {}): reading all {} now ({:.2f} GiB)",
            store_->num_slots(), n_layers, n_exp, total,
            static_cast<double>(total * store_->slot_bytes()) / static_cast<double>(uint64_t{1} << 30));
  const uint32_t chunk = std::max<uint32_t>(1, store_->max_unique());
  std::vector<std::vector<const void *>> slots(n_layers, std::vector<const void *>(n_exp, nullptr));
  // Two passes: the first reads, the second (every id a hit) checks that nothing read in the
  // first was evicted, i.e. that every address stays valid.
  for (int pass = 0; pass < 2; ++pass) {
    for (uint32_t l = 0; l < n_layers; ++l) {
      for (uint32_t e0 = 0; e0 < n_exp; e0 += chunk) {
        std::vector<uint32_t> ids(std::min(chunk, n_exp - e0));
        std::iota(ids.begin(), ids.end(), e0);
        const store::Acquisition acq = store_->acquire(l, ids);
        const bool moved = pass == 1 && (acq.misses != 0 || !std::equal(ids.begin(), ids.end(), acq.pointers.begin(),
                                                                         [&](uint32_t e, const void *p) { return slots[l][e] == p; }));
        for (size_t i = 0; i < ids.size(); ++i) slots[l][ids[i]] = acq.pointers[i];
        store_->release(acq);
        if (moved)
          fail(Status::internal, "experts: layer {}: experts {}..{} left their slots while every expert was read", l, e0,
               e0 + ids.size() - 1);
      }
      if (pass == 0) log::debug("experts: layer {} of {} read", l + 1, n_layers);
    }
  }
  std::vector<FixedExperts> every(n_layers);
  for (uint32_t l = 0; l < n_layers; ++l) every[l].set(be, std::move(slots[l]));
  every_ = std::move(every);
  every_be_ = &be;
  return true;
}

backend::ExpertBatch PackedExperts::acquire(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids,
                                            std::span<const int32_t> only) {
  if (!every_.empty()) return every_batch(layer, ids, host_ids, only);
  return begin(layer, ids, host_ids, only, false);
}

backend::ExpertBatch PackedExperts::acquire_staged(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids) {
  if (!every_.empty()) return every_batch(layer, ids, host_ids, {});
  return begin(layer, ids, host_ids, {}, overlap_reads_);
}

backend::ExpertBatch PackedExperts::acquire_staged_only(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids,
                                                        std::span<const int32_t> only) {
  if (!every_.empty()) return every_batch(layer, ids, host_ids, only);
  return begin(layer, ids, host_ids, only, overlap_reads_);
}

bool PackedExperts::next_staged(int64_t layer, backend::ExpertBatch &batch) {
  if (!every_.empty()) return false;
  Held &h = *held_;
  if (!h.active || h.layer != layer) fail(Status::internal, "experts: next_staged of layer {} without its acquire", layer);
  if (h.acq.pending == 0) return false;
  const std::vector<uint32_t> landed = store_->wait_ready(h.acq);
  if (landed.empty()) return false;
  // A staged acquire of every pick asked for the picks as they are (store id p is pair p); one of
  // some experts, for each listed expert once (pair_index).
  for (int64_t p = 0; p < h.n_pairs; ++p) {
    const auto i = static_cast<size_t>(p);
    const int32_t at = h.some ? h.pair_index[i] : static_cast<int32_t>(p);
    const bool now = at >= 0 && std::binary_search(landed.begin(), landed.end(), h.ids[static_cast<size_t>(at)]);
    h.pair_slots[i] = now ? h.acq.pointers[static_cast<size_t>(at)] : nullptr;
  }
  batch = backend::ExpertBatch{};
  batch.n_pairs = h.n_pairs;
  batch.pair_experts = h.host_ids;
  batch.pair_slots = h.pair_slots.data();
  // The store's wave lists name positions in ids: pairs only when ids are the picks.
  if (!h.some) set_wave(h.acq, batch);
  return true;
}

void PackedExperts::hint(int64_t layer, std::span<const int32_t> ids) {
  if (!prefetch_ || layer < 0 || layer >= static_cast<int64_t>(layouts_.size())) return;
  std::vector<uint32_t> u;
  for (int32_t e : ids)
    if (e >= 0) u.push_back(static_cast<uint32_t>(e));
  store_->hint(static_cast<uint32_t>(layer), u);
}

backend::ExpertBatch PackedExperts::begin(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids,
                                          std::span<const int32_t> only, bool staged) {
  if (layer < 0 || layer >= static_cast<int64_t>(layouts_.size())) fail(Status::invalid_argument, "experts: no layer {}", layer);
  if (held_->active)
    fail(Status::internal, "experts: acquire of layer {} while layer {} is still held (release it first)", layer, held_->layer);
  if (!host_ids) fail(Status::internal, "experts: layer {}: the pack's experts need the router's ids on the host", layer);
  const int64_t n = ids.n_elems();
  const uint32_t n_exp = pack_->num_experts();
  for (int64_t p = 0; p < n; ++p)
    if (host_ids[p] < 0 || static_cast<uint32_t>(host_ids[p]) >= n_exp)
      fail(Status::corrupt, "experts: layer {}: expert id {} at pair {} outside 0..{}", layer, host_ids[p], p, n_exp - 1);
  // The store dedups (the one dedup of a step); with `only`, it loads just those experts.
  Held &h = *held_;
  if (only.empty()) {
    h.ids.assign(host_ids, host_ids + n);
  } else {
    h.ids.clear();
    for (int32_t e : only) {
      if (e < 0 || static_cast<uint32_t>(e) >= n_exp)
        fail(Status::invalid_argument, "experts: layer {}: expert {} outside 0..{}", layer, e, n_exp - 1);
      h.ids.push_back(static_cast<uint32_t>(e));
    }
  }
  const backend::SlotLayout &l = layouts_[static_cast<size_t>(layer)];
  const uint64_t roles[3] = {l.gate.offset, l.up.offset, l.down.offset};
  h.acq = store_->acquire(static_cast<uint32_t>(layer), h.ids,
                          only.empty() ? std::span<const uint64_t>(roles) : std::span<const uint64_t>(), staged);
  h.active = true;
  h.layer = layer;
  h.host_ids = host_ids;
  h.n_pairs = n;
  h.some = !only.empty();
  if (h.some) {
    h.pair_index.assign(static_cast<size_t>(n), -1);
    for (int64_t p = 0; p < n; ++p)
      for (size_t i = 0; i < h.ids.size(); ++i)
        if (h.ids[i] == static_cast<uint32_t>(host_ids[p])) h.pair_index[static_cast<size_t>(p)] = static_cast<int32_t>(i);
  }
  backend::ExpertBatch b;
  b.n_pairs = n;
  b.pair_experts = host_ids;
  if (h.acq.pending > 0) {
    // Staged, with reads in flight: the pairs of the ready experts now, the rest from next_staged().
    h.pair_slots.assign(static_cast<size_t>(n), nullptr);
    for (int64_t p = 0; p < n; ++p) {
      const int32_t at = h.some ? h.pair_index[static_cast<size_t>(p)] : static_cast<int32_t>(p);
      if (at >= 0 && h.acq.ready[static_cast<size_t>(at)])
        h.pair_slots[static_cast<size_t>(p)] = h.acq.pointers[static_cast<size_t>(at)];
    }
    b.pair_slots = h.pair_slots.data();
    if (!h.some) set_wave(h.acq, b);
  } else if (only.empty()) {
    b.pair_slots = h.acq.pointers.data();
    b.role_table = h.acq.device_table;
  } else {
    h.pair_slots.assign(static_cast<size_t>(n), nullptr);
    for (int64_t p = 0; p < n; ++p)
      if (const int32_t at = h.pair_index[static_cast<size_t>(p)]; at >= 0)
        h.pair_slots[static_cast<size_t>(p)] = h.acq.pointers[static_cast<size_t>(at)];
    b.pair_slots = h.pair_slots.data();
  }
  return b;
}

void PackedExperts::release(int64_t layer) {
  if (!every_.empty()) return;
  if (!held_->active || held_->layer != layer)
    fail(Status::internal, "experts: release of layer {} without its acquire", layer);
  held_->active = false;
  store_->release(held_->acq);
}

store::StoreStats PackedExperts::stats() const { return store_->stats(); }
uint32_t PackedExperts::num_slots() const { return store_->num_slots(); }
uint64_t PackedExperts::slot_bytes() const { return store_->slot_bytes(); }

}  // namespace ep::experts
