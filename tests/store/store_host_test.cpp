// The whole acquire path on the host-memory device: correctness of every slot's bytes,
// protection of pinned and in-flight slots, stats sums, I/O errors, stats file, recorder.
#include <expertpack/expertpack.h>
#include "support/catch.hpp"

#include "cache/simulate.hpp"
#include "core/error.hpp"
#include "io/seam.hpp"
#include "store/expert_store.hpp"
#include "support/fake_disk_clock.hpp"
#include "testkit/store_pack.hpp"
#include "test_pack.hpp"

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

using namespace ep;
using namespace ep::store;
using namespace ep::testkit;

namespace {

const ep::test::TestPack &test_pack() {
  // 4 layers x 16 experts, object bytes, seed
  static const ep::test::TestPack pack("store_host_test.pack", SyntheticPackSpec{4, 16, 64 * 1024 + 123, 9});
  return pack;
}

const SyntheticPackSpec &spec() { return test_pack().spec(); }
const std::string &pack_path() { return test_pack().path(); }

StoreOptions options(uint32_t slots, uint32_t top_k = 4, uint32_t tokens = 1) {
  StoreOptions o;
  o.pack_path = pack_path();
  o.objects = spec().object_map();
  o.top_k = top_k;
  o.tokens_per_acquire = tokens;
  o.cache_bytes = slots * spec().stride();
  o.staging_slots = 3;
  o.reader.queue_depth = 4;
  o.reader.pread_threads = 2;
  return o;
}

uint64_t expected_hash(uint32_t layer, uint32_t expert) { return test_pack().hash(layer, expert); }

void check_pointers(const Acquisition &a) {
  for (std::size_t i = 0; i < a.ids.size(); ++i) {
    CHECK(XXH3_64bits(a.pointers[i], spec().object_bytes) == expected_hash(a.layer, a.ids[i]));
    CHECK(a.device_table[i] == a.pointers[i]);
  }
}

std::vector<uint32_t> random_ids(std::mt19937 &rng, uint32_t n) {
  std::vector<uint32_t> ids;
  std::uniform_int_distribution<uint32_t> d(0, spec().num_experts - 1);
  for (uint32_t i = 0; i < n; ++i) ids.push_back(d(rng));
  return ids;
}

uint64_t unique_count(const std::vector<uint32_t> &ids) { return std::set<uint32_t>(ids.begin(), ids.end()).size(); }

}  // namespace

TEST_CASE("random acquires return the right bytes; stats add up", "[store]") {
  for (const std::string policy : {"lru", "sglang-lfu", "decay", "decay-bypass"}) {
    for (auto backend : {io::Backend::automatic, io::Backend::pread}) {
      StoreOptions o = options(10, 4, 2);
      o.policy = policy;
      o.reader.backend = backend;
      ExpertStore store(o, std::make_unique<HostDevice>());
      CHECK(store.num_slots() == 10);
      std::mt19937 rng(5);
      uint64_t unique = 0, missed_bytes = 0;
      for (int i = 0; i < 300; ++i) {
        const uint32_t layer = rng() % spec().num_layers;
        const auto ids = random_ids(rng, 1 + rng() % 8);
        Acquisition a = store.acquire(layer, ids);
        unique += unique_count(ids);
        missed_bytes += a.misses * spec().object_bytes;
        CHECK(a.hits + a.misses == unique_count(ids));
        check_pointers(a);
        store.release(a);
      }
      const StoreStats s = store.stats();
      CHECK(s.acquires == 300);
      CHECK(s.cache_hits + s.cache_misses == unique);
      CHECK(s.pack_reads == s.cache_misses);
      CHECK(s.pack_read_bytes == missed_bytes);
      CHECK(s.h2d_bytes == missed_bytes);
      CHECK(s.resident_experts == 10);
      CHECK(s.resident_bytes == 10 * spec().object_bytes);
      CHECK(s.cache_evictions == s.cache_misses - 10);
      CHECK(s.io_errors == 0);
      CHECK(s.pack_read_ns > 0);
      // Every resident slot holds its key's bytes.
      std::vector<std::byte> buf(spec().object_bytes);
      for (const auto &r : store.resident()) {
        store.read_slot(r.slot, buf.data(), buf.size());
        CHECK(XXH3_64bits(buf.data(), buf.size()) == expected_hash(r.layer, r.expert));
      }
    }
  }
}

