// The memory hierarchy of the ExpertStore on the host-memory device: the host-RAM tier
// (demotions, promotions, admission, exclusivity, budget errors, the two-tier simulator's exact
// numbers), staged acquires (experts handed out as their reads land; errors after every read of
// the acquisition landed; corrupt bytes never copied) and prefetch hints (spare staging only,
// never a slot of the current token).
#include "support/catch.hpp"

#include "cache/simulate.hpp"
#include "core/error.hpp"
#include "io/seam.hpp"
#include "store/expert_store.hpp"
#include "store/host_memory.hpp"
#include "testkit/store_pack.hpp"
#include "test_pack.hpp"

#include <xxhash.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <set>

using namespace ep;
using namespace ep::store;
using namespace ep::testkit;

namespace {

const ep::test::TestPack &test_pack() {
  // 4 layers x 16 experts, object bytes, seed
  static const ep::test::TestPack pack("store_tiers_test.pack", SyntheticPackSpec{4, 16, 32 * 1024 + 77, 21});
  return pack;
}

const SyntheticPackSpec &spec() { return test_pack().spec(); }
const std::string &pack_path() { return test_pack().path(); }

uint64_t expected_hash(uint32_t layer, uint32_t expert) { return test_pack().hash(layer, expert); }

/// The synthetic layout, checking every object read against its known hash (as a pack's index).
class CheckedMap final : public ObjectMap {
 public:
  CheckedMap() : inner_(spec().object_map()) {}
  uint32_t num_layers() const override { return inner_->num_layers(); }
  uint32_t num_experts() const override { return inner_->num_experts(); }
  uint64_t object_offset(uint32_t l, uint32_t e) const override { return inner_->object_offset(l, e); }
  uint64_t object_bytes(uint32_t l, uint32_t e) const override { return inner_->object_bytes(l, e); }
  std::string check_object(uint32_t l, uint32_t e, const std::byte *data) const override {
    return XXH3_64bits(data, spec().object_bytes) == expected_hash(l, e) ? std::string() : std::string("hash mismatch");
  }

 private:
  std::shared_ptr<UniformObjectMap> inner_;
};

StoreOptions options(uint32_t slots, uint32_t host_slots, uint32_t top_k = 4) {
  StoreOptions o;
  o.pack_path = pack_path();
  o.objects = std::make_shared<CheckedMap>();
  o.top_k = top_k;
  o.cache_bytes = slots * spec().stride();
  o.host_cache_bytes = host_slots * spec().stride();
  o.staging_slots = 3;
  o.reader.queue_depth = 4;
  o.reader.pread_threads = 2;
  return o;
}

bool right_bytes(const void *p, uint32_t layer, uint32_t expert) {
  return XXH3_64bits(p, spec().object_bytes) == expected_hash(layer, expert);
}

void check_pointers(const Acquisition &a) {
  for (std::size_t i = 0; i < a.ids.size(); ++i) CHECK(right_bytes(a.pointers[i], a.layer, a.ids[i]));
}

std::vector<uint32_t> random_ids(std::mt19937 &rng, uint32_t n, double skew) {
  // Zipf-like: expert e with weight 1 / (e + 1)^skew.
  std::vector<double> w(spec().num_experts);
  for (uint32_t e = 0; e < w.size(); ++e) w[e] = 1.0 / std::pow(e + 1.0, skew);
  std::discrete_distribution<uint32_t> d(w.begin(), w.end());
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < n; ++i) ids.push_back(d(rng));
  return ids;
}

/// Flips one byte of every read that covers file offset @p at (a silently corrupt sector).
class CorruptAt final : public io::IoSeam {
 public:
  explicit CorruptAt(uint64_t at) : at_(at) {}
  void on_read_data(uint64_t offset, void *dst, int64_t result) override {
    if (at_ >= offset && at_ < offset + static_cast<uint64_t>(result)) static_cast<unsigned char *>(dst)[at_ - offset] ^= 0x5a;
  }

