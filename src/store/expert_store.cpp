#include "store/expert_store.hpp"

#include "cache/budget.hpp"
#include "cache/host_tier.hpp"
#include "cache/slot_cache.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "format/microscale.hpp"
#include "io/read_tracker.hpp"
#include "store/host_memory.hpp"

#include <algorithm>
#include <cstring>

namespace ep::store {

/// One object read in flight (or waiting for a staging slot) into a slot; the slot is pinned
/// by it until the read landed.
struct ExpertStore::Load {
  cache::Key key = 0;
  std::vector<ObjectExtent> extents;  // ObjectMap::object_extents()
  uint64_t bytes = 0;                 // the object's
  uint32_t staging = UINT32_MAX;      // UINT32_MAX: not submitted yet
  uint32_t reads_left = 0;            // extents whose read has not landed
  bool prefetch = false;
  std::string io_error;               // the first failed extent read
};

namespace {

/// The 4096-aligned range @p bytes at @p offset are read as (the start aligned down, the end
/// up): where it begins in the file and how many bytes a staging slot needs for it.
uint64_t read_start(uint64_t offset) { return io::align_down(offset, io::kDirectAlignment); }
uint64_t read_room(uint64_t offset, uint64_t bytes) {
  return io::align_up(offset + bytes, io::kDirectAlignment) - read_start(offset);
}

/// Where an extent's reads land in a staging slot when it starts at @p at (offsets in the
/// staging slot): its aligned bytes, then for an FP4 piece its aligned scales and the room its
/// MXFP4 blocks are re-laid into; @p end is where the next extent starts.
struct StagedExtent {
  uint64_t values = 0, scales = 0, relay = 0, end = 0;
  /// Offset of the extent's first byte (values) and of its first scale in the staging slot.
  uint64_t values_at(const ObjectExtent &x) const { return values + (x.offset - read_start(x.offset)); }
  uint64_t scales_at(const ObjectExtent &x) const { return scales + (x.scale_offset - read_start(x.scale_offset)); }
};

StagedExtent staged_extent(const ObjectExtent &x, uint64_t at) {
  StagedExtent s;
  s.values = at;
  at += read_room(x.offset, x.bytes);
  if (x.fp4()) {
    s.scales = at;
    at += read_room(x.scale_offset, x.scale_bytes);
    s.relay = at;
    at += io::align_up(x.object_bytes(), io::kDirectAlignment);
  }
  s.end = at;
  return s;
}

/// The read of @p bytes at @p offset of @p file (an extent's bytes, or an FP4 piece's scales)
/// into @p dst in the staging slot, for the load into slot @p slot.
io::ReadRequest extent_read(uint32_t file, uint64_t offset, uint64_t bytes, std::byte *dst, uint32_t slot) {
  io::ReadRequest r;
  r.file = file;
  r.offset = read_start(offset);
  r.bytes = offset + bytes - r.offset;  // the reader reads it up to the next 4096 boundary
  r.dst = dst;
  r.tag = slot;
  return r;
}

}  // namespace

/// Adds a store call's wall time with no read in flight to StoreStats::store_disk_idle_ns: the
/// call's time less the disk's busy time during it, on the reader's clock. Made under the store's
/// mutex (the reader's io_uring bookkeeping is guarded by it).
class ExpertStore::CallTimer {
 public:
  CallTimer(const io::Reader &reader, uint64_t &idle_ns) : reader_(reader), idle_ns_(idle_ns), start_(reader.busy_times()) {}
  ~CallTimer() {
    const io::BusyTimes end = reader_.busy_times();
    const uint64_t wall = end.now_ns - std::min(end.now_ns, start_.now_ns);
    idle_ns_ += wall - std::min(wall, end.busy_ns - start_.busy_ns);
  }
  CallTimer(const CallTimer &) = delete;
  CallTimer &operator=(const CallTimer &) = delete;