TEST_CASE("the recorder's trace replays to the same hits in the simulator", "[store]") {
  StoreOptions o = options(8);
  o.policy = "decay";
  o.record_trace = true;
  ExpertStore store(o, std::make_unique<HostDevice>());
  std::mt19937 rng(11);
  for (int i = 0; i < 200; ++i) {
    auto a = store.acquire(rng() % 4, random_ids(rng, 4));
    store.release(a);
  }
  const cache::Trace t = store.recorded_trace();
  REQUIRE(t.accesses.size() == 200);
  cache::DecayOptions decay;
  decay.half_life_ticks = 32.0 * spec().num_layers;  // the store's default
  auto policy = cache::make_policy("decay", decay);
  const auto sim = cache::simulate(t, *policy, store.num_slots());
  CHECK(sim.hits == store.stats().cache_hits);
  CHECK(sim.misses == store.stats().cache_misses);
}

TEST_CASE("duplicate ids share a slot; generations invalidate evicted slots", "[store]") {
  ExpertStore store(options(4, 4), std::make_unique<HostDevice>());
  const std::vector<uint32_t> ids{3, 3, 5};
  Acquisition a = store.acquire(0, ids);
  CHECK(a.pointers[0] == a.pointers[1]);
  CHECK(a.misses == 2);
  check_pointers(a);
  const SlotRef ref = a.refs[0];
  store.release(a);
  CHECK(store.is_current(ref));
  for (uint32_t e = 6; e < 14; ++e) store.release(store.acquire(0, std::vector<uint32_t>{e}));
  CHECK_FALSE(store.is_current(ref));
  CHECK_THROWS_AS(store.release(a), Error);  // released twice
}

TEST_CASE("pinned and in-flight slots are never evicted", "[store]") {
  SECTION("unreleased acquisitions pin their slots") {
    ExpertStore store(options(6, 4), std::make_unique<HostDevice>());
    Acquisition held = store.acquire(1, std::vector<uint32_t>{0, 1, 2, 3});
    for (uint32_t e = 4; e < 16; ++e) {
      auto a = store.acquire(1, std::vector<uint32_t>{e});
      check_pointers(a);
      store.release(a);
    }
    for (const auto &r : held.refs) CHECK(store.is_current(r));
    check_pointers(held);
    // 4 pinned + 3 needed > 6 slots: no victim.
    try {
      store.acquire(2, std::vector<uint32_t>{0, 1, 2});
      FAIL("expected EP_ERR_BUDGET");
    } catch (const Error &e) {
      CHECK(e.status() == Status::budget);
    }
    store.release(held);
    auto ok = store.acquire(2, std::vector<uint32_t>{0, 1, 2});
    check_pointers(ok);
    store.release(ok);
  }
  SECTION("a slot whose last_use event is pending is not a victim") {
    HostDevice::Options d;
    d.hold_last_use = true;
    auto device = std::make_unique<HostDevice>(d);
    HostDevice *dev = device.get();
    ExpertStore store(options(4, 4), std::move(device));
    store.release(store.acquire(0, std::vector<uint32_t>{0, 1, 2, 3}));  // all 4 slots in flight
    CHECK_THROWS_AS(store.acquire(0, std::vector<uint32_t>{4}), Error);
    auto hit = store.acquire(0, std::vector<uint32_t>{1});  // hits need no victim
    CHECK(hit.hits == 1);
    store.release(hit);
    dev->complete_last_use();
    auto a = store.acquire(0, std::vector<uint32_t>{4});
    check_pointers(a);
    store.release(a);
  }
}