 private:
  uint64_t at_;
};

Status status_of(const std::function<void()> &f) {
  try {
    f();
  } catch (const Error &e) {
    return e.status();
  }
  return Status::ok;
}

}  // namespace

TEST_CASE("host tier: demotions and promotions keep every byte right; stats add up; the simulator agrees", "[store][tiers]") {
  for (const std::string policy : {"lru", "sglang-lfu", "decay"}) {
    StoreOptions o = options(6, 10);
    o.policy = policy;
    o.record_trace = true;
    ExpertStore store(o, std::make_unique<HostDevice>());
    REQUIRE(store.num_host_slots() == 10);
    StoreOptions plain_o = options(6, 0);
    plain_o.policy = policy;
    ExpertStore plain(plain_o, std::make_unique<HostDevice>());
    std::mt19937 rng(7);
    for (int i = 0; i < 400; ++i) {
      const uint32_t layer = rng() % 2;  // 32 experts over 16 slots: hits in both tiers
      const auto ids = random_ids(rng, 1 + rng() % 4, 0.8);
      Acquisition a = store.acquire(layer, ids);
      check_pointers(a);
      CHECK(a.host_hits <= a.misses);
      store.release(a);
      plain.release(plain.acquire(layer, ids));
    }
    const StoreStats s = store.stats(), p = plain.stats();
    INFO(policy);
    CHECK(s.host_hits > 0);
    CHECK(s.demotions > 0);
    CHECK(s.host_slots == 10);
    CHECK(s.cache_misses == s.host_hits + s.host_misses);
    CHECK(s.pack_reads == s.host_misses);
    CHECK(s.h2d_bytes == s.cache_misses * spec().object_bytes);
    // The same counts per layer: only layers 0 and 1 were asked for.
    REQUIRE(s.layers.size() == spec().num_layers);
    uint64_t hits = 0, misses = 0, host_hits = 0, reads = 0, read_bytes = 0;
    for (const LayerStats &l : s.layers) {
      hits += l.cache_hits;
      misses += l.cache_misses;
      host_hits += l.host_hits;
      reads += l.pack_reads;
      read_bytes += l.pack_read_bytes;
    }
    CHECK(hits == s.cache_hits);
    CHECK(misses == s.cache_misses);
    CHECK(host_hits == s.host_hits);
    CHECK(reads == s.pack_reads);
    CHECK(read_bytes == s.pack_read_bytes);
    CHECK(s.layers[0].cache_misses > 0);
    CHECK(s.layers[1].cache_misses > 0);
    CHECK(s.layers[2].cache_hits + s.layers[2].cache_misses + s.layers[2].pack_reads == 0);
    // The slots decide alone: the tier changes where a miss comes from, not which keys miss.
    CHECK(s.cache_hits == p.cache_hits);
    CHECK(s.cache_misses == p.cache_misses);
    CHECK(s.pack_reads < p.pack_reads);
    // Exclusive tiers; every byte of the host tier right.
    std::set<std::pair<uint32_t, uint32_t>> in_slots;
    for (const auto &r : store.resident()) in_slots.insert({r.layer, r.expert});
    const auto host = store.host_resident();
    CHECK(s.host_resident_bytes == host.size() * spec().object_bytes);
    std::vector<std::byte> buf(spec().object_bytes);
    for (const auto &r : host) {
      CHECK_FALSE(in_slots.count({r.layer, r.expert}));
      store.read_host_slot(r.slot, buf.data(), buf.size());
      CHECK(right_bytes(buf.data(), r.layer, r.expert));
    }
    // The two-tier simulator replays the recorded trace to the store's exact numbers.
    cache::DecayOptions decay;
    decay.half_life_ticks = 32.0 * spec().num_layers;
    auto vp = cache::make_policy(policy, decay);
    const cache::SimResult sim =
        cache::simulate_two_tier(store.recorded_trace(), *vp, store.num_slots(), cache::make_policy(policy, decay), 10);
    CHECK(sim.hits == s.cache_hits);
    CHECK(sim.misses == s.cache_misses);
    CHECK(sim.host_hits == s.host_hits);
    CHECK(sim.demotions == s.demotions);
    CHECK(sim.pack_reads() == s.pack_reads);
  }
}

