// ExpertStore: turns a layer's routed expert ids into resident slot pointers with the fewest
// pack reads. Ties together the reader (src/io), the staging ring, the slot cache and its
// policy (src/cache) and a StoreDevice (CUDA, or host memory without a GPU).
//
// acquire(layer, ids):
//   hits  → the slot (the compute stream still waits on its `ready` event);
//   misses→ a victim slot (never one the current acquire needs, never one pinned by an
//           unreleased acquire, never one whose `last_use` event is pending); the object is read
//           into a staging slot and, as soon as that read completes, copied to the slot on the
//           transfer stream, which records the slot's `ready` event (per-expert completion);
//   then the compute stream waits on every needed slot's `ready` event and a device table of
//   slot pointers (one per id, in the order given; one row per table offset asked for) is
//   published on it: the one table the compute kernels read.
// release(acquisition): records each slot's `last_use` event on the compute stream and unpins.
//
// Generations: every slot has a counter bumped whenever it receives a new key; a SlotRef taken
// from an acquisition is stale once is_current() says so.
//
// Thread safety: every public method may be called from any thread. acquire() and release()
// are serialised by one internal mutex (I/O happens inside acquire, under it); stats() takes
// the same mutex briefly. An Acquisition must be released exactly once, by any thread.
#pragma once

#include "cache/policy.hpp"
#include "cache/trace.hpp"
#include "io/reader.hpp"
#include "store/device.hpp"
#include "store/object_map.hpp"
#include "store/stats.hpp"

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace ep::cache {
class SlotCache;
}

namespace ep::store {

struct StoreOptions {
  std::string pack_path;
  std::shared_ptr<const ObjectMap> objects;  ///< where each expert object lies in the pack file
  io::ReaderOptions reader;
  uint64_t cache_bytes = UINT64_MAX;  ///< requested budget (UINT64_MAX: all that is free)
  uint64_t reserve_bytes = 0;         ///< kept free on the device
  uint32_t top_k = 1;
  uint32_t tokens_per_acquire = 1;    ///< distinct ids per acquire ≤ top_k × tokens_per_acquire
  /// The device table's capacity in ids (0: top_k × tokens_per_acquire); an acquire of more ids
  /// publishes none (Acquisition::device_table is null; the host pointers are still there).
  uint32_t table_ids = 0;
  std::string policy = "decay";       ///< lru, sglang-lfu, decay, decay-bypass
  /// decay.half_life_ticks counts acquires (one per layer and step); 0 = 32 tokens x num_layers.
  cache::DecayOptions decay{0.0, false};
  uint32_t staging_slots = 16;        ///< pinned staging ring (each one object)
  uint32_t table_ring = 64;           ///< device pointer tables in flight
  /// Rows of addresses a published table holds at most (acquire()'s table_offsets).
  uint32_t table_rows = 1;
  std::string stats_path;             ///< JSON stats file ("" = none)
  uint32_t stats_every = 0;           ///< write it every N acquires (0 = only on flush_stats())
  bool record_trace = false;          ///< keep (layer, ids) of every acquire
  /// Check every object read against the layout's hashes (ObjectMap::check_object; a
  /// PackObjectMap checks XXH3 per role) before it is copied to its slot: wrong bytes from the
  /// disk or a pack changed after open fail the acquire with EP_ERR_CORRUPT instead of being
  /// computed with. Costs one XXH3 pass over the read bytes in host memory.
  bool verify_payloads = true;
};

struct SlotRef {
  uint32_t slot = 0;
  uint64_t generation = 0;
};

struct Acquisition {
  uint64_t ticket = 0;
  uint32_t layer = 0;
  std::vector<uint32_t> ids;               ///< as given
  std::vector<const void *> pointers;      ///< per id: slot address (device memory on CUDA)
  std::vector<SlotRef> refs;               ///< per id
  /// In device memory, [rows][ids]: row r, entry i = pointers[i] + table_offsets[r];
  /// valid until release (what the compute kernels read). Null when more ids were given than
  /// StoreOptions::table_ids.
  const void *const *device_table = nullptr;
  uint32_t hits = 0, misses = 0;           ///< unique keys
};

class ExpertStore {
 public:
  ExpertStore(StoreOptions options, std::unique_ptr<StoreDevice> device);
  ~ExpertStore();
  ExpertStore(const ExpertStore &) = delete;
  ExpertStore &operator=(const ExpertStore &) = delete;

  /// See the file comment. Throws EP_ERR_INVALID_ARGUMENT for a bad layer/id/count,
  /// EP_ERR_BUDGET when every slot is protected, EP_ERR_IO when a read fails, EP_ERR_CORRUPT
  /// when the bytes read do not match the pack's hashes (the message names the pack, layer,
  /// expert and offset). A failed acquire pins nothing and leaves no half-loaded slot.
  /// The published table has one row of addresses per entry of @p table_offsets: row r, entry i
  /// is slot(ids[i]) + table_offsets[r] (e.g. the model's roles inside an expert object); empty
  /// means one row of the slots themselves. At most StoreOptions::table_rows rows.
  Acquisition acquire(uint32_t layer, std::span<const uint32_t> ids, std::span<const uint64_t> table_offsets = {});
  /// Records last_use and unpins. Throws EP_ERR_INVALID_ARGUMENT for an unknown ticket.
  void release(const Acquisition &acquisition);

  bool is_current(SlotRef ref) const;
  StoreStats stats() const;
  /// Writes the stats file now (if stats_path is set).
  void flush_stats() const;
  /// The recorded acquires (record_trace), ready for ep-cache-sim / cache::simulate.
  cache::Trace recorded_trace() const;

  uint32_t num_slots() const;
  uint64_t slot_bytes() const { return slot_bytes_; }
  StoreDevice &device() { return *device_; }
  const io::Reader &reader() const { return *reader_; }
  const ObjectMap &objects() const { return *options_.objects; }

  struct Resident {
    uint32_t layer, expert, slot;
  };
  /// Every resident (layer, expert) and its slot (tests).
  std::vector<Resident> resident() const;
  /// Copies a slot's payload to host memory (tests).
  void read_slot(uint32_t slot, void *dst, uint64_t bytes);

 private:
  struct Miss;
  void load_misses(std::vector<Miss> &misses);
  StoreStats stats_locked() const;

  StoreOptions options_;
  std::unique_ptr<StoreDevice> device_;
  io::ReaderCounters counters_;
  std::unique_ptr<io::Reader> reader_;
  std::unique_ptr<cache::SlotCache> cache_;
  uint64_t slot_bytes_ = 0;
  uint64_t staging_slot_bytes_ = 0;
  uint32_t max_ids_ = 0;    // distinct ids per acquire
  uint32_t table_ids_ = 0;  // ids the device table holds
  static constexpr uint32_t kNoTable = UINT32_MAX;

  mutable std::mutex mutex_;
  uint64_t tick_ = 0;
  uint64_t next_ticket_ = 1;
  std::vector<uint32_t> pins_;
  std::vector<uint64_t> generation_;
  std::vector<uint64_t> slot_payload_bytes_;
  std::vector<char> table_held_;
  uint32_t next_table_ = 0;
  struct Held {
    std::vector<SlotRef> slots;  // unique
    uint32_t table;
  };
  std::vector<std::pair<uint64_t, Held>> held_;
  StoreStats totals_;
  cache::Trace trace_;
};

}  // namespace ep::store
