// ExpertStore: turns a layer's routed expert ids into resident slot pointers with the fewest
// pack reads. Ties together the reader (src/io), the staging ring, the slot cache and its
// policy (src/cache), the host-RAM tier and a StoreDevice (CUDA, or host memory without a GPU).
//
// Three tiers: the slots (VRAM on CUDA), the host tier (pinned host memory; optional) and the
// pack on the SSD. acquire(layer, ids):
//   hits   → the slot (the compute stream still waits on its `ready` event);
//   misses → a victim slot (never one the current acquire needs, never one pinned by an
//            unreleased acquire or a read in flight, never one whose `last_use` event is pending
//            unless the device orders its copies after it). The victim's expert is demoted to
//            the host tier when the tier admits it (an expert asked for at least twice: a
//            one-off cold expert never displaces the tier's experts). A miss found in the host
//            tier is one copy into the slot (a promotion; the tier keeps experts exclusively, so
//            it leaves the tier); any other is read into a staging slot and, as soon as that read
//            completes and its bytes check out, copied to the slot on the transfer stream, which
//            records the slot's `ready` event (per-expert completion);
//   then the compute stream waits on every needed slot's `ready` event and a device table of
//   slot pointers (one per id, in the order given; one row per table offset asked for) is
//   published on it: the one table the compute kernels read. The tables are the store's: a ring
//   of them in device memory, one per unreleased acquisition.
// A staged acquire returns as soon as the reads are submitted: the experts still being read are
// flagged in Acquisition::ready, and wait_ready() hands them out as their reads land (each one's
// copy issued and waited for by the compute stream first), so the caller computes with the
// resident experts while the rest are read. Each hand-out (the ready ids at the acquire, then
// each wait_ready()) is a wave, published into the acquisition's table (Acquisition::wave_table). A failed read fails the wait_ready() that would
// have handed its expert out, after every read of the acquisition landed; the expert's bytes
// never reach its slot.
// hint(layer, ids): experts a later acquire will likely ask for (prefetch, opt-in): loaded into
// the slots only with staging slots no demand read is waiting for, and never into a slot used
// by one of the last num_layers acquires (the current token's picks).
// release(acquisition): records each slot's `last_use` event on the compute stream and unpins.
//
// Generations: every slot has a counter bumped whenever it receives a new key; a SlotRef taken
// from an acquisition is stale once is_current() says so.
//
// Thread safety: every public method may be called from any thread. acquire(), wait_ready(),
// hint() and release() are serialised by one internal mutex (I/O completions are handled under
// it); stats() takes the same mutex briefly.
//
// Time (StoreStats): the reader's busy time (pack_read_ns, pack_read_full_ns) is the disk's; the
// store adds the time its caller spent blocked waiting for reads to land (expert_wait_ns, per
// layer too: the busy time that passed while it waited, so it never exceeds pack_read_ns) and the
// time its calls ran with no read in flight (store_disk_idle_ns: the decisions, submissions,
// copies and tables of the delivery itself, and its waits for staging or tables). Both read the
// reader's clock twice per call or wait, never per read. An Acquisition must be released exactly once, by
// any thread.
#pragma once

#include "cache/policy.hpp"
#include "cache/trace.hpp"
#include "io/reader.hpp"
#include "store/device.hpp"
#include "store/object_map.hpp"
#include "store/stats.hpp"

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace ep::cache {
class SlotCache;
class HostTier;
}