TEST_CASE("host tier: a one-off cold expert never displaces the tier's experts", "[store][tiers]") {
  ExpertStore store(options(4, 8, 4), std::make_unique<HostDevice>());
  // Eight hot experts of layer 0, each asked for twice.
  for (int round = 0; round < 2; ++round)
    for (uint32_t e = 0; e < 8; e += 4) store.release(store.acquire(0, std::vector<uint32_t>{e, e + 1, e + 2, e + 3}));
  // A stream of one-off experts cycles through the slots: it pushes the four hot ones still there
  // down, and none of the one-offs is admitted (the tier is full of experts asked for twice).
  const uint64_t demoted_before = store.stats().demotions;
  for (uint32_t l = 1; l < 4; ++l)
    for (uint32_t e = 0; e < 16; e += 4) store.release(store.acquire(l, std::vector<uint32_t>{e, e + 1, e + 2, e + 3}));
  std::set<std::pair<uint32_t, uint32_t>> host;
  for (const auto &r : store.host_resident()) host.insert({r.layer, r.expert});
  std::set<std::pair<uint32_t, uint32_t>> hot;
  for (uint32_t e = 0; e < 8; ++e) hot.insert({0, e});
  CHECK(host == hot);
  CHECK(store.stats().demotions == demoted_before + 4);
  // The hot experts come back from the tier without a pack read.
  const uint64_t reads = store.stats().pack_reads;
  for (uint32_t e = 0; e < 8; e += 4) {
    Acquisition a = store.acquire(0, std::vector<uint32_t>{e, e + 1, e + 2, e + 3});
    CHECK(a.host_hits == 4);
    check_pointers(a);
    store.release(a);
  }
  CHECK(store.stats().pack_reads == reads);
}

TEST_CASE("host tier: sizes that cannot be held fail with EP_ERR_BUDGET naming the size", "[store][tiers]") {
  StoreOptions o = options(6, 0);
  o.host_cache_bytes = spec().stride() - 1;  // no whole expert
  CHECK(status_of([&] { ExpertStore s(o, std::make_unique<HostDevice>()); }) == Status::budget);
  o.host_cache_bytes = 20 * spec().stride();
  o.host_available_bytes = 5 * spec().stride();
  try {
    ExpertStore s(o, std::make_unique<HostDevice>());
    FAIL("expected EP_ERR_BUDGET");
  } catch (const Error &e) {
    CHECK(e.status() == Status::budget);
    CHECK(std::string(e.what()).find(std::to_string(20 * spec().stride())) != std::string::npos);
  }
  // Larger than the experts the slots cannot hold: capped, not an error.
  o.host_available_bytes = 0;
  o.host_cache_bytes = 1000 * spec().stride();
  ExpertStore capped(o, std::make_unique<HostDevice>());
  CHECK(capped.num_host_slots() == 64 - 6);
  // What the machine reports is what an unconfigured store checks against.
  const HostMemory hm = host_memory();
  CHECK(hm.available() > 0);
  CHECK(hm.describe().find("MemAvailable") != std::string::npos);
}