TEST_CASE("init fails with EP_ERR_BUDGET when one acquire cannot fit", "[store]") {
  StoreOptions o = options(7, 4, 2);  // 8 unique experts may be needed
  try {
    ExpertStore store(o, std::make_unique<HostDevice>());
    FAIL("expected EP_ERR_BUDGET");
  } catch (const Error &e) {
    CHECK(e.status() == Status::budget);
  }
  HostDevice::Options small;
  small.free_bytes = 9 * spec().stride();
  o = options(100, 4, 2);
  o.reserve_bytes = 2 * spec().stride();  // 9 - 2 = 7 slots < 8
  CHECK_THROWS_AS(ExpertStore(o, std::make_unique<HostDevice>(small)), Error);
  o.reserve_bytes = 0;
  ExpertStore ok(o, std::make_unique<HostDevice>(small));
  CHECK(ok.num_slots() == 9);
}

TEST_CASE("a persistent EIO fails the acquire naming pack, layer, expert and offset", "[store]") {
  for (auto backend : {io::Backend::automatic, io::Backend::pread}) {
    io::FaultPlan plan;
    const uint64_t bad = spec().object_map()->object_offset(2, 7);
    plan.bad_offset = bad;
    plan.bad_bytes = 1;
    plan.short_probability = 0.3;  // short reads elsewhere must not matter
    StoreOptions o = options(8);
    o.reader.backend = backend;
    o.reader.eio_retries = 3;
    o.reader.seam = std::make_shared<io::FaultInjector>(plan);
    ExpertStore store(o, std::make_unique<HostDevice>());
    try {
      store.acquire(2, std::vector<uint32_t>{1, 7, 9});
      FAIL("expected EP_ERR_IO");
    } catch (const Error &e) {
      const std::string msg = e.what();
      CHECK(e.status() == Status::io);
      CHECK(msg.find(pack_path()) != std::string::npos);
      CHECK(msg.find("layer 2 expert 7") != std::string::npos);
      CHECK(msg.find(std::to_string(bad)) != std::string::npos);
    }
    CHECK(store.stats().io_errors == 4);
    // Nothing stays pinned or half-loaded: the other experts work, expert 7 still fails.
    auto a = store.acquire(2, std::vector<uint32_t>{1, 9, 10, 11});
    check_pointers(a);
    store.release(a);
    for (const auto &r : store.resident()) CHECK_FALSE((r.layer == 2 && r.expert == 7));
    CHECK_THROWS_AS(store.acquire(2, std::vector<uint32_t>{7}), Error);
    for (int i = 0; i < 20; ++i) store.release(store.acquire(3, std::vector<uint32_t>{uint32_t(i % 16)}));
    CHECK(store.stats().io_errors == 8);
  }
}

TEST_CASE("transient faults and latency leave the bytes right", "[store]") {
  io::FaultPlan plan;
  plan.seed = 99;
  plan.eio_probability = 0.1;
  plan.short_probability = 0.3;
  plan.eagain_probability = 0.1;
  plan.latency_ns = 200'000;
  StoreOptions o = options(6);
  o.reader.eio_retries = 20;
  o.reader.read_splits = 3;
  o.reader.seam = std::make_shared<io::FaultInjector>(plan);
  ExpertStore store(o, std::make_unique<HostDevice>());
  std::mt19937 rng(3);
  for (int i = 0; i < 40; ++i) {
    auto a = store.acquire(rng() % 4, random_ids(rng, 4));
    check_pointers(a);
    store.release(a);
  }
  CHECK(store.stats().io_errors > 0);
}