namespace ep::store {

struct StoreOptions {
  std::string pack_path;
  /// The files the objects lie in, indexed by ObjectMap::object_file() (a striped pack's parts);
  /// empty: pack_path holds every object.
  std::vector<std::string> data_paths;
  std::shared_ptr<const ObjectMap> objects;  ///< where each expert object lies in the pack file
  io::ReaderOptions reader;
  uint64_t cache_bytes = 0;           ///< requested budget (0: all that is free, as StoreSettings::cache_budget_bytes)
  uint64_t reserve_bytes = 0;         ///< kept free on the device
  /// The host-RAM tier's budget in bytes (whole slots; 0 = no tier). Checked against the memory
  /// the process may take (HostMemory, or host_available_bytes): EP_ERR_BUDGET beyond it.
  uint64_t host_cache_bytes = 0;
  /// Memory the host tier may take (0: what the machine reports, store/host_memory.hpp).
  uint64_t host_available_bytes = 0;
  uint32_t top_k = 1;
  /// Distinct ids per acquire ≤ top_k × tokens_per_acquire; 0: as many tokens as the slots hold
  /// top_k experts for (cache::compute_budget; max_unique() tells the result).
  uint32_t tokens_per_acquire = 1;
  /// The device table's capacity in ids (0: top_k × tokens_per_acquire); an acquire of more ids
  /// publishes none (Acquisition::device_table is null; the host pointers are still there).
  uint32_t table_ids = 0;
  std::string policy = "decay";       ///< lru, sglang-lfu, decay, decay-bypass (the host tier uses the same)
  /// decay.half_life_ticks counts acquires (one per layer and step); 0 = 32 tokens x num_layers.
  cache::DecayOptions decay{0.0, false};
  uint32_t staging_slots = 16;        ///< pinned staging ring (each one object)
  uint32_t table_ring = 64;           ///< device pointer tables in flight
  /// Rows of addresses a published table holds at most (acquire()'s table_offsets).
  uint32_t table_rows = 1;
  /// Accept hint()s (prefetch); off: hint() does nothing.
  bool prefetch = false;
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
  /// Per id: 1 once its slot holds the expert and the compute stream waits for it. All 1 after a
  /// complete acquire; a staged one sets the rest through wait_ready().
  std::vector<uint8_t> ready;
  uint32_t pending = 0;                    ///< unique experts not ready yet
  /// In device memory, [rows][ids]: row r, entry i = pointers[i] + table_offsets[r];
  /// valid until release (what the compute kernels read). Null when more ids were given than
  /// StoreOptions::table_ids, or when a staged acquire returned before every expert was ready.
  const void *const *device_table = nullptr;
  /// A staged acquire's latest wave (the ids that became ready in acquire() or in the last
  /// wait_ready(), n_wave of them, in the order of the ids), in device memory, valid until
  /// release: wave_table [rows][n_wave], row r, entry e = pointers[i_e] + table_offsets[r]; then
  /// wave_lists int32 [rows][n_wave], each entry's token i_e / top_k (the same in every row), and
  /// int32 [n_wave], each entry's position i_e. Null (n_wave 0) when the acquire publishes no
  /// table (more ids than StoreOptions::table_ids), the acquire was complete, or no id became ready.
  const void *const *wave_table = nullptr;
  const int32_t *wave_lists = nullptr;
  uint32_t n_wave = 0;
  uint32_t hits = 0, misses = 0;           ///< unique keys (misses include host_hits)
  uint32_t host_hits = 0;                  ///< misses served from the host tier
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
  /// With @p staged, returns once the reads are submitted (see the file comment); read errors
  /// then come from wait_ready(). The ids ready then are published as the first wave
  /// (Acquisition::wave_table), each later wait_ready()'s as the next.
  Acquisition acquire(uint32_t layer, std::span<const uint32_t> ids, std::span<const uint64_t> table_offsets = {},
                      bool staged = false);
  /// Waits until at least one more expert of a staged acquisition is ready (its copy issued and
  /// the compute stream waiting for it) and returns those experts' ids (unique, ascending), with
  /// @p acquisition's ready flags, pending count and wave (wave_table) updated; empty once none
  /// is pending. Throws
  /// the first failed read's EP_ERR_IO / EP_ERR_CORRUPT (naming pack, layer, expert and offset)
  /// once every read of the acquisition landed; the acquisition must still be released.
  std::vector<uint32_t> wait_ready(Acquisition &acquisition);
  /// Records last_use and unpins. Throws EP_ERR_INVALID_ARGUMENT for an unknown ticket.
  void release(const Acquisition &acquisition);
  /// Experts of @p layer a later acquire will likely ask for (see the file comment); does
  /// nothing without StoreOptions::prefetch. Ids out of range are ignored.
  void hint(uint32_t layer, std::span<const uint32_t> ids);

  bool is_current(SlotRef ref) const;
  StoreStats stats() const;
  /// Writes the stats file now (if stats_path is set).
  void flush_stats() const;
  /// The recorded acquires (record_trace), ready for ep-cache-sim / cache::simulate.
  cache::Trace recorded_trace() const;