TEST_CASE("a cgroup's page cache counts as room for the host tier, its anonymous memory does not", "[store][tiers]") {
  const std::filesystem::path root = std::filesystem::temp_directory_path() / ("ep-cgroup-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(root / "a" / "b");
  auto put = [](const std::filesystem::path &file, const std::string &text) { std::ofstream(file) << text; };
  // a: 10 GiB limit, 9 GiB charged of which 6 GiB page cache -> 7 GiB room.
  put(root / "a" / "memory.max", "10737418240\n");
  put(root / "a" / "memory.current", "9663676416\n");
  put(root / "a" / "memory.stat", "anon 3221225472\nfile 6442450944\nactive_file 2147483648\ninactive_file 4294967296\nshmem 0\n");
  // b (inside a): no limit of its own.
  put(root / "a" / "b" / "memory.max", "max\n");
  put(root / "a" / "b" / "memory.current", "9663676416\n");
  HostMemory m;
  apply_cgroup_limits(m, root.string(), "/a/b");
  CHECK(m.cgroup == (root / "a").string());
  CHECK(m.cgroup_room_bytes == 7516192768ull);
  CHECK(m.cgroup_file_bytes == 6442450944ull);
  CHECK(m.describe().find("page cache 6442450944 = 7516192768 bytes") != std::string::npos);
  // Anonymous memory over the limit leaves no room, whatever the cache.
  put(root / "a" / "memory.current", "10737418240\n");
  put(root / "a" / "memory.stat", "active_file 0\ninactive_file 0\n");
  HostMemory full;
  apply_cgroup_limits(full, root.string(), "/a/b");
  CHECK(full.cgroup_room_bytes == 0);
  std::filesystem::remove_all(root);
}

TEST_CASE("staged acquires hand out each expert as its read lands", "[store][overlap]") {
  io::FaultPlan plan;
  plan.latency_ns = 20'000'000;  // reads still in flight when acquire returns
  StoreOptions o = options(8, 0);
  o.table_ids = 8;
  o.reader.seam = std::make_shared<io::FaultInjector>(plan);
  ExpertStore store(o, std::make_unique<HostDevice>());
  store.release(store.acquire(0, std::vector<uint32_t>{1, 2}));
  const std::vector<uint32_t> ids{2, 5, 1, 9, 5};
  Acquisition a = store.acquire(0, ids, {}, /*staged=*/true);
  CHECK(a.hits == 2);
  CHECK(a.misses == 2);
  CHECK(a.pending == 2);
  CHECK(a.device_table == nullptr);
  CHECK(std::vector<uint8_t>(a.ready.begin(), a.ready.end()) == std::vector<uint8_t>{1, 0, 1, 0, 0});
  CHECK(right_bytes(a.pointers[0], 0, 2));
  CHECK(right_bytes(a.pointers[2], 0, 1));
  std::set<uint32_t> landed;
  while (a.pending > 0) {
    const auto got = store.wait_ready(a);
    REQUIRE_FALSE(got.empty());
    for (uint32_t e : got) {
      CHECK(landed.insert(e).second);
      for (size_t i = 0; i < ids.size(); ++i)
        if (ids[i] == e) {
          CHECK(a.ready[i] == 1);
          CHECK(right_bytes(a.pointers[i], 0, e));
        }
    }
  }
  CHECK(landed == std::set<uint32_t>{5, 9});
  CHECK(store.wait_ready(a).empty());
  for (uint8_t r : a.ready) CHECK(r == 1);
  store.release(a);
  // A staged acquire of hits only is complete at once, with its table.
  Acquisition b = store.acquire(0, ids, {}, true);
  CHECK(b.pending == 0);
  CHECK(b.device_table != nullptr);
  store.release(b);
}

TEST_CASE("staged acquires publish each wave's table: addresses per row, tokens, positions", "[store][overlap]") {
  io::FaultPlan plan;
  plan.latency_ns = 20'000'000;  // reads still in flight when acquire returns
  StoreOptions o = options(8, 0, 2);
  o.tokens_per_acquire = 4;
  o.table_ids = 8;
  o.table_rows = 3;
  o.reader.seam = std::make_shared<io::FaultInjector>(plan);
  ExpertStore store(o, std::make_unique<HostDevice>());
  store.release(store.acquire(0, std::vector<uint32_t>{1, 2}));
  const std::vector<uint32_t> ids{2, 5, 1, 9, 5, 2, 11, 1};  // four tokens of two picks
  const std::vector<uint64_t> offsets{0, 64, 4096};
  std::vector<int> waves_of(ids.size(), 0);
  // The wave just published must be exactly the ids that became ready, ascending, with their
  // addresses per row, their tokens (position / top_k) per row, then their positions.
  auto check_wave = [&](const Acquisition &a, const std::vector<uint8_t> &was_ready) {
    std::vector<uint32_t> fresh;
    for (uint32_t i = 0; i < ids.size(); ++i)
      if (a.ready[i] && !was_ready[i]) fresh.push_back(i);
    REQUIRE(a.n_wave == fresh.size());
    if (fresh.empty()) return;
    REQUIRE(a.wave_table != nullptr);
    REQUIRE(a.wave_lists != nullptr);
    const auto m = fresh.size();
    for (size_t r = 0; r < offsets.size(); ++r)
      for (size_t e = 0; e < m; ++e) {
        CHECK(a.wave_table[r * m + e] == static_cast<const std::byte *>(a.pointers[fresh[e]]) + offsets[r]);
        CHECK(a.wave_lists[r * m + e] == static_cast<int32_t>(fresh[e] / 2));
      }
    for (size_t e = 0; e < m; ++e) {
      CHECK(a.wave_lists[offsets.size() * m + e] == static_cast<int32_t>(fresh[e]));
      ++waves_of[fresh[e]];
    }
  };
  Acquisition a = store.acquire(0, ids, offsets, /*staged=*/true);
  REQUIRE(a.pending == 3);
  CHECK(a.device_table == nullptr);
  CHECK(a.n_wave == 4);  // experts 2 and 1, twice each
  check_wave(a, std::vector<uint8_t>(ids.size(), 0));
  while (a.pending > 0) {
    const std::vector<uint8_t> was_ready = a.ready;
    REQUIRE_FALSE(store.wait_ready(a).empty());
    check_wave(a, was_ready);
  }
  CHECK(waves_of == std::vector<int>(ids.size(), 1));  // every pair in exactly one wave
  store.release(a);
  // A complete acquire publishes the whole table and no wave.
  Acquisition b = store.acquire(0, ids, offsets);
  CHECK(b.n_wave == 0);
  CHECK(b.wave_table == nullptr);
  REQUIRE(b.device_table != nullptr);
  for (size_t r = 0; r < offsets.size(); ++r)
    for (size_t i = 0; i < ids.size(); ++i)
      CHECK(b.device_table[r * ids.size() + i] == static_cast<const std::byte *>(b.pointers[i]) + offsets[r]);
  store.release(b);
}

TEST_CASE("staged acquires: EIO and corrupt bytes fail after the acquisition's reads landed", "[store][overlap]") {
  for (const bool corrupt : {false, true}) {
    const uint64_t bad = spec().object_map()->object_offset(1, 7);
    std::shared_ptr<io::IoSeam> seam;
    if (corrupt) {
      seam = std::make_shared<CorruptAt>(bad);
    } else {
      io::FaultPlan plan;
      plan.latency_ns = 1'000'000;
      plan.bad_offset = bad;
      plan.bad_bytes = 1;
      seam = std::make_shared<io::FaultInjector>(plan);
    }
    StoreOptions o = options(8, 0);
    o.reader.eio_retries = 1;
    o.reader.seam = seam;
    ExpertStore store(o, std::make_unique<HostDevice>());
    store.release(store.acquire(1, std::vector<uint32_t>{3}));
    Acquisition a = store.acquire(1, std::vector<uint32_t>{3, 7, 8}, {}, true);
    try {
      while (a.pending > 0) store.wait_ready(a);
      FAIL("expected a read error");
    } catch (const Error &e) {
      const std::string msg = e.what();
      CHECK(e.status() == (corrupt ? Status::corrupt : Status::io));
      CHECK(msg.find("layer 1 expert 7") != std::string::npos);
      CHECK(msg.find(std::to_string(bad)) != std::string::npos);
    }
    store.release(a);
    // Nothing wrong stays: expert 7 is nowhere, every resident slot holds the right bytes.
    std::vector<std::byte> buf(spec().object_bytes);
    for (const auto &r : store.resident()) {
      CHECK_FALSE((r.layer == 1 && r.expert == 7));
      store.read_slot(r.slot, buf.data(), buf.size());
      CHECK(right_bytes(buf.data(), r.layer, r.expert));
    }
    // The next request works; expert 8 was read meanwhile and stays.
    Acquisition b = store.acquire(1, std::vector<uint32_t>{3, 8, 9});
    CHECK(b.hits == 2);
    check_pointers(b);
    store.release(b);
    CHECK(status_of([&] { store.acquire(1, std::vector<uint32_t>{7}); }) == (corrupt ? Status::corrupt : Status::io));
  }
}

TEST_CASE("prefetch hints: spare staging only, never a slot of the current token, then hits", "[store][prefetch]") {
  StoreOptions o = options(8, 0, 2);
  o.staging_slots = 4;  // prefetch may hold 3
  o.policy = "lru";     // the victims below are the least recently used
  SECTION("off: hints do nothing") {
    ExpertStore store(o, std::make_unique<HostDevice>());
    store.hint(2, std::vector<uint32_t>{4, 5});
    CHECK(store.stats().prefetch_issued == 0);
    CHECK(store.resident().empty());
  }
  SECTION("on") {
    o.prefetch = true;
    io::FaultPlan plan;
    plan.latency_ns = 2'000'000;
    o.reader.seam = std::make_shared<io::FaultInjector>(plan);
    ExpertStore store(o, std::make_unique<HostDevice>());
    store.hint(2, std::vector<uint32_t>{4, 5, 6, 7, 99});  // 99 out of range: ignored
    CHECK(store.stats().prefetch_issued == 3);             // the prefetch share of the staging ring
    Acquisition a = store.acquire(2, std::vector<uint32_t>{5, 4}, {}, true);
    CHECK(a.hits == 2);
    while (a.pending > 0) store.wait_ready(a);
    check_pointers(a);
    store.release(a);
    CHECK(store.stats().prefetch_used == 2);
    CHECK(store.stats().pack_reads <= 3);
    // Bytes: 4 and 5 were read by the hint and then asked for; 6 may still be in flight.
    CHECK(store.stats().prefetch_used_read_bytes == 2 * spec().object_bytes);
    CHECK(store.stats().prefetch_read_bytes >= 2 * spec().object_bytes);
    CHECK(store.stats().prefetch_read_bytes <= 3 * spec().object_bytes);
    CHECK(store.stats().prefetch_read_bytes <= store.stats().pack_read_bytes);
    // Fill the slots with this token's picks (the last num_layers acquires): a hint evicts none.
    for (uint32_t l = 0; l < 4; ++l) store.release(store.acquire(l, std::vector<uint32_t>{10, 11}));
    const auto before = store.resident();
    const uint64_t issued = store.stats().prefetch_issued;
    store.hint(3, std::vector<uint32_t>{0, 1});
    CHECK(store.stats().prefetch_issued == issued);
    CHECK(store.resident().size() == before.size());
    // A token later (num_layers acquires that do not ask for layer 0) its slots are fair game.
    for (uint32_t l : {1u, 2u, 3u, 1u}) store.release(store.acquire(l, std::vector<uint32_t>{10, 11}));
    store.hint(0, std::vector<uint32_t>{0, 1});
    CHECK(store.stats().prefetch_issued == issued + 2);
    Acquisition b = store.acquire(0, std::vector<uint32_t>{0, 1});
    CHECK(b.hits == 2);
    check_pointers(b);
    store.release(b);
  }
}
