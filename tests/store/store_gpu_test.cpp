// ExpertStore on a real GPU: random-routing acquires over a large synthetic pack (default
// 20 GiB; EP_STORE_GPU_PACK_BYTES to change, EP_STORE_GPU_PACK for the path, which is kept for
// reuse) with a small cache. Every resident slot's bytes are checked against the pack with
// XXH3, and a copy made on the compute stream right after each acquire (a stand-in for the MoE
// kernel) must see the right bytes: that checks the ready / last_use event ordering.
#include "support/catch.hpp"

#include "core/error.hpp"
#include "io/file.hpp"
#include "store/expert_store.hpp"
#include "testkit/store_pack.hpp"

#include <cuda_runtime.h>
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <thread>

using namespace ep;
using namespace ep::store;
using namespace ep::testkit;

namespace {

std::string env_or(const char *name, const std::string &fallback) {
  const char *v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

void cuda_ok(cudaError_t e, const char *what) {
  if (e != cudaSuccess) FAIL(what << ": " << cudaGetErrorString(e));
}

// XXH3 of an object as stored in the pack file (read through the page cache).
uint64_t pack_hash(int fd, const ObjectMap &layout, uint32_t layer, uint32_t expert) {
  std::vector<std::byte> buf(layout.object_bytes(layer, expert));
  std::size_t done = 0;
  while (done < buf.size()) {
    const ssize_t n = ::pread(fd, buf.data() + done, buf.size() - done,
                              static_cast<off_t>(layout.object_offset(layer, expert) + done));
    if (n <= 0) return 0;
    done += static_cast<std::size_t>(n);
  }
  return XXH3_64bits(buf.data(), buf.size());
}

/// The XXH3 of each object as stored in the pack file, remembered.
class PackHashes {
 public:
  PackHashes(const std::string &path, const ObjectMap &layout)
      : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)), layout_(layout) {
    REQUIRE(fd_);
  }
  uint64_t operator()(uint32_t layer, uint32_t expert) {
    auto [it, fresh] = hashes_.try_emplace({layer, expert}, 0);
    if (fresh) it->second = pack_hash(fd_.get(), layout_, layer, expert);
    return it->second;
  }

 private:
  io::FileHandle fd_;
  const ObjectMap &layout_;
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> hashes_;
};

}  // namespace