  uint32_t num_slots() const;
  /// The most distinct experts one acquire may ask for: min(top_k × tokens_per_acquire, experts).
  uint32_t max_unique() const;
  uint32_t num_host_slots() const { return host_slots_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  StoreDevice &device() { return *device_; }
  const io::Reader &reader() const { return *reader_; }
  const ObjectMap &objects() const { return *options_.objects; }

  struct Resident {
    uint32_t layer, expert, slot;
  };
  /// Every resident (layer, expert) whose bytes are in its slot, and the slot (tests).
  std::vector<Resident> resident() const;
  /// Every (layer, expert) of the host tier and its host slot (tests).
  std::vector<Resident> host_resident() const;
  /// Copies a slot's payload to host memory (tests).
  void read_slot(uint32_t slot, void *dst, uint64_t bytes);
  /// Copies a host-tier slot's payload to @p dst (tests).
  void read_host_slot(uint32_t host_slot, void *dst, uint64_t bytes);

 private:
  struct Load;
  struct Held;
  class CallTimer;
  bool evictable_demand(uint32_t slot) const;
  bool evictable_prefetch(uint32_t slot) const;
  std::optional<uint32_t> place(cache::Key key, uint64_t tick, bool prefetch);
  void evicted(cache::Key key, uint32_t slot, uint64_t tick);
  void promote(cache::Key key, uint32_t host_slot, uint32_t slot);
  void start_load(cache::Key key, uint32_t slot, bool prefetch);
  void pump();
  void poll(bool block);
  void land(uint32_t slot, const io::ReadCompletion &c);
  void end_held(std::vector<std::pair<uint64_t, Held>>::iterator it);
  std::vector<uint32_t> take_ready(Held &held, Acquisition &a);
  // acquire()'s steps, in order (see the file comment).
  std::vector<uint32_t> checked_unique(uint32_t layer, std::span<const uint32_t> ids,
                                       std::span<const uint64_t> table_offsets) const;
  uint32_t pin_hits(uint32_t layer, const std::vector<uint32_t> &unique, uint64_t tick, std::vector<uint32_t> &slot_of,
                    std::vector<size_t> &misses, Held &held);
  std::vector<std::optional<uint32_t>> place_misses(uint32_t layer, const std::vector<uint32_t> &unique,
                                                    const std::vector<size_t> &misses, uint64_t tick,
                                                    std::vector<uint32_t> &slot_of, const std::vector<size_t> &hits);
  void unpin_host(const std::vector<std::optional<uint32_t>> &host_of);
  uint32_t load_misses(uint32_t layer, const std::vector<uint32_t> &unique, const std::vector<size_t> &misses,
                       const std::vector<std::optional<uint32_t>> &host_of, const std::vector<uint32_t> &slot_of, Held &held);
  std::optional<uint32_t> take_table();
  /// Table words one wave of @p entries takes with @p rows rows: the addresses, then the int32 lists.
  static uint64_t wave_words(uint32_t entries, uint32_t rows);
  void publish_wave(Held &held, Acquisition &a, const std::vector<uint8_t> &was_ready);
  void write_stats_every() const;
  std::vector<uint32_t> wait_ready_locked(Acquisition &a);
  StoreStats stats_locked() const;
  uint32_t staging_in_use() const;

  StoreOptions options_;
  std::unique_ptr<StoreDevice> device_;
  io::ReaderCounters counters_;
  std::unique_ptr<io::Reader> reader_;
  std::unique_ptr<cache::SlotCache> cache_;
  std::unique_ptr<cache::HostTier> host_;  // null without a host tier
  uint64_t slot_bytes_ = 0;
  uint64_t staging_slot_bytes_ = 0;
  uint32_t max_ids_ = 0;    // distinct ids per acquire
  uint32_t table_ids_ = 0;  // ids the device table holds
  uint64_t table_words_ = 0;  // pointer-sized words per table
  uint32_t host_slots_ = 0;
  uint32_t prefetch_staging_ = 0;  // staging slots prefetch reads may hold at once
  static constexpr uint32_t kNoTable = UINT32_MAX;

  mutable std::mutex mutex_;
  uint64_t tick_ = 0;
  uint64_t next_ticket_ = 1;
  std::vector<uint32_t> pins_;
  std::vector<uint64_t> generation_;
  std::vector<uint64_t> slot_payload_bytes_;
  std::vector<uint64_t> last_tick_;       // per slot: the last acquire that asked for it
  static constexpr uint8_t kPrefetchRead = 1, kPrefetchPromoted = 2;
  std::vector<uint8_t> prefetched_;       // per slot: loaded by a hint (read or promoted), not asked for since
  std::vector<std::unique_ptr<Load>> loads_;  // per slot: the read in flight into it, if any
  std::deque<uint32_t> queued_;           // slots whose read waits for a staging slot (demand first)
  std::vector<uint32_t> free_staging_;
  uint32_t prefetch_in_flight_ = 0;
  std::vector<uint32_t> host_pins_;
  std::vector<uint64_t> host_payload_bytes_;
  std::vector<char> table_held_;
  uint32_t next_table_ = 0;
  std::vector<std::pair<uint64_t, Held>> held_;
  StoreStats totals_;
  io::BusyTimes closed_busy_;      // the reader's times when the destructor let it go
  uint32_t closed_full_depth_ = 0;
  cache::Trace trace_;
};

}  // namespace ep::store