 private:
  const io::Reader &reader_;
  uint64_t &idle_ns_;
  io::BusyTimes start_;
};

/// An unreleased acquisition: its unique experts and their pinned slots, and the reads it
/// waits for.
struct ExpertStore::Held {
  std::vector<uint32_t> unique;   // expert ids, ascending; parallel to slots
  std::vector<SlotRef> slots;     // pinned
  uint32_t table = kNoTable;      // its ring table (released with it)
  uint64_t table_used = 0;        // words of the table its waves took
  std::vector<uint64_t> table_offsets;  // the table's rows
  std::vector<uint32_t> pending;  // slots whose read has not landed
  std::vector<uint32_t> landed;   // slots ready, not handed out by wait_ready() yet
  Status status = Status::ok;
  std::string error;              // the first failed read of the acquisition
};

ExpertStore::ExpertStore(StoreOptions options, std::unique_ptr<StoreDevice> device)
    : options_(std::move(options)), device_(std::move(device)) {
  if (!device_) fail(Status::invalid_argument, "ExpertStore: no device");
  if (!options_.objects) fail(Status::invalid_argument, "ExpertStore: no object map for {}", options_.pack_path);
  if (options_.data_paths.empty()) options_.data_paths.push_back(options_.pack_path);
  const ObjectMap &layout = *options_.objects;
  // Check the files hold every object before anything reads them; each extent is read as the
  // aligned range around it, back to back in one staging slot.
  std::vector<uint64_t> file_bytes;
  for (const std::string &p : options_.data_paths) file_bytes.push_back(io::file_size_bytes(p));
  uint64_t staging_room = 0;
  uint32_t object_reads = 1;  // the most reads one object takes (extents, and FP4 pieces' scales)
  for (uint32_t l = 0; l < layout.num_layers(); ++l) {
    for (uint32_t e = 0; e < layout.num_experts(); ++e) {
      const uint64_t object_bytes = layout.object_bytes(l, e);
      uint64_t room = 0;
      const std::vector<ObjectExtent> extents = layout.object_extents(l, e);
      if (extents.empty()) fail(Status::format, "{}: layer {} expert {}: an object of no extents", options_.pack_path, l, e);
      // @p what (the object, or an FP4 piece's scales) at @p offset of file @p file.
      auto check_range = [&](const char *what, uint32_t file, uint64_t offset, uint64_t bytes) {
        if (file >= file_bytes.size())
          fail(Status::format, "{}: layer {} expert {}: {} in file {}, the pack has {} file(s)", options_.pack_path, l, e, what, file,
               file_bytes.size());
        if (offset > file_bytes[file] || bytes > file_bytes[file] - offset)
          fail(Status::format, "{}: layer {} expert {}: {} at offset {} ({} bytes) must lie inside the {}-byte file",
               options_.data_paths[file], l, e, what, offset, bytes, file_bytes[file]);
      };
      for (const ObjectExtent &x : extents) {
        check_range("object", x.file, x.offset, x.bytes);
        if (x.fp4()) {
          if (x.fp4_cols % 32 || x.bytes != x.fp4_rows * x.fp4_cols / 2 || x.scale_bytes != x.fp4_rows * x.fp4_cols / 32)
            fail(Status::format, "{}: layer {} expert {}: an FP4 piece of [{}, {}] with {} value and {} scale bytes",
                 options_.pack_path, l, e, x.fp4_rows, x.fp4_cols, x.bytes, x.scale_bytes);
          check_range("scales", x.scale_file, x.scale_offset, x.scale_bytes);
        }
        if (x.offset_in_object > object_bytes || x.object_bytes() > object_bytes - x.offset_in_object)
          fail(Status::format, "{}: layer {} expert {}: {} bytes at offset {} of a {}-byte object", options_.pack_path, l, e,
               x.object_bytes(), x.offset_in_object, object_bytes);
        room = staged_extent(x, room).end;
      }
      staging_room = std::max(staging_room, room);
      uint32_t reads = 0;
      for (const ObjectExtent &x : extents) reads += x.fp4() ? 2 : 1;
      object_reads = std::max(object_reads, reads);
    }
  }
  slot_bytes_ = io::align_up(layout.max_object_bytes(), io::kDirectAlignment);
  staging_slot_bytes_ = std::max(slot_bytes_, staging_room);
  const uint64_t total_objects = static_cast<uint64_t>(layout.num_layers()) * layout.num_experts();
  cache::BudgetRequest br;
  br.requested_bytes = options_.cache_bytes;
  br.free_bytes = device_->free_bytes();
  br.reserve_bytes = options_.reserve_bytes;
  br.object_bytes = slot_bytes_;
  br.top_k = options_.top_k;
  br.tokens_per_acquire = options_.tokens_per_acquire;
  br.num_experts = layout.num_experts();
  br.total_objects = total_objects;
  const cache::Budget budget = cache::compute_budget(br);
  options_.tokens_per_acquire = budget.tokens_per_acquire;
  max_ids_ = options_.top_k * options_.tokens_per_acquire;
  table_ids_ = options_.table_ids ? options_.table_ids : max_ids_;
  options_.staging_slots = std::max<uint32_t>(1, options_.staging_slots);
  if (!(options_.decay.half_life_ticks > 0)) options_.decay.half_life_ticks = 32.0 * layout.num_layers();
  options_.table_ring = std::max<uint32_t>(1, options_.table_ring);
  // Prefetch reads leave a quarter of the staging ring (at least one slot) to demand reads.
  prefetch_staging_ = options_.staging_slots - std::max<uint32_t>(1, options_.staging_slots / 4);

  // The host tier: whole slots, no more than the experts the slots cannot hold, and no more than
  // the memory this process may still take.
  if (options_.host_cache_bytes) {
    const uint64_t wanted = options_.host_cache_bytes / slot_bytes_;
    if (wanted == 0)
      fail(Status::budget, "ExpertStore: a host tier of {} bytes holds no expert of {} bytes (ask for at least one)",
           options_.host_cache_bytes, slot_bytes_);
    const uint64_t slots = std::min<uint64_t>(wanted, total_objects - budget.slots);
    const uint64_t bytes = slots * slot_bytes_;
    const HostMemory hm = host_memory();
    const uint64_t room = options_.host_available_bytes ? options_.host_available_bytes : hm.available();
    if (bytes > room)
      fail(Status::budget,
           "ExpertStore: a host tier of {} bytes ({} experts of {} bytes) does not fit the memory this process may still take: "
           "{} bytes ({}); ask for less",
           bytes, slots, slot_bytes_, room,
           options_.host_available_bytes ? std::string("as configured") : hm.describe());
    host_slots_ = static_cast<uint32_t>(slots);
    if (host_slots_ == 0) log::info("ExpertStore: the slots hold every expert: no host tier");
  }

  DeviceShape shape;
  shape.num_slots = budget.slots;
  shape.slot_bytes = slot_bytes_;
  shape.staging_slots = options_.staging_slots;
  shape.staging_slot_bytes = staging_slot_bytes_;
  shape.tables = options_.table_ring;
  // A table holds every id's addresses, or the waves of a staged acquire: the same addresses
  // plus each entry's tokens and position (wave_words), one wave per landing.
  const uint32_t rows = std::max<uint32_t>(options_.table_rows, 1);
  table_words_ = static_cast<uint64_t>(table_ids_) * rows + (static_cast<uint64_t>(table_ids_) * (rows + 3) + 1) / 2;
  shape.table_entries = static_cast<uint32_t>(table_words_);
  shape.host_slots = host_slots_;
  device_->allocate(shape);

  // A full queue is as many reads as the staging ring lets the store have in flight (each read
  // split in read_splits parts), or the reader's depth if that is less.
  if (options_.reader.full_depth == 0)
    options_.reader.full_depth = options_.staging_slots * object_reads * std::max<uint32_t>(1, options_.reader.read_splits);
  reader_ = io::open_reader(options_.data_paths, options_.reader, counters_);
  reader_->register_buffer(device_->staging_base(), static_cast<std::size_t>(shape.staging_slots) * staging_slot_bytes_);
  cache_ = std::make_unique<cache::SlotCache>(budget.slots, cache::make_policy(options_.policy, options_.decay));
  if (host_slots_) {
    host_ = std::make_unique<cache::HostTier>(host_slots_, cache::make_policy(options_.policy, options_.decay));
    host_pins_.assign(host_slots_, 0);
    host_payload_bytes_.assign(host_slots_, 0);
  }
  pins_.assign(budget.slots, 0);
  generation_.assign(budget.slots, 0);
  slot_payload_bytes_.assign(budget.slots, 0);
  last_tick_.assign(budget.slots, 0);
  prefetched_.assign(budget.slots, 0);
  loads_.resize(budget.slots);
  for (uint32_t s = options_.staging_slots; s-- > 0;) free_staging_.push_back(s);
  table_held_.assign(options_.table_ring, 0);
  totals_.cache_slots = budget.slots;
  totals_.slot_bytes = slot_bytes_;
  totals_.host_slots = host_slots_;
  totals_.layers.resize(layout.num_layers());
  trace_.name = "ep_store";
  trace_.num_layers = layout.num_layers();
  trace_.num_experts = layout.num_experts();
  trace_.top_k = options_.top_k;
  trace_.tokens_per_acquire = options_.tokens_per_acquire;
  for (uint32_t l = 0; l < layout.num_layers(); ++l) trace_.object_bytes.push_back(layout.object_bytes(l, 0));
  log::info("ExpertStore: {} ({} file(s)) on {}: {} slots of {} B ({} policy), host tier {} slots, {} staging slots, reader {}{}",
            options_.pack_path, options_.data_paths.size(), device_->name(), budget.slots, slot_bytes_,
            cache_->policy().name(), host_slots_, options_.staging_slots, reader_->backend_name(),
            reader_->direct() ? " O_DIRECT" : " buffered");
}

ExpertStore::~ExpertStore() {
  try {
    {
      // The final stats are written after the reader is gone: its times up to now stay for them.
      std::lock_guard lock(mutex_);
      closed_busy_ = reader_->busy_times();
      closed_full_depth_ = reader_->full_depth();
    }
    reader_.reset();  // drains reads still writing into staging
    if (device_) device_->synchronize();
    if (!options_.stats_path.empty()) flush_stats();
  } catch (const std::exception &e) {
    log::warn("ExpertStore: while closing: {}", e.what());
  }
}

uint32_t ExpertStore::num_slots() const { return cache_->num_slots(); }

uint32_t ExpertStore::max_unique() const { return std::min(max_ids_, options_.objects->num_experts()); }

bool ExpertStore::evictable_demand(uint32_t s) const { return pins_[s] == 0 && device_->last_use_done(s); }

bool ExpertStore::evictable_prefetch(uint32_t s) const {
  // Never a slot one of the last num_layers acquires asked for: the current token's picks.
  const uint64_t guard = options_.objects->num_layers();
  return pins_[s] == 0 && tick_ - last_tick_[s] >= guard &&
         (device_->orders_copies_after_last_use() || device_->last_use_done(s));
}

std::optional<uint32_t> ExpertStore::place(cache::Key key, uint64_t tick, bool prefetch) {
  auto p = cache_->place(key, tick, [&](uint32_t s) { return prefetch ? evictable_prefetch(s) : evictable_demand(s); });
  // Every unpinned slot may still be read by kernels queued before (nothing synchronises the
  // compute stream): a device that orders the copy after the slot's last_use event takes the
  // policy's victim among them instead of failing.
  if (!p && !prefetch && device_->orders_copies_after_last_use())
    p = cache_->place(key, tick, [&](uint32_t s) { return pins_[s] == 0; });
  if (!p) return std::nullopt;
  if (p->evicted) evicted(*p->evicted, p->slot, tick);
  ++generation_[p->slot];
  return p->slot;
}

void ExpertStore::evicted(cache::Key key, uint32_t slot, uint64_t tick) {
  ++totals_.cache_evictions;
  const uint64_t bytes = slot_payload_bytes_[slot];
  totals_.resident_bytes -= bytes;
  slot_payload_bytes_[slot] = 0;
  prefetched_[slot] = 0;
  if (!host_ || bytes == 0) return;
  // Demotion: the device copies the slot out after its readers finished and before its next
  // content arrives; the host does not wait.
  auto a = host_->admit(key, tick, [&](uint32_t h) { return host_pins_[h] == 0; });
  if (!a) return;
  if (a->evicted) totals_.host_resident_bytes -= host_payload_bytes_[a->slot];
  device_->demote(slot, a->slot, bytes);
  host_payload_bytes_[a->slot] = bytes;
  totals_.host_resident_bytes += bytes;
  ++totals_.demotions;
}

void ExpertStore::promote(cache::Key key, uint32_t host_slot, uint32_t slot) {
  const uint64_t bytes = host_payload_bytes_[host_slot];
  device_->promote(host_slot, slot, bytes);
  host_->remove(key);
  totals_.host_resident_bytes -= bytes;
  host_payload_bytes_[host_slot] = 0;
  totals_.h2d_bytes += bytes;
  totals_.resident_bytes += bytes;
  slot_payload_bytes_[slot] = bytes;
}

void ExpertStore::start_load(cache::Key key, uint32_t slot, bool prefetch) {
  const ObjectMap &layout = *options_.objects;
  auto l = std::make_unique<Load>();
  l->key = key;
  l->extents = layout.object_extents(cache::key_layer(key), cache::key_expert(key));
  l->bytes = layout.object_bytes(cache::key_layer(key), cache::key_expert(key));
  l->prefetch = prefetch;
  loads_[slot] = std::move(l);
  ++pins_[slot];  // the read's own pin, dropped when it lands
  if (prefetch) {
    // A prefetch is only started with a free staging slot (hint() checks): submitted now.
    queued_.push_front(slot);
  } else {
    // Demand reads go before every queued prefetch (none is queued: see hint()).
    queued_.push_back(slot);
  }
}

uint32_t ExpertStore::staging_in_use() const { return options_.staging_slots - static_cast<uint32_t>(free_staging_.size()); }

void ExpertStore::pump() {
  std::byte *base = device_->staging_base();
  while (!queued_.empty() && !free_staging_.empty()) {
    const uint32_t slot = queued_.front();
    queued_.pop_front();
    Load &l = *loads_[slot];
    const uint32_t st = free_staging_.back();
    free_staging_.pop_back();
    device_->wait_staging(st);  // its previous copy must be done
    l.staging = st;
    l.reads_left = 0;
    for (const ObjectExtent &x : l.extents) l.reads_left += x.fp4() ? 2 : 1;
    if (l.prefetch) ++prefetch_in_flight_;
    std::byte *staged = base + static_cast<uint64_t>(st) * staging_slot_bytes_;
    uint64_t at = 0;
    for (const ObjectExtent &x : l.extents) {
      const StagedExtent se = staged_extent(x, at);
      reader_->submit(extent_read(x.file, x.offset, x.bytes, staged + se.values, slot));
      if (x.fp4()) reader_->submit(extent_read(x.scale_file, x.scale_offset, x.scale_bytes, staged + se.scales, slot));
      at = se.end;
    }
  }
}

void ExpertStore::poll(bool block) {
  if (reader_->outstanding() == 0) return;
  std::vector<io::ReadCompletion> done;
  reader_->wait(done, block ? 1 : 0);
  for (const io::ReadCompletion &c : done) land(static_cast<uint32_t>(c.tag), c);
  pump();
}

void ExpertStore::land(uint32_t slot, const io::ReadCompletion &c) {
  Load *in_flight = loads_.at(slot).get();
  if (!in_flight || in_flight->reads_left == 0)
    fail(Status::internal, "ExpertStore: a read landed in slot {}, which has none in flight", slot);
  if (!c.ok && in_flight->io_error.empty()) in_flight->io_error = c.message;
  if (--in_flight->reads_left > 0) return;  // the object's other extents are still being read
  std::unique_ptr<Load> l = std::move(loads_[slot]);
  if (l->prefetch) --prefetch_in_flight_;
  const uint32_t layer = cache::key_layer(l->key), expert = cache::key_expert(l->key);
  std::byte *staged = device_->staging_base() + static_cast<uint64_t>(l->staging) * staging_slot_bytes_;
  const ObjectExtent &first = l->extents.front();
  const std::string &file = options_.data_paths[first.file];
  const std::string where = l->extents.size() == 1 ? fmt::format("object at offset {} of {}, {} bytes", first.offset, file, l->bytes)
                                                   : fmt::format("object of {} bytes in {} extents", l->bytes, l->extents.size());
  std::string error;
  Status status = Status::io;
  // Where each extent's bytes are in the staging slot and go in the object; an FP4 piece is
  // re-laid into its MXFP4 blocks first (only when every read of the object succeeded).
  std::vector<CopySegment> segments;
  std::vector<const std::byte *> extent_data;
  uint64_t at = 0;
  for (const ObjectExtent &x : l->extents) {
    const StagedExtent se = staged_extent(x, at);
    at = se.end;
    uint64_t src = se.values_at(x);
    if (x.fp4() && l->io_error.empty() && error.empty()) {
      try {
        format::fp4_e8m0_to_mxfp4(reinterpret_cast<const uint8_t *>(staged + src),
                                  reinterpret_cast<const uint8_t *>(staged + se.scales_at(x)), x.fp4_rows, x.fp4_cols,
                                  reinterpret_cast<uint8_t *>(staged + se.relay),
                                  fmt::format("{}: FP4 values at offset {}, scales at offset {}{}", options_.data_paths[x.file],
                                              x.offset, x.scale_offset,
                                              x.scale_file == x.file ? "" : " of " + options_.data_paths[x.scale_file]));
      } catch (const Error &e) {
        error = fmt::format("ExpertStore: layer {} expert {} (pack {}, {}) is corrupt: {}", layer, expert, options_.pack_path, where,
                            e.what());
        status = e.status();
      }
      src = se.relay;
    }
    segments.push_back(CopySegment{src, x.offset_in_object, x.object_bytes()});
    extent_data.push_back(staged + src);
  }
  if (!l->io_error.empty()) {
    error = fmt::format("ExpertStore: cannot load layer {} expert {} (pack {}, {}): {}", layer, expert, options_.pack_path, where,
                        l->io_error);
  } else if (error.empty() && options_.verify_payloads) {
    const bool whole = l->extents.size() == 1 && first.offset_in_object == 0;
    const std::string bad = options_.objects->check_extents(layer, expert, extent_data);
    if (!bad.empty()) {
      error = whole ? fmt::format("ExpertStore: layer {} expert {} read from {} (pack {}, object at offset {}, {} bytes) is corrupt: {}",
                                  layer, expert, file, options_.pack_path, first.offset, l->bytes, bad)
                    : fmt::format("ExpertStore: layer {} expert {} (pack {}, {}) is corrupt: {}", layer, expert,
                                  options_.pack_path, where, bad);
      status = Status::corrupt;
    }
  }
  // A payload that fails its check is a failed read as much as an EIO is (the read's own errors
  // were counted by the reader).
  if (!error.empty() && l->io_error.empty()) counters_.io_errors.fetch_add(1, std::memory_order_relaxed);
  free_staging_.push_back(l->staging);
  --pins_[slot];
  if (error.empty()) {
    // Per-expert completion: this expert's copy starts now, while other reads continue. Only
    // bytes that checked out are ever copied to a slot.
    device_->copy_to_slot(slot, l->staging, segments);
    if (l->prefetch) totals_.prefetch_read_bytes += l->bytes;
    LayerStats &per_layer = totals_.layers[cache::key_layer(l->key)];
    ++per_layer.pack_reads;
    per_layer.pack_read_bytes += l->bytes;
    totals_.h2d_bytes += l->bytes;
    totals_.resident_bytes += l->bytes;
    slot_payload_bytes_[slot] = l->bytes;
    for (auto &[ticket, h] : held_) {
      auto it = std::find(h.pending.begin(), h.pending.end(), slot);
      if (it == h.pending.end()) continue;
      h.pending.erase(it);
      h.landed.push_back(slot);
    }
    return;
  }
  // The key leaves the cache (its slot is free again); every acquisition waiting for it fails
  // with this read's error once its other reads landed, and no longer pins the slot.
  cache_->remove(l->key);
  prefetched_[slot] = 0;
  bool waited = false;
  for (auto &[ticket, h] : held_) {
    auto it = std::find(h.pending.begin(), h.pending.end(), slot);
    if (it == h.pending.end()) continue;
    waited = true;
    h.pending.erase(it);
    for (size_t i = 0; i < h.slots.size(); ++i) {
      if (h.slots[i].slot != slot) continue;
      --pins_[slot];
      h.slots.erase(h.slots.begin() + static_cast<std::ptrdiff_t>(i));
      h.unique.erase(h.unique.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
    if (h.error.empty()) {
      h.error = error;
      h.status = status;
    }
  }
  if (!waited) log::warn("{} (a prefetch: dropped)", error);
}

std::vector<uint32_t> ExpertStore::checked_unique(uint32_t layer, std::span<const uint32_t> ids,
                                                  std::span<const uint64_t> table_offsets) const {
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
  return unique;
}

uint32_t ExpertStore::pin_hits(uint32_t layer, const std::vector<uint32_t> &unique, uint64_t tick, std::vector<uint32_t> &slot_of,
                               std::vector<size_t> &misses, Held &held) {
  uint32_t hits = 0;
  for (std::size_t i = 0; i < unique.size(); ++i) {
    const cache::Key key = cache::make_key(layer, unique[i]);
    if (auto s = cache_->find(key)) {
      ++hits;
      cache_->touch(key, tick);
      ++pins_[*s];
      slot_of[i] = *s;
      if (prefetched_[*s]) {
        if (prefetched_[*s] == kPrefetchRead) totals_.prefetch_used_read_bytes += options_.objects->object_bytes(layer, unique[i]);
        prefetched_[*s] = 0;
        ++totals_.prefetch_used;
      }
      if (loads_[*s]) held.pending.push_back(*s);  // a prefetch still being read
    } else {
      misses.push_back(i);
    }
  }
  return hits;
}

std::vector<std::optional<uint32_t>> ExpertStore::place_misses(uint32_t layer, const std::vector<uint32_t> &unique,
                                                               const std::vector<size_t> &misses, uint64_t tick,
                                                               std::vector<uint32_t> &slot_of, const std::vector<size_t> &hits) {
  // Host-tier hits are pinned there first, so that demotions for this acquire's other misses
  // cannot take their tier slots: a tier slot is reused only once its promotion was issued (the
  // demotion into it is ordered after that copy), i.e. by a later acquire. The caller unpins them
  // once the promotions are issued.
  std::vector<std::optional<uint32_t>> host_of(misses.size());
  if (host_)
    for (size_t j = 0; j < misses.size(); ++j)
      if ((host_of[j] = host_->find(cache::make_key(layer, unique[misses[j]])))) ++host_pins_[*host_of[j]];
  for (size_t j = 0; j < misses.size(); ++j) {
    const cache::Key key = cache::make_key(layer, unique[misses[j]]);
    const auto s = place(key, tick, false);
    if (!s) {
      for (size_t i : hits) --pins_[slot_of[i]];
      for (size_t k = 0; k < j; ++k) {
        --pins_[slot_of[misses[k]]];
        cache_->remove(cache::make_key(layer, unique[misses[k]]));
      }
      unpin_host(host_of);
      fail(Status::budget,
           "ExpertStore::acquire: layer {}: no slot to evict for expert {}: all {} slots are needed by this acquire, "
           "pinned by unreleased acquires or reads in flight, or still read by kernels (release acquisitions, or raise the "
           "budget)",
           layer, unique[misses[j]], cache_->num_slots());
    }
    ++pins_[*s];
    slot_of[misses[j]] = *s;
  }
  return host_of;
}

void ExpertStore::unpin_host(const std::vector<std::optional<uint32_t>> &host_of) {
  for (const auto &h : host_of)
    if (h) --host_pins_[*h];
}

uint32_t ExpertStore::load_misses(uint32_t layer, const std::vector<uint32_t> &unique, const std::vector<size_t> &misses,
                                  const std::vector<std::optional<uint32_t>> &host_of, const std::vector<uint32_t> &slot_of,
                                  Held &held) {
  uint32_t host_hits = 0;
  for (size_t j = 0; j < misses.size(); ++j) {
    const uint32_t s = slot_of[misses[j]];
    const cache::Key key = cache::make_key(layer, unique[misses[j]]);
    if (host_of[j]) {
      promote(key, *host_of[j], s);
      ++host_hits;
    } else {
      start_load(key, s, false);
      held.pending.push_back(s);
    }
  }
  pump();
  return host_hits;
}

std::optional<uint32_t> ExpertStore::take_table() {
  for (uint32_t k = 0; k < options_.table_ring; ++k) {
    const uint32_t t = (next_table_ + k) % options_.table_ring;
    if (!table_held_[t]) {
      next_table_ = (t + 1) % options_.table_ring;
      device_->wait_table(t);  // its last readers were queued a table_ring acquires ago
      table_held_[t] = 1;
      return t;
    }
  }
  return std::nullopt;
}

uint64_t ExpertStore::wave_words(uint32_t entries, uint32_t rows) {
  return static_cast<uint64_t>(rows) * entries + (static_cast<uint64_t>(rows + 1) * entries * sizeof(int32_t) + 7) / 8;
}

void ExpertStore::publish_wave(Held &h, Acquisition &a, const std::vector<uint8_t> &was_ready) {
  a.wave_table = nullptr;
  a.wave_lists = nullptr;
  a.n_wave = 0;
  if (h.table == kNoTable) return;
  // The entries newly ready, in the order of the ids (for a step's picks: ascending pairs).
  std::vector<uint32_t> entries;
  for (uint32_t i = 0; i < a.ids.size(); ++i)
    if (a.ready[i] && !was_ready[i]) entries.push_back(i);
  if (entries.empty()) return;
  const auto m = static_cast<uint32_t>(entries.size());
  const auto rows = static_cast<uint32_t>(h.table_offsets.size());
  std::vector<const void *> block(wave_words(m, rows), nullptr);
  for (uint32_t r = 0; r < rows; ++r)
    for (uint32_t e = 0; e < m; ++e)
      block[static_cast<size_t>(r) * m + e] = static_cast<const std::byte *>(a.pointers[entries[e]]) + h.table_offsets[r];
  // After the addresses: per row, each entry's token (its position / top_k: the input row its
  // matrix reads), then each entry's position in the ids (the pair its result row belongs to).
  std::vector<int32_t> lists;
  lists.reserve(static_cast<size_t>(rows + 1) * m);
  for (uint32_t r = 0; r < rows; ++r)
    for (uint32_t i : entries) lists.push_back(static_cast<int32_t>(i / options_.top_k));
  for (uint32_t i : entries) lists.push_back(static_cast<int32_t>(i));
  std::memcpy(block.data() + static_cast<size_t>(rows) * m, lists.data(), lists.size() * sizeof(int32_t));
  if (h.table_used + block.size() > table_words_)
    fail(Status::internal, "ExpertStore: layer {}: wave table of {} entries overflows the table ({} of {} words used)", a.layer, m,
         h.table_used, table_words_);
  const void *const *dev = device_->publish_table(h.table, block.data(), static_cast<uint32_t>(block.size()),
                                                  static_cast<uint32_t>(h.table_used));
  h.table_used += block.size();
  a.wave_table = dev;
  a.wave_lists = reinterpret_cast<const int32_t *>(dev + static_cast<size_t>(rows) * m);
  a.n_wave = m;
}

Acquisition ExpertStore::acquire(uint32_t layer, std::span<const uint32_t> ids, std::span<const uint64_t> table_offsets,
                                 bool staged) {
  static constexpr uint64_t kSlotsOnly[1] = {0};
  if (table_offsets.empty()) table_offsets = kSlotsOnly;
  const std::vector<uint32_t> unique = checked_unique(layer, ids, table_offsets);

  std::lock_guard lock(mutex_);
  const CallTimer timer(*reader_, totals_.store_disk_idle_ns);
  poll(false);  // land what finished meanwhile (prefetches): their copies start now
  const uint64_t tick = ++tick_;
  // The one dedup of a step: each distinct expert is a hit (pinned in its slot), a host-tier hit
  // (promoted into a victim slot) or a miss (read into a victim slot).
  std::vector<uint32_t> slot_of(unique.size());
  std::vector<size_t> misses;
  Held held;
  // The policies see the request first (sglang-lfu counts it); more than one token's picks is
  // SGLang's is_prefill.
  std::vector<cache::Key> keys(unique.size());
  for (std::size_t i = 0; i < unique.size(); ++i) keys[i] = cache::make_key(layer, unique[i]);
  const bool prefill = ids.size() > options_.top_k;
  cache_->request(keys, prefill);
  if (host_) host_->count_requests(keys, prefill);
  const uint32_t hits = pin_hits(layer, unique, tick, slot_of, misses, held);
  std::vector<size_t> hit_index;
  for (size_t i = 0, j = 0; i < unique.size(); ++i) {
    if (j < misses.size() && misses[j] == i) ++j;
    else hit_index.push_back(i);
  }
  const std::vector<std::optional<uint32_t>> host_of = place_misses(layer, unique, misses, tick, slot_of, hit_index);
  const uint32_t host_hits = load_misses(layer, unique, misses, host_of, slot_of, held);
  unpin_host(host_of);
  totals_.cache_hits += hits;
  totals_.cache_misses += misses.size();
  totals_.host_hits += host_hits;
  LayerStats &per_layer = totals_.layers[layer];
  per_layer.cache_hits += hits;
  per_layer.cache_misses += misses.size();
  per_layer.host_hits += host_hits;
  if (host_) totals_.host_misses += misses.size() - host_hits;
  ++totals_.acquires;
  for (std::size_t i = 0; i < unique.size(); ++i) {
    last_tick_[slot_of[i]] = tick;
    if (std::find(held.pending.begin(), held.pending.end(), slot_of[i]) == held.pending.end())
      device_->compute_wait_ready(slot_of[i]);
  }

  // Per id, as given: its slot's address, generation and whether it is ready.
  Acquisition a;
  a.ticket = next_ticket_++;
  a.layer = layer;
  a.ids.assign(ids.begin(), ids.end());
  a.hits = hits;
  a.misses = static_cast<uint32_t>(misses.size());
  a.host_hits = host_hits;
  a.pending = static_cast<uint32_t>(held.pending.size());
  a.pointers.reserve(ids.size());
  a.refs.reserve(ids.size());
  a.ready.reserve(ids.size());
  for (uint32_t id : ids) {
    const auto i = static_cast<std::size_t>(std::lower_bound(unique.begin(), unique.end(), id) - unique.begin());
    const uint32_t s = slot_of[i];
    a.pointers.push_back(device_->slot_ptr(s));
    a.refs.push_back(SlotRef{s, generation_[s]});
    a.ready.push_back(std::find(held.pending.begin(), held.pending.end(), s) == held.pending.end() ? 1 : 0);
  }
  held.unique = unique;
  for (uint32_t s : slot_of) held.slots.push_back(SlotRef{s, generation_[s]});
  held.table_offsets.assign(table_offsets.begin(), table_offsets.end());
  held_.emplace_back(a.ticket, std::move(held));
  if (options_.record_trace) trace_.accesses.push_back(cache::TraceAccess{layer, a.ids, false});
  auto this_held = [&] { return std::find_if(held_.begin(), held_.end(), [&](const auto &h) { return h.first == a.ticket; }); };

  if (!staged) {
    // A complete acquire: every read lands before it returns; a failure releases and throws.
    try {
      while (a.pending > 0) wait_ready_locked(a);
    } catch (...) {
      auto it = this_held();
      if (it != held_.end()) end_held(it);
      throw;
    }
  }
  if (ids.size() > table_ids_) {
    write_stats_every();
    return a;
  }
  // The device table of this acquire (one ring table, released with it): every id's row of
  // addresses per table offset (e.g. the gate, up and down weights inside each slot) when every
  // expert is ready; else the ready ids' wave now, and each later wave from wait_ready().
  auto it = this_held();
  const std::optional<uint32_t> table = take_table();
  if (!table) {
    end_held(it);
    fail(Status::busy, "ExpertStore::acquire: {} acquisitions are unreleased (table_ring {}): release some first",
         options_.table_ring, options_.table_ring);
  }
  it->second.table = *table;
  if (a.pending == 0) {
    std::vector<const void *> rows;
    rows.reserve(a.pointers.size() * table_offsets.size());
    for (uint64_t off : table_offsets)
      for (const void *p : a.pointers) rows.push_back(static_cast<const std::byte *>(p) + off);
    a.device_table = device_->publish_table(*table, rows.data(), static_cast<uint32_t>(rows.size()), 0);
  } else {
    publish_wave(it->second, a, std::vector<uint8_t>(a.ids.size(), 0));
  }
  write_stats_every();
  return a;
}

void ExpertStore::write_stats_every() const {
  if (options_.stats_every && !options_.stats_path.empty() && totals_.acquires % options_.stats_every == 0)
    write_stats_file(stats_locked(), options_.stats_path);
}

std::vector<uint32_t> ExpertStore::take_ready(Held &h, Acquisition &a) {
  std::vector<uint32_t> out;
  for (uint32_t s : h.landed) {
    device_->compute_wait_ready(s);
    for (size_t i = 0; i < h.slots.size(); ++i)
      if (h.slots[i].slot == s) out.push_back(h.unique[i]);
  }
  h.landed.clear();
  std::sort(out.begin(), out.end());
  for (size_t i = 0; i < a.ids.size(); ++i)
    if (!a.ready[i] && std::binary_search(out.begin(), out.end(), a.ids[i])) a.ready[i] = 1;
  a.pending -= static_cast<uint32_t>(out.size());
  return out;
}

std::vector<uint32_t> ExpertStore::wait_ready(Acquisition &a) {
  std::lock_guard lock(mutex_);
  const CallTimer timer(*reader_, totals_.store_disk_idle_ns);
  return wait_ready_locked(a);
}

std::vector<uint32_t> ExpertStore::wait_ready_locked(Acquisition &a) {
  auto it = std::find_if(held_.begin(), held_.end(), [&](const auto &h) { return h.first == a.ticket; });
  if (it == held_.end())
    fail(Status::invalid_argument, "ExpertStore::wait_ready: acquisition {} (layer {}) is not held: released?", a.ticket,
         a.layer);
  Held &h = it->second;
  a.wave_table = nullptr;  // a wave is valid until the next wait_ready()
  a.wave_lists = nullptr;
  a.n_wave = 0;
  for (;;) {
    if (!h.error.empty()) {
      if (h.pending.empty()) throw Error(h.status, h.error);
    } else {
      if (!h.landed.empty()) {
        const std::vector<uint8_t> was_ready = a.ready;
        std::vector<uint32_t> out = take_ready(h, a);
        publish_wave(h, a, was_ready);
        return out;
      }
      if (h.pending.empty()) return {};
    }
    if (reader_->outstanding() == 0)
      fail(Status::internal, "ExpertStore::wait_ready: layer {}: {} expert(s) pending with no read in flight", a.layer,
           h.pending.size());
    // The caller is stalled on the disk: the busy time that passes meanwhile (a wake-up after
    // the last read landed is the store's own time, in store_disk_idle_ns).
    const io::BusyTimes before = reader_->busy_times();
    poll(true);
    const uint64_t waited = reader_->busy_times().busy_ns - before.busy_ns;
    totals_.expert_wait_ns += waited;
    totals_.layers[a.layer].expert_wait_ns += waited;
  }
}

void ExpertStore::end_held(std::vector<std::pair<uint64_t, Held>>::iterator it) {
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

void ExpertStore::release(const Acquisition &a) {
  std::lock_guard lock(mutex_);
  auto it = std::find_if(held_.begin(), held_.end(), [&](const auto &h) { return h.first == a.ticket; });
  if (it == held_.end())
    fail(Status::invalid_argument, "ExpertStore::release: acquisition {} (layer {}) is not held: released twice?",
         a.ticket, a.layer);
  const CallTimer timer(*reader_, totals_.store_disk_idle_ns);
  end_held(it);
  poll(false);  // copies of reads that landed meanwhile start now
}

void ExpertStore::hint(uint32_t layer, std::span<const uint32_t> ids) {
  if (!options_.prefetch) return;
  const ObjectMap &layout = *options_.objects;
  if (layer >= layout.num_layers()) return;
  std::vector<uint32_t> unique;
  for (uint32_t id : ids)
    if (id < layout.num_experts()) unique.push_back(id);
  std::sort(unique.begin(), unique.end());
  unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
  std::lock_guard lock(mutex_);
  const CallTimer timer(*reader_, totals_.store_disk_idle_ns);
  poll(false);
  for (uint32_t e : unique) {
    const cache::Key key = cache::make_key(layer, e);
    if (cache_->find(key)) continue;
    const std::optional<uint32_t> h = host_ ? host_->find(key) : std::nullopt;
    // Only into free I/O capacity: a free staging slot no demand read waits for, within the
    // prefetch share of the ring.
    if (!h && (!queued_.empty() || free_staging_.empty() || prefetch_in_flight_ >= prefetch_staging_)) break;
    if (h) ++host_pins_[*h];
    const auto s = place(key, tick_, true);
    if (h) --host_pins_[*h];
    if (!s) break;  // every slot holds a pick of the current token (or is pinned)
    prefetched_[*s] = h ? kPrefetchPromoted : kPrefetchRead;
    ++totals_.prefetch_issued;
    if (h) {
      promote(key, *h, *s);
    } else {
      start_load(key, *s, true);
      pump();
    }
  }
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
  const io::BusyTimes busy = reader_ ? reader_->busy_times() : closed_busy_;
  s.pack_read_ns = busy.busy_ns;
  s.pack_read_full_ns = busy.full_ns;
  s.pack_read_full_depth = reader_ ? reader_->full_depth() : closed_full_depth_;
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
    if (auto k = cache_->key_of(s); k && !loads_[s]) out.push_back(Resident{cache::key_layer(*k), cache::key_expert(*k), s});
  return out;
}

std::vector<ExpertStore::Resident> ExpertStore::host_resident() const {
  std::lock_guard lock(mutex_);
  std::vector<Resident> out;
  for (uint32_t h = 0; h < host_slots_; ++h)
    if (auto k = host_->key_of(h)) out.push_back(Resident{cache::key_layer(*k), cache::key_expert(*k), h});
  return out;
}

void ExpertStore::read_slot(uint32_t slot, void *dst, uint64_t bytes) {
  std::lock_guard lock(mutex_);
  device_->read_slot(slot, dst, bytes);
}

void ExpertStore::read_host_slot(uint32_t host_slot, void *dst, uint64_t bytes) {
  std::lock_guard lock(mutex_);
  device_->read_host_slot(host_slot, dst, bytes);
}

}  // namespace ep::store