TEST_CASE("argument errors", "[store]") {
  ExpertStore store(options(8, 2), std::make_unique<HostDevice>());
  CHECK_THROWS_AS(store.acquire(4, std::vector<uint32_t>{0}), Error);
  CHECK_THROWS_AS(store.acquire(0, std::vector<uint32_t>{16}), Error);
  CHECK_THROWS_AS(store.acquire(0, std::vector<uint32_t>{0, 1, 2}), Error);
  CHECK_THROWS_AS(store.acquire(0, std::vector<uint32_t>{}), Error);
  CHECK(store.stats().acquires == 0);
}

TEST_CASE("stats file is written atomically every N acquires", "[store]") {
  const auto path = (std::filesystem::current_path() / "store_host_test.stats.json").string();
  std::filesystem::remove(path);
  StoreOptions o = options(8);
  o.stats_path = path;
  o.stats_every = 10;
  {
    ExpertStore store(o, std::make_unique<HostDevice>());
    for (uint32_t i = 0; i < 9; ++i) store.release(store.acquire(0, std::vector<uint32_t>{i}));
    CHECK_FALSE(std::filesystem::exists(path));
    store.release(store.acquire(0, std::vector<uint32_t>{9}));
    REQUIRE(std::filesystem::exists(path));
    CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
    std::ifstream in(path);
    const auto j = nlohmann::json::parse(in);
    CHECK(j.at("acquires") == 10);
    CHECK(j.at("cache_misses") == 10);
    CHECK(j.at("cache_hits").get<uint64_t>() + j.at("cache_misses").get<uint64_t>() == 10);
    for (const char *k : {"pack_reads", "pack_read_bytes", "pack_read_ns", "cache_evictions", "resident_experts",
                          "resident_bytes", "h2d_bytes", "io_errors", "fallback_count", "host_hits", "host_misses", "demotions",
                          "host_resident_bytes", "host_slots", "prefetch_issued", "prefetch_used", "pack_read_full_ns",
                          "pack_read_full_depth", "expert_wait_ns", "store_disk_idle_ns"})
      CHECK(j.contains(k));
  }
}

TEST_CASE("concurrent acquires from several threads", "[store]") {
  ExpertStore store(options(16, 4), std::make_unique<HostDevice>());
  std::atomic<uint64_t> unique{0};
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(100 + t);
      for (int i = 0; i < 100; ++i) {
        const uint32_t layer = rng() % 4;
        auto ids = random_ids(rng, 4);
        auto a = store.acquire(layer, ids);
        unique += unique_count(ids);
        for (std::size_t k = 0; k < ids.size(); ++k)
          if (XXH3_64bits(a.pointers[k], spec().object_bytes) != expected_hash(layer, ids[k])) ++bad;
        store.release(a);
      }
    });
  }
  for (auto &t : threads) t.join();
  CHECK(bad == 0);
  const auto s = store.stats();
  CHECK(s.acquires == 400);
  CHECK(s.cache_hits + s.cache_misses == unique);
}

using ep::test::FakeClock;
using ep::test::SlowDevice;

