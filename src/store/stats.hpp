// ExpertStore statistics: one plain struct, its JSON form and an atomic JSON file writer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ep::store {

/// One layer's share of StoreStats' counts.
struct LayerStats {
  uint64_t cache_hits = 0;
  uint64_t cache_misses = 0;
  uint64_t host_hits = 0;
  uint64_t pack_reads = 0;       ///< objects read that landed (demand and prefetch)
  uint64_t pack_read_bytes = 0;  ///< their payload bytes
  uint64_t expert_wait_ns = 0;   ///< the caller blocked waiting for this layer's reads (StoreStats::expert_wait_ns)
};

struct StoreStats {
  uint64_t acquires = 0;
  uint64_t pack_reads = 0;       ///< objects read from the pack
  uint64_t pack_read_bytes = 0;  ///< their payload bytes
  /// Wall time with at least one read in flight (handed to the kernel: demand and prefetch alike),
  /// the reader's, over the store's life (io::Reader::busy_times; an open interval up to now).
  uint64_t pack_read_ns = 0;
  uint64_t cache_hits = 0;       ///< unique keys of an acquire that were resident (or being prefetched) in the slots
  uint64_t cache_misses = 0;     ///< unique keys of an acquire that were not; hits + misses = unique keys; misses = host_hits + reads
  uint64_t cache_evictions = 0;
  uint64_t resident_experts = 0;
  uint64_t resident_bytes = 0;   ///< payload bytes of the resident experts
  uint64_t h2d_bytes = 0;        ///< bytes copied into slots (staging → slot and host tier → slot)
  uint64_t io_errors = 0;        ///< failed reads (each EIO attempt counts, and each payload that failed its check)
  uint64_t fallback_count = 0;   ///< io_uring → pread pool, O_DIRECT → buffered
  uint64_t cache_slots = 0;
  uint64_t slot_bytes = 0;
  uint64_t host_hits = 0;        ///< misses of the slots served from the host tier (one copy, no pack read)
  uint64_t host_misses = 0;      ///< misses of the slots not in the host tier (read from the pack); 0 without a tier
  uint64_t demotions = 0;        ///< evicted experts copied into the host tier
  uint64_t host_resident_bytes = 0;  ///< payload bytes held by the host tier
  uint64_t host_slots = 0;       ///< slots of the host tier (0: no tier)
  uint64_t prefetch_issued = 0;  ///< experts loaded ahead of their acquire from a hint (reads and promotions)
  uint64_t prefetch_used = 0;    ///< prefetched experts an acquire then asked for
  uint64_t prefetch_read_bytes = 0;       ///< pack bytes read for hints (part of pack_read_bytes)
  uint64_t prefetch_used_read_bytes = 0;  ///< of those, the bytes of experts an acquire then asked for
  /// Wall time with at least pack_read_full_depth reads in flight: the queue kept full.
  uint64_t pack_read_full_ns = 0;
  /// The reads in flight that count as a full queue: the staging slots x the reads of an object x
  /// read_splits, at most the reader's depth (io::ReaderOptions::full_depth). A setting, not a count.
  uint64_t pack_read_full_depth = 0;
  /// Wall time the store's caller was blocked in acquire() / wait_ready() waiting for reads to land:
  /// the disk's busy time that passed meanwhile (never more than pack_read_ns).
  uint64_t expert_wait_ns = 0;
  /// Wall time the store's calls (acquire, wait_ready, hint, release) ran with no read in flight:
  /// the delivery's own host work and its waits for staging slots and tables while the disk idles.
  uint64_t store_disk_idle_ns = 0;
  std::vector<LayerStats> layers;         ///< per layer of the pack
};

/// Adds @p more's counts to @p into (the stores of several devices: every count and slot count
/// summed, per layer too, the times as well, each store's own reader's; slot_bytes and
/// pack_read_full_depth the larger).
void add_stats(StoreStats &into, const StoreStats &more);
/// {"acquires":...,"pack_reads":...} (every field above).
std::string stats_to_json(const StoreStats &stats);
/// Writes stats_to_json to @p path atomically (temporary file + rename).
void write_stats_file(const StoreStats &stats, const std::string &path);

}  // namespace ep::store