TEST_CASE("random routing over a large pack: every resident slot matches the pack", "[store][gpu]") {
  const uint64_t pack_bytes = parse_size(env_or("EP_STORE_GPU_PACK_BYTES", "20G"));
  const uint64_t object_bytes = parse_size(env_or("EP_STORE_GPU_OBJECT_BYTES", "13369344"));
  const int acquires = std::atoi(env_or("EP_STORE_GPU_ACQUIRES", "200").c_str());
  const std::string path =
      env_or("EP_STORE_GPU_PACK", (std::filesystem::current_path() / "store_gpu_test.pack").string());
  const SyntheticPackSpec spec = SyntheticPackSpec::for_size(pack_bytes, object_bytes, 64, 5);
  const auto t0 = std::chrono::steady_clock::now();
  const bool wrote = create_synthetic_pack(path, spec, std::max(4u, std::thread::hardware_concurrency()));
  std::printf("store_gpu_test: %s %s: %u layers x %u experts x %llu B = %.2f GiB in %.1f s\n",
              wrote ? "created" : "reusing", path.c_str(), spec.num_layers, spec.num_experts,
              static_cast<unsigned long long>(spec.object_bytes), static_cast<double>(spec.file_bytes()) / (1ull << 30),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  REQUIRE(spec.file_bytes() >= pack_bytes);

  for (const std::string policy : {"decay", "lru"}) {
    StoreOptions o;
    o.pack_path = path;
    o.objects = spec.object_map();
    o.top_k = 6;
    o.tokens_per_acquire = 4;
    o.policy = policy;
    o.cache_bytes = 40 * spec.stride();  // a small cache: 40 slots for 24-expert acquires
    o.staging_slots = 16;
    o.reader.queue_depth = 32;
    ExpertStore store(o, make_cuda_device(0, nullptr));
    REQUIRE(store.num_slots() == 40);
    auto stream = static_cast<cudaStream_t>(cuda_compute_stream(store.device()));

    PackHashes expect(path, *o.objects);

    // The "kernel": copies the first expert of each acquire on the compute stream.
    constexpr int kScratch = 4;
    void *scratch[kScratch];
    for (auto &s : scratch) cuda_ok(cudaMalloc(&s, spec.object_bytes), "cudaMalloc scratch");
    std::pair<uint32_t, uint32_t> scratch_key[kScratch];
    std::vector<std::byte> host(spec.object_bytes);

    std::mt19937 rng(2024);
    uint64_t unique_total = 0;
    for (int i = 0; i < acquires; ++i) {
      const uint32_t layer = rng() % spec.num_layers;
      const uint32_t tokens = 1 + rng() % 4;
      std::vector<uint32_t> ids;
      for (uint32_t k = 0; k < 6 * tokens; ++k) ids.push_back(rng() % spec.num_experts);
      unique_total += std::set<uint32_t>(ids.begin(), ids.end()).size();
      Acquisition a = store.acquire(layer, ids);

      // The device table holds the same pointers, in id order.
      std::vector<const void *> table(ids.size());
      cuda_ok(cudaMemcpyAsync(table.data(), a.device_table, ids.size() * sizeof(void *), cudaMemcpyDeviceToHost, stream),
              "table D2H");
      cuda_ok(cudaMemcpyAsync(scratch[i % kScratch], a.pointers[0], spec.object_bytes, cudaMemcpyDeviceToDevice, stream),
              "kernel stand-in");
      scratch_key[i % kScratch] = {layer, ids[0]};
      store.release(a);
      cuda_ok(cudaStreamSynchronize(stream), "sync");
      for (std::size_t k = 0; k < ids.size(); ++k) CHECK(table[k] == a.pointers[k]);
      if (i % kScratch == kScratch - 1) {
        for (int s = 0; s < kScratch; ++s) {
          cuda_ok(cudaMemcpy(host.data(), scratch[s], host.size(), cudaMemcpyDeviceToHost), "scratch D2H");
          CHECK(XXH3_64bits(host.data(), host.size()) == expect(scratch_key[s].first, scratch_key[s].second));
        }
      }
      if (i % 50 == 49 || i == acquires - 1) {
        for (const auto &r : store.resident()) {
          store.read_slot(r.slot, host.data(), host.size());
          CHECK(XXH3_64bits(host.data(), host.size()) == expect(r.layer, r.expert));
        }
      }
    }
    for (auto &s : scratch) cudaFree(s);
    const StoreStats s = store.stats();
    std::printf("store_gpu_test [%s]: %llu acquires, hits %llu, misses %llu, evictions %llu, read %.2f GiB in %.2f s "
                "(%.2f GB/s), h2d %.2f GiB, io_errors %llu, fallback %llu, reader %s%s\n",
                policy.c_str(), (unsigned long long)s.acquires, (unsigned long long)s.cache_hits,
                (unsigned long long)s.cache_misses, (unsigned long long)s.cache_evictions,
                static_cast<double>(s.pack_read_bytes) / (1ull << 30), static_cast<double>(s.pack_read_ns) / 1e9,
                s.pack_read_ns ? static_cast<double>(s.pack_read_bytes) / static_cast<double>(s.pack_read_ns) : 0.0,
                static_cast<double>(s.h2d_bytes) / (1ull << 30), (unsigned long long)s.io_errors,
                (unsigned long long)s.fallback_count, std::string(store.reader().backend_name()).c_str(),
                store.reader().direct() ? " O_DIRECT" : " buffered");
    CHECK(s.cache_hits + s.cache_misses == unique_total);
    CHECK(s.pack_reads == s.cache_misses);
    CHECK(s.h2d_bytes == s.cache_misses * spec.object_bytes);
    CHECK(s.resident_experts == 40);
    CHECK(s.io_errors == 0);
  }
}

TEST_CASE("host tier, staged acquires and prefetch on the CUDA device: every copy sees the right bytes", "[store][gpu][tiers]") {
  // A smaller pack of its own: 40 slots in VRAM, 40 in pinned host memory, hints for the next
  // layer, acquires that return before their reads landed. The stand-in kernel copies each
  // expert on the compute stream as soon as wait_ready() hands it out (and the ready ones at
  // once), without synchronising, for 4 acquires in a row: the ready / last_use / demoted /
  // host-slot events must order every copy.
  const uint64_t pack_bytes = parse_size(env_or("EP_STORE_GPU_TIER_PACK_BYTES", "4G"));
  const uint64_t object_bytes = parse_size(env_or("EP_STORE_GPU_OBJECT_BYTES", "13369344"));
  const std::string path =
      env_or("EP_STORE_GPU_TIER_PACK", (std::filesystem::current_path() / "store_gpu_tier_test.pack").string());
  const SyntheticPackSpec spec = SyntheticPackSpec::for_size(pack_bytes, object_bytes, 32, 9);
  create_synthetic_pack(path, spec, std::max(4u, std::thread::hardware_concurrency()));
  StoreOptions o;
  o.pack_path = path;
  o.objects = spec.object_map();
  o.top_k = 6;
  o.cache_bytes = 40 * spec.stride();
  o.host_cache_bytes = 40 * spec.stride();
  o.prefetch = true;
  o.staging_slots = 12;
  o.table_ids = 6;
  ExpertStore store(o, make_cuda_device(0, nullptr));
  REQUIRE(store.num_host_slots() == 40);
  auto stream = static_cast<cudaStream_t>(cuda_compute_stream(store.device()));
  PackHashes expect(path, *o.objects);
  constexpr int kRound = 4;
  std::vector<void *> scratch(kRound * 6);
  for (auto &s : scratch) cuda_ok(cudaMalloc(&s, spec.object_bytes), "cudaMalloc scratch");
  std::vector<std::pair<uint32_t, uint32_t>> scratch_key(scratch.size());
  std::vector<std::byte> host(spec.object_bytes);
  std::mt19937 rng(77);
  // Skewed routing (a few hot experts per layer) so that the host tier serves hits.
  std::vector<double> w(spec.num_experts);
  for (uint32_t e = 0; e < w.size(); ++e) w[e] = 1.0 / (e + 1.0);
  std::discrete_distribution<uint32_t> pick(w.begin(), w.end());
  const int acquires = std::atoi(env_or("EP_STORE_GPU_ACQUIRES", "200").c_str());
  for (int i = 0; i < acquires; ++i) {
    const uint32_t layer = static_cast<uint32_t>(i) % spec.num_layers;
    std::vector<uint32_t> ids;
    for (int k = 0; k < 6; ++k) ids.push_back(pick(rng));
    Acquisition a = store.acquire(layer, ids, {}, /*staged=*/true);
    const int base = (i % kRound) * 6;
    auto copy = [&](size_t k) {
      cuda_ok(cudaMemcpyAsync(scratch[base + k], a.pointers[k], spec.object_bytes, cudaMemcpyDeviceToDevice, stream), "kernel");
      scratch_key[base + k] = {layer, ids[k]};
    };
    for (size_t k = 0; k < ids.size(); ++k)
      if (a.ready[k]) copy(k);
    // The next layer's likely experts, while this one's reads are in flight.
    std::vector<uint32_t> guess;
    for (int k = 0; k < 6; ++k) guess.push_back(pick(rng));
    store.hint((layer + 1) % spec.num_layers, guess);
    while (a.pending > 0)
      for (uint32_t e : store.wait_ready(a))
        for (size_t k = 0; k < ids.size(); ++k)
          if (ids[k] == e) copy(k);
    store.release(a);
    if (i % kRound == kRound - 1) {
      cuda_ok(cudaStreamSynchronize(stream), "sync");
      for (size_t s = 0; s < scratch.size(); ++s) {
        cuda_ok(cudaMemcpy(host.data(), scratch[s], host.size(), cudaMemcpyDeviceToHost), "scratch D2H");
        CHECK(XXH3_64bits(host.data(), host.size()) == expect(scratch_key[s].first, scratch_key[s].second));
      }
    }
  }
  store.device().synchronize();
  for (const auto &r : store.resident()) {
    store.read_slot(r.slot, host.data(), host.size());
    CHECK(XXH3_64bits(host.data(), host.size()) == expect(r.layer, r.expert));
  }
  for (const auto &r : store.host_resident()) {
    store.read_host_slot(r.slot, host.data(), host.size());
    CHECK(XXH3_64bits(host.data(), host.size()) == expect(r.layer, r.expert));
  }
  for (auto &s : scratch) cudaFree(s);
  const StoreStats s = store.stats();
  std::printf("store_gpu_test [tiers]: %llu acquires, hits %llu, misses %llu (host %llu), demotions %llu, prefetch %llu/%llu, "
              "read %.2f GiB\n",
              (unsigned long long)s.acquires, (unsigned long long)s.cache_hits, (unsigned long long)s.cache_misses,
              (unsigned long long)s.host_hits, (unsigned long long)s.demotions, (unsigned long long)s.prefetch_issued,
              (unsigned long long)s.prefetch_used, static_cast<double>(s.pack_read_bytes) / (1ull << 30));
  CHECK(s.demotions > 0);
  CHECK(s.host_hits > 0);
  CHECK(s.prefetch_issued > 0);
  CHECK(s.cache_misses == s.host_hits + s.host_misses);
  CHECK(s.pack_reads <= s.host_misses + s.prefetch_issued);
  CHECK(s.io_errors == 0);
}
