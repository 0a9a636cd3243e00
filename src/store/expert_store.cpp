#include "store/expert_store.hpp"

#include "cache/budget.hpp"
#include "cache/slot_cache.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "io/read_tracker.hpp"

#include <algorithm>

namespace ep::store {

struct ExpertStore::Miss {
  uint32_t expert = 0;
  cache::Key key = 0;
  uint32_t slot = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

ExpertStore::ExpertStore(StoreOptions options, std::unique_ptr<StoreDevice> device)
    : options_(std::move(options)), device_(std::move(device)) {
  if (!device_) fail(Status::invalid_argument, "ExpertStore: no device");
  if (!options_.objects) fail(Status::invalid_argument, "ExpertStore: no object map for {}", options_.pack_path);
  const ObjectMap &layout = *options_.objects;
  const uint32_t align = std::max<uint32_t>(layout.alignment(), io::kDirectAlignment);
  // Check the pack holds every object before anything reads it.
  const uint64_t file_bytes = io::file_size_bytes(options_.pack_path);
  for (uint32_t l = 0; l < layout.num_layers(); ++l) {
    for (uint32_t e = 0; e < layout.num_experts(); ++e) {
      const uint64_t off = layout.object_offset(l, e), bytes = layout.object_bytes(l, e);
      if (off % align != 0 || off + bytes > file_bytes)
        fail(Status::format,
             "{}: layer {} expert {}: object at offset {} ({} bytes) must be {}-aligned and inside the {}-byte file",
             options_.pack_path, l, e, off, bytes, align, file_bytes);
    }
  }
  slot_bytes_ = io::align_up(layout.max_object_bytes(), io::kDirectAlignment);
  staging_slot_bytes_ = slot_bytes_;
  max_ids_ = options_.top_k * options_.tokens_per_acquire;
  table_ids_ = options_.table_ids ? options_.table_ids : max_ids_;
  cache::BudgetRequest br;
  br.requested_bytes = options_.cache_bytes;
  br.free_bytes = device_->free_bytes();
  br.reserve_bytes = options_.reserve_bytes;
  br.object_bytes = slot_bytes_;
  br.top_k = options_.top_k;
  br.tokens_per_acquire = options_.tokens_per_acquire;
  br.num_experts = layout.num_experts();
  br.total_objects = static_cast<uint64_t>(layout.num_layers()) * layout.num_experts();
  const cache::Budget budget = cache::compute_budget(br);
  options_.staging_slots = std::max<uint32_t>(1, options_.staging_slots);
  if (!(options_.decay.half_life_ticks > 0)) options_.decay.half_life_ticks = 32.0 * layout.num_layers();
  options_.table_ring = std::max<uint32_t>(1, options_.table_ring);

  DeviceShape shape;
  shape.num_slots = budget.slots;
  shape.slot_bytes = slot_bytes_;
  shape.staging_slots = options_.staging_slots;
  shape.staging_slot_bytes = staging_slot_bytes_;
  shape.tables = options_.table_ring;
  shape.table_entries = table_ids_ * std::max<uint32_t>(options_.table_rows, 1);
  device_->allocate(shape);

  reader_ = io::open_reader(options_.pack_path, options_.reader, counters_);
  reader_->register_buffer(device_->staging_base(), static_cast<std::size_t>(shape.staging_slots) * staging_slot_bytes_);
  cache_ = std::make_unique<cache::SlotCache>(budget.slots, cache::make_policy(options_.policy, options_.decay));
  pins_.assign(budget.slots, 0);
  generation_.assign(budget.slots, 0);
  slot_payload_bytes_.assign(budget.slots, 0);
  table_held_.assign(options_.table_ring, 0);
  totals_.cache_slots = budget.slots;
  totals_.slot_bytes = slot_bytes_;
  trace_.name = "ep_store";
  trace_.num_layers = layout.num_layers();
  trace_.num_experts = layout.num_experts();
  trace_.top_k = options_.top_k;
  trace_.tokens_per_acquire = options_.tokens_per_acquire;
  for (uint32_t l = 0; l < layout.num_layers(); ++l) trace_.object_bytes.push_back(layout.object_bytes(l, 0));
  log::info("ExpertStore: {} on {}: {} slots of {} B ({} policy), {} staging slots, reader {}{}",
            options_.pack_path, device_->name(), budget.slots, slot_bytes_, cache_->policy().name(),
            options_.staging_slots, reader_->backend_name(), reader_->direct() ? " O_DIRECT" : " buffered");
}

ExpertStore::~ExpertStore() {
  try {
    reader_.reset();  // drains reads still writing into staging
    if (device_) device_->synchronize();
    if (!options_.stats_path.empty()) flush_stats();
  } catch (const std::exception &e) {
    log::warn("ExpertStore: while closing: {}", e.what());
  }
}

uint32_t ExpertStore::num_slots() const { return cache_->num_slots(); }

Acquisition ExpertStore::acquire(uint32_t layer, std::span<const uint32_t> ids, std::span<const uint64_t> table_offsets) {
  static constexpr uint64_t kSlotsOnly[1] = {0};
  if (table_offsets.empty()) table_offsets = kSlotsOnly;
  if (table_offsets.size() > std::max<uint32_t>(options_.table_rows, 1))
    fail(Status::invalid_argument, "ExpertStore::acquire: {} table rows asked for, the store has {} (StoreOptions::table_rows)",
         table_offsets.size(), options_.table_rows);
  const ObjectMap &layout = *options_.objects;
  if (layer >= layout.num_layers())
    fail(Status::invalid_argument, "ExpertStore::acquire: layer {} out of range (the pack has {} layers)", layer,
         layout.num_layers());
  if (ids.empty()) fail(Status::invalid_argument, "ExpertStore::acquire: no ids for layer {}", layer);
  for (uint32_t id : ids)
    if (id >= layout.num_experts())
      fail(Status::invalid_argument, "ExpertStore::acquire: layer {} expert id {} out of range (the pack has {} experts)",
           layer, id, layout.num_experts());

  std::vector<uint32_t> unique(ids.begin(), ids.end());
  std::sort(unique.begin(), unique.end());
  unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
  if (unique.size() > max_ids_)
    fail(Status::invalid_argument,
         "ExpertStore::acquire: {} distinct experts for layer {}; at most {} (top_k {} x tokens_per_acquire {})", unique.size(),
         layer, max_ids_, options_.top_k, options_.tokens_per_acquire);

  std::lock_guard lock(mutex_);
  const uint64_t tick = ++tick_;
  std::vector<uint32_t> slot_of(unique.size());
  std::vector<uint32_t> pinned;
  std::vector<Miss> misses;
  uint32_t hits = 0;
  for (std::size_t i = 0; i < unique.size(); ++i) {
    const cache::Key key = cache::make_key(layer, unique[i]);
    if (auto s = cache_->find(key)) {
      ++hits;
      cache_->touch(key, tick);
      ++pins_[*s];
      pinned.push_back(*s);
      slot_of[i] = *s;
    } else {
      Miss m;
      m.expert = unique[i];
      m.key = key;
      m.offset = layout.object_offset(layer, m.expert);
      m.bytes = layout.object_bytes(layer, m.expert);
      misses.push_back(m);
    }
  }
  auto unpin_all = [&] {
    for (uint32_t s : pinned) --pins_[s];
  };
  std::size_t placed = 0;
  for (Miss &m : misses) {
    auto p = cache_->place(m.key, tick, [&](uint32_t s) { return pins_[s] == 0 && device_->last_use_done(s); });
    // Every unpinned slot may still be read by kernels queued before (nothing synchronises the
    // compute stream): a device that orders the copy after the slot's last_use event takes the
    // policy's victim among them instead of failing.
    if (!p && device_->orders_copies_after_last_use())
      p = cache_->place(m.key, tick, [&](uint32_t s) { return pins_[s] == 0; });
    if (!p) {
      unpin_all();
      for (std::size_t j = 0; j < placed; ++j) cache_->remove(misses[j].key);
      fail(Status::budget,
           "ExpertStore::acquire: layer {}: no slot to evict for expert {}: all {} slots are needed by this acquire, "
           "pinned by unreleased acquires or still read by kernels (release acquisitions, or raise the budget)",
           layer, m.expert, cache_->num_slots());
    }
    if (p->evicted) {
      ++totals_.cache_evictions;
      totals_.resident_bytes -= slot_payload_bytes_[p->slot];
      slot_payload_bytes_[p->slot] = 0;
    }
    ++generation_[p->slot];
    ++pins_[p->slot];
    pinned.push_back(p->slot);
    m.slot = p->slot;
    ++placed;
  }
  try {
    load_misses(misses);
  } catch (...) {
    unpin_all();
    throw;
  }
  for (const Miss &m : misses) {
    const auto i = static_cast<std::size_t>(std::lower_bound(unique.begin(), unique.end(), m.expert) - unique.begin());
    slot_of[i] = m.slot;
  }
  totals_.cache_hits += hits;
  totals_.cache_misses += misses.size();
  ++totals_.acquires;

  for (std::size_t i = 0; i < unique.size(); ++i) device_->compute_wait_ready(slot_of[i]);

  Acquisition a;
  a.ticket = next_ticket_++;
  a.layer = layer;
  a.ids.assign(ids.begin(), ids.end());
  a.hits = hits;
  a.misses = static_cast<uint32_t>(misses.size());
  a.pointers.reserve(ids.size());
  a.refs.reserve(ids.size());
  for (uint32_t id : ids) {
    const auto i = static_cast<std::size_t>(std::lower_bound(unique.begin(), unique.end(), id) - unique.begin());
    a.pointers.push_back(device_->slot_ptr(slot_of[i]));
    a.refs.push_back(SlotRef{slot_of[i], generation_[slot_of[i]]});
  }
  // The device table, when it fits: one row of addresses per table offset (e.g. the gate, up
  // and down weights inside each slot).
  uint32_t table = kNoTable;
  if (ids.size() <= table_ids_) {
    for (uint32_t k = 0; k < options_.table_ring; ++k) {
      const uint32_t t = (next_table_ + k) % options_.table_ring;
      if (!table_held_[t]) {
        table = t;
        break;
      }
    }
    if (table == kNoTable) {
      unpin_all();
      fail(Status::busy, "ExpertStore::acquire: {} acquisitions are unreleased (table_ring {}): release some first",
           options_.table_ring, options_.table_ring);
    }
    next_table_ = (table + 1) % options_.table_ring;
    device_->wait_table(table);
    std::vector<const void *> rows;
    rows.reserve(a.pointers.size() * table_offsets.size());
    for (uint64_t off : table_offsets)
      for (const void *p : a.pointers) rows.push_back(static_cast<const std::byte *>(p) + off);
    a.device_table = device_->publish_table(table, rows.data(), static_cast<uint32_t>(rows.size()));
    table_held_[table] = 1;
  }
  Held held;
  held.table = table;
  for (uint32_t s : slot_of) held.slots.push_back(SlotRef{s, generation_[s]});
  held_.emplace_back(a.ticket, std::move(held));

  if (options_.record_trace) trace_.accesses.push_back(cache::TraceAccess{layer, a.ids, false});
  if (options_.stats_every && !options_.stats_path.empty() && totals_.acquires % options_.stats_every == 0)
    write_stats_file(stats_locked(), options_.stats_path);
  return a;
}

void ExpertStore::load_misses(std::vector<Miss> &misses) {
  if (misses.empty()) return;
  const uint32_t staging = options_.staging_slots;
  std::vector<uint32_t> free_staging;
  for (uint32_t s = staging; s-- > 0;) free_staging.push_back(s);
  std::size_t next = 0, in_flight = 0;
  std::string first_error;
  Status first_status = Status::io;
  std::vector<std::size_t> failed;
  std::byte *base = device_->staging_base();
  auto submit = [&](uint32_t st) {
    const Miss &m = misses[next];
    device_->wait_staging(st);  // its previous H2D copy must be done
    io::ReadRequest r;
    r.offset = m.offset;
    r.bytes = m.bytes;
    r.dst = base + static_cast<uint64_t>(st) * staging_slot_bytes_;
    r.tag = (static_cast<uint64_t>(st) << 32) | next;
    reader_->submit(r);
    ++next;
    ++in_flight;
  };
  const uint64_t t0 = io::detail::now_ns();
  while (next < misses.size() && !free_staging.empty()) {
    submit(free_staging.back());
    free_staging.pop_back();
  }
  std::vector<io::ReadCompletion> done;
  while (in_flight > 0) {
    done.clear();
    reader_->wait(done, 1);
    for (const auto &c : done) {
      --in_flight;
      const auto idx = static_cast<std::size_t>(c.tag & 0xffffffffu);
      const auto st = static_cast<uint32_t>(c.tag >> 32);
      const Miss &m = misses[idx];
      std::string bad;
      if (c.ok && options_.verify_payloads)
        bad = options_.objects->check_object(cache::key_layer(m.key), m.expert,
                                            base + static_cast<uint64_t>(st) * staging_slot_bytes_);
      if (c.ok && !bad.empty()) {
        if (first_error.empty()) {
          first_error = fmt::format("ExpertStore: layer {} expert {} read from {} (object at offset {}, {} bytes) is corrupt: {}",
                                    cache::key_layer(m.key), m.expert, options_.pack_path, m.offset, m.bytes, bad);
          first_status = Status::corrupt;
        }
        failed.push_back(idx);
      } else if (c.ok) {
        // Per-expert completion: this expert's copy starts now, while other reads continue.
        device_->copy_to_slot(m.slot, st, m.bytes);
        totals_.h2d_bytes += m.bytes;
        totals_.resident_bytes += m.bytes;
        slot_payload_bytes_[m.slot] = m.bytes;
      } else {
        if (first_error.empty())
          first_error = fmt::format("ExpertStore: cannot load layer {} expert {} (pack {}, object at offset {}, {} bytes): {}",
                                    cache::key_layer(m.key), m.expert, options_.pack_path, m.offset, m.bytes, c.message);
        failed.push_back(idx);
      }
      if (first_error.empty() && next < misses.size()) submit(st);
    }
  }
  totals_.pack_read_ns += io::detail::now_ns() - t0;
  if (!first_error.empty()) {
    for (std::size_t idx : failed) cache_->remove(misses[idx].key);
    for (std::size_t idx = next; idx < misses.size(); ++idx) cache_->remove(misses[idx].key);
    throw Error(first_status, first_error);
  }
}

void ExpertStore::release(const Acquisition &a) {
  std::lock_guard lock(mutex_);
  auto it = std::find_if(held_.begin(), held_.end(), [&](const auto &h) { return h.first == a.ticket; });
  if (it == held_.end())
    fail(Status::invalid_argument, "ExpertStore::release: acquisition {} (layer {}) is not held: released twice?",
         a.ticket, a.layer);
  for (const SlotRef &ref : it->second.slots) {
    if (generation_[ref.slot] != ref.generation)
      fail(Status::internal, "ExpertStore::release: slot {} changed generation {} -> {} while pinned", ref.slot,
           ref.generation, generation_[ref.slot]);
    device_->record_last_use(ref.slot);
    --pins_[ref.slot];
  }
  if (it->second.table != kNoTable) {
    device_->record_table_done(it->second.table);
    table_held_[it->second.table] = 0;
  }
  held_.erase(it);
}

bool ExpertStore::is_current(SlotRef ref) const {
  std::lock_guard lock(mutex_);
  return ref.slot < generation_.size() && generation_[ref.slot] == ref.generation &&
         cache_->key_of(ref.slot).has_value();
}

StoreStats ExpertStore::stats_locked() const {
  StoreStats s = totals_;
  s.pack_reads = counters_.reads.load();
  s.pack_read_bytes = counters_.read_bytes.load();
  s.io_errors = counters_.io_errors.load();
  s.fallback_count = counters_.fallback_count.load();
  s.resident_experts = cache_->resident();
  return s;
}

StoreStats ExpertStore::stats() const {
  std::lock_guard lock(mutex_);
  return stats_locked();
}

void ExpertStore::flush_stats() const {
  if (options_.stats_path.empty()) return;
  write_stats_file(stats(), options_.stats_path);
}

cache::Trace ExpertStore::recorded_trace() const {
  std::lock_guard lock(mutex_);
  return trace_;
}

std::vector<ExpertStore::Resident> ExpertStore::resident() const {
  std::lock_guard lock(mutex_);
  std::vector<Resident> out;
  for (uint32_t s = 0; s < cache_->num_slots(); ++s)
    if (auto k = cache_->key_of(s)) out.push_back(Resident{cache::key_layer(*k), cache::key_expert(*k), s});
  return out;
}

void ExpertStore::read_slot(uint32_t slot, void *dst, uint64_t bytes) {
  std::lock_guard lock(mutex_);
  device_->read_slot(slot, dst, bytes);
}

}  // namespace ep::store
