// The expert store for other engines (include/expertpack/experts.h) in device memory: acquires
// on a stream of the test's own, each followed on that stream by copies of every role (and of
// the device table) to pinned host memory, then released on it — with no synchronisation until
// the end, through a cache of top_k slots and a host tier. The copies must see every role's
// source bytes: the stream waited for the store's copies into the slots, and the store waited
// for the stream before it overwrote a slot. The same on the legacy default stream (NULL).
#include "experts_support.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

#include <expertpack/expertpack.h>

#include <cuda_runtime.h>

#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace ep::test::experts;
using ep::test::TempDir;

void cuda_ok(cudaError_t e, const char *what) {
  INFO(what << ": " << cudaGetErrorString(e));
  REQUIRE(e == cudaSuccess);
}

struct Pinned {
  void *p = nullptr;
  explicit Pinned(size_t bytes) { cuda_ok(cudaMallocHost(&p, bytes), "cudaMallocHost"); }
  ~Pinned() { cudaFreeHost(p); }
  Pinned(const Pinned &) = delete;
  Pinned &operator=(const Pinned &) = delete;
};

struct Copied {
  uint32_t layer = 0;
  int32_t id = 0;
  int role = 0;
  std::unique_ptr<Pinned> bytes;
  uint64_t size = 0;
};

ep_experts *open_cuda(const std::string &path, const std::string &packs, int no_pack, uint64_t cache, uint64_t host) {
  ep_experts_options o;
  ep_experts_options_init(&o);
  o.device = EP_DEVICE_CUDA;
  o.device_index = 0;
  o.pack_dir = packs.c_str();
  o.no_pack = no_pack;
  o.cache_budget_bytes = cache;
  o.host_cache_bytes = host;
  ep_experts *x = nullptr;
  const ep_status st = ep_experts_open(&x, path.c_str(), &o);
  INFO(path << ": " << (st == EP_OK ? "" : ep_last_error()));
  REQUIRE(st == EP_OK);
  return x;
}

/// The sweep of experts_capi_test on @p stream: every acquire's roles copied on the stream,
/// checked against the source only after the last release.
void sweep_on_stream(ep_experts *x, cudaStream_t stream, const SliceFn &slice) {
  ep_experts_properties p;
  ep_experts_properties_init(&p);
  REQUIRE(ep_experts_info(&p, x) == EP_OK);
  REQUIRE(p.device == EP_DEVICE_CUDA);
  REQUIRE(p.cache_slots == kTopK);
  std::vector<Copied> copies;
  std::vector<std::pair<std::unique_ptr<Pinned>, std::vector<const void *>>> tables;
  auto acquire = [&](uint32_t layer, const std::vector<int32_t> &ids) {
    ep_experts_layer_layout lay;
    ep_experts_layer_layout_init(&lay);
    REQUIRE(ep_experts_layout(&lay, x, layer) == EP_OK);
    ep_experts_lease *lease = nullptr;
    const ep_status st = ep_experts_acquire(&lease, x, layer, ids.data(), ids.size(), stream);
    INFO((st == EP_OK ? "" : ep_last_error()));
    REQUIRE(st == EP_OK);
    ep_experts_lease_properties li;
    ep_experts_lease_properties_init(&li);
    REQUIRE(ep_experts_lease_info(&li, lease) == EP_OK);
    for (size_t i = 0; i < ids.size(); ++i)
      for (int r = 0; r < EP_EXPERT_ROLES; ++r) {
        Copied c;
        c.layer = layer;
        c.id = ids[i];
        c.role = r;
        c.size = lay.roles[r].bytes;
        c.bytes = std::make_unique<Pinned>(c.size);
        cuda_ok(cudaMemcpyAsync(c.bytes->p, li.roles[static_cast<size_t>(r) * ids.size() + i], c.size, cudaMemcpyDeviceToHost,
                                stream),
                "cudaMemcpyAsync(role)");
        copies.push_back(std::move(c));
      }
    REQUIRE(li.device_table);
    const size_t n = EP_EXPERT_ROLES * ids.size();
    auto table = std::make_unique<Pinned>(n * sizeof(void *));
    cuda_ok(cudaMemcpyAsync(table->p, li.device_table, n * sizeof(void *), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync(table)");
    tables.emplace_back(std::move(table), std::vector<const void *>(li.roles, li.roles + n));
    REQUIRE(ep_experts_release(lease, stream) == EP_OK);
  };
  for (int round = 0; round < 3; ++round)
    for (uint32_t l = 0; l < kLayers; ++l)
      for (int32_t e = 0; e + 1 < static_cast<int32_t>(kExperts); e += 2) acquire(l, {e + 1, e});
  for (int k = 0; k < 3; ++k) acquire(0, k == 1 ? std::vector<int32_t>{2, 3} : std::vector<int32_t>{0, 1});
  cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  for (const Copied &c : copies) {
    const Slice s = slice(p.first_layer + c.layer, static_cast<uint32_t>(c.id), c.role);
    REQUIRE(s.bytes == c.size);
    const std::vector<uint8_t> want = read_range(s.file, s.offset, s.bytes);
    INFO("layer " << c.layer << " expert " << c.id << " role " << c.role);
    CHECK(std::memcmp(c.bytes->p, want.data(), want.size()) == 0);
  }
  for (const auto &[table, roles] : tables)
    CHECK(std::memcmp(table->p, roles.data(), roles.size() * sizeof(void *)) == 0);
  ep_store_stats s;
  ep_store_stats_init(&s);
  REQUIRE(ep_experts_stats(&s, x) == EP_OK);
  CHECK(s.cache_evictions > 0);
  CHECK(s.demotions > 0);
  CHECK(s.host_hits > 0);
}

uint64_t slot_bytes(const std::string &path, const std::string &packs, int no_pack) {
  ep_experts *x = open_cuda(path, packs, no_pack, 0, 0);
  ep_experts_properties p;
  ep_experts_properties_init(&p);
  REQUIRE(ep_experts_info(&p, x) == EP_OK);
  ep_experts_close(x);
  return p.slot_bytes;
}

}  // namespace

TEST_CASE("experts on CUDA: a caller's stream sees every role's source bytes in stream order", "[gpu][experts]") {
  TempDir dir;
  const std::string gguf = dir / "model.gguf";
  ep::testkit::write_synthetic_gguf(spec(ep::format::GgmlType::mxfp4), gguf);
  const std::string packs = dir / "packs";
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  for (int no_pack : {1, 0}) {
    INFO("no_pack " << no_pack);
    const uint64_t slot = slot_bytes(gguf, packs, no_pack);
    ep_experts *x = open_cuda(gguf, packs, no_pack, kTopK * slot, 2 * slot);
    sweep_on_stream(x, stream, gguf_slices(gguf));
    ep_experts_close(x);
  }
  // The legacy default stream.
  const uint64_t slot = slot_bytes(gguf, packs, 0);
  ep_experts *x = open_cuda(gguf, packs, 0, kTopK * slot, 2 * slot);
  sweep_on_stream(x, nullptr, gguf_slices(gguf));
  ep_experts_close(x);
  cudaStreamDestroy(stream);
}