TEST_CASE("the store's times: disk busy, the caller stalled on it, its own work with the disk idle", "[store]") {
  for (auto backend : {io::Backend::automatic, io::Backend::pread}) {
    FakeClock c;
    auto seam = std::make_shared<SlowDevice>(c, 500);
    StoreOptions o = options(6, 4, 1);
    o.reader.backend = backend;
    o.reader.seam = seam;
    o.reader.clock = c.clock();
    ExpertStore store(o, std::make_unique<HostDevice>());
    const bool uring = store.reader().backend_name() == "io_uring";
    std::mt19937 rng(3);
    for (int i = 0; i < 40; ++i) {
      const uint32_t layer = rng() % spec().num_layers;
      Acquisition a = store.acquire(layer, random_ids(rng, 4), {}, i % 2 == 1);
      while (a.pending > 0) store.wait_ready(a);
      store.release(a);
    }
    StoreStats s = store.stats();
    REQUIRE(s.pack_reads > 0);
    // The clock moves only inside reads: the disk was busy 500 ns per raw read, the store never
    // ran with the disk idle, and the caller's stall is part of the busy time.
    CHECK(s.pack_read_ns == 500 * seam->calls);
    CHECK(s.store_disk_idle_ns == 0);
    CHECK(s.expert_wait_ns <= s.pack_read_ns);
    // staging 3 slots x 1 read per object, within the depth of 4 (pread: 2 threads)
    CHECK(s.pack_read_full_depth == (uring ? 3u : 2u));
    uint64_t per_layer = 0;
    for (const LayerStats &l : s.layers) per_layer += l.expert_wait_ns;
    CHECK(per_layer == s.expert_wait_ns);
    // io_uring completes reads only when the store reaps them, which it does while the caller
    // waits: the whole busy time is the caller's stall.
    if (uring) CHECK(s.expert_wait_ns == s.pack_read_ns);

    // An acquire of resident experts: no read, so its whole time is the store's own with the
    // disk idle (one tick between the call's two clock reads).
    const std::vector<ExpertStore::Resident> resident = store.resident();
    REQUIRE(!resident.empty());
    c.tick = true;
    const uint32_t one[1] = {resident.front().expert};
    const Acquisition a = store.acquire(resident.front().layer, one);
    CHECK(a.hits == 1);
    store.release(a);
    c.tick = false;
    const StoreStats s2 = store.stats();
    CHECK(s2.store_disk_idle_ns == 2);  // the acquire's tick and the release's
    CHECK(s2.pack_read_ns == s.pack_read_ns);
    CHECK(s2.expert_wait_ns == s.expert_wait_ns);
  }
}

TEST_CASE("the C API reads the stats file a store writes", "[store][capi]") {
  const auto path = (std::filesystem::current_path() / "store_host_test.capi.json").string();
  StoreStats s;
  s.acquires = 7;
  s.cache_hits = 5;
  s.cache_misses = 9;
  s.fallback_count = 1;
  s.slot_bytes = 4096;
  s.host_hits = 3;
  s.demotions = 5;
  s.prefetch_used = 2;
  s.expert_wait_ns = 11;
  s.store_disk_idle_ns = 13;
  write_stats_file(s, path);
  ep_store_stats out;
  ep_store_stats_init(&out);
  REQUIRE(ep_store_stats_read_file(&out, path.c_str()) == EP_OK);
  CHECK(out.struct_size == sizeof(ep_store_stats));
  CHECK(out.acquires == 7);
  CHECK(out.cache_hits + out.cache_misses == 14);
  CHECK(out.fallback_count == 1);
  CHECK(out.slot_bytes == 4096);
  CHECK(out.host_hits == 3);
  CHECK(out.demotions == 5);
  CHECK(out.prefetch_used == 2);
  CHECK(out.expert_wait_ns == 11);
  CHECK(out.store_disk_idle_ns == 13);
  // A caller of the first version gets the fields it knows.
  ep_store_stats v1;
  ep_store_stats_init(&v1);
  v1.struct_size = offsetof(ep_store_stats, host_hits);
  v1.host_hits = 99;
  REQUIRE(ep_store_stats_read_file(&v1, path.c_str()) == EP_OK);
  CHECK(v1.acquires == 7);
  CHECK(v1.host_hits == 99);
  CHECK(ep_store_stats_read_file(nullptr, path.c_str()) == EP_ERR_INVALID_ARGUMENT);
  out.struct_size = 3;
  CHECK(ep_store_stats_read_file(&out, path.c_str()) == EP_ERR_STRUCT_SIZE);
  ep_store_stats_init(&out);
  CHECK(ep_store_stats_read_file(&out, (path + ".missing").c_str()) == EP_ERR_NOT_FOUND);
  {
    std::ofstream bad(path);
    bad << "{\"acquires\": -1}";
  }
  CHECK(ep_store_stats_read_file(&out, path.c_str()) == EP_ERR_FORMAT);
  CHECK(std::string(ep_last_error()).find("acquires") != std::string::npos);
}
