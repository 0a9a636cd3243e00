// The expert store for other engines (include/expertpack/experts.h) in host memory: for a GGUF
// read without a pack, for the pack built from it and for a safetensors checkpoint, the bytes of
// every acquired role equal the source tensor's slice for that (layer, expert), through evictions
// and the host tier (caches of top_k slots); the layout matches the source's tensors; refusals
// name what is wrong: bad ids and layers, too many distinct experts, a stream in host memory, a
// full cache of pinned experts, a hint without prefetch, a lease of a closed store.
#include "experts_support.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

#include "format/gguf.hpp"
#include "format/safetensors.hpp"
#include "testkit/checkpoint.hpp"

#include <expertpack/expertpack.h>

#include <cstring>
#include <functional>
#include <memory>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using ep::test::TempDir;
using namespace ep::test::experts;

/// A safetensors checkpoint with one tensor per expert and role.
SliceFn safetensors_slices(const std::string &file) {
  auto st = std::make_shared<ep::format::SafetensorsFile>(ep::format::SafetensorsFile::open(file));
  return [st, file](uint32_t block, uint32_t expert, int role) {
    static const char *names[3] = {"gate_proj", "up_proj", "down_proj"};
    const std::string name =
        "model.layers." + std::to_string(block) + ".mlp.experts." + std::to_string(expert) + "." + names[role] + ".weight";
    const auto *t = st->find(name);
    INFO(name);
    REQUIRE(t);
    return Slice{file, t->file_offset, t->nbytes};
  };
}

struct Store {
  ep_experts *x = nullptr;
  ~Store() { ep_experts_close(x); }
};

ep_experts_options host_options(const std::string &pack_dir, uint64_t cache_bytes, uint64_t host_bytes, int no_pack,
                                uint32_t top_k = 0) {
  ep_experts_options o;
  ep_experts_options_init(&o);
  o.top_k = top_k;
  o.device = EP_DEVICE_CPU;
  o.pack_dir = pack_dir.c_str();
  o.cache_budget_bytes = cache_bytes;
  o.host_cache_bytes = host_bytes;
  o.no_pack = no_pack;
  return o;
}

void open_ok(Store &s, const std::string &path, const ep_experts_options &o) {
  const ep_status st = ep_experts_open(&s.x, path.c_str(), &o);
  INFO(path << ": " << (st == EP_OK ? "" : ep_last_error()));
  REQUIRE(st == EP_OK);
  REQUIRE(s.x);
}

ep_experts_properties info(const ep_experts *x) {
  ep_experts_properties p;
  ep_experts_properties_init(&p);
  REQUIRE(ep_experts_info(&p, x) == EP_OK);
  return p;
}

/// Acquires @p ids of @p layer, checks every role of every id against the source, releases.
void acquire_and_check(ep_experts *x, uint32_t layer, const std::vector<int32_t> &ids, const SliceFn &slice) {
  const ep_experts_properties p = info(x);
  ep_experts_layer_layout lay;
  ep_experts_layer_layout_init(&lay);
  REQUIRE(ep_experts_layout(&lay, x, layer) == EP_OK);
  ep_experts_lease *lease = nullptr;
  const ep_status st = ep_experts_acquire(&lease, x, layer, ids.data(), ids.size(), nullptr);
  INFO("layer " << layer << ": " << (st == EP_OK ? "" : ep_last_error()));
  REQUIRE(st == EP_OK);
  ep_experts_lease_properties li;
  ep_experts_lease_properties_init(&li);
  REQUIRE(ep_experts_lease_info(&li, lease) == EP_OK);
  REQUIRE(li.layer == layer);
  REQUIRE(li.n_ids == ids.size());
  // A device table for up to max_table_ids ids (host memory: the same addresses as roles).
  REQUIRE((li.device_table != nullptr) == (ids.size() <= p.max_table_ids));
  for (size_t i = 0; i < ids.size(); ++i) {
    CHECK(li.ids[i] == ids[i]);
    for (int r = 0; r < EP_EXPERT_ROLES; ++r) {
      const void *role = li.roles[static_cast<size_t>(r) * ids.size() + i];
      CHECK(role == static_cast<const uint8_t *>(li.objects[i]) + lay.roles[r].offset);
      REQUIRE(li.slots[i] < p.cache_slots);
      CHECK(li.objects[i] == reinterpret_cast<const uint8_t *>(p.slots_address) + li.slots[i] * p.slot_bytes);
      if (li.device_table) CHECK(li.device_table[static_cast<size_t>(r) * ids.size() + i] == role);
      const Slice s = slice(p.first_layer + layer, static_cast<uint32_t>(ids[i]), r);
      REQUIRE(s.bytes == lay.roles[r].bytes);
      const std::vector<uint8_t> want = read_range(s.file, s.offset, s.bytes);
      INFO("layer " << layer << " expert " << ids[i] << " role " << r);
      CHECK(std::memcmp(role, want.data(), want.size()) == 0);
    }
  }
  REQUIRE(ep_experts_release(lease, nullptr) == EP_OK);
}

ep_store_stats stats(const ep_experts *x) {
  ep_store_stats s;
  ep_store_stats_init(&s);
  REQUIRE(ep_experts_stats(&s, x) == EP_OK);
  return s;
}

/// Every expert of every layer, twice, in pairs, through a cache of top_k slots and a host tier
/// of two experts: misses, evictions, demotions and host-tier hits all happen, and every role's
/// bytes are the source's each time.
void sweep(ep_experts *x, const SliceFn &slice) {
  const ep_experts_properties p = info(x);
  REQUIRE(p.num_layers == kLayers);
  REQUIRE(p.num_experts == kExperts);
  REQUIRE(p.top_k == kTopK);
  REQUIRE(p.cache_slots == kTopK);
  REQUIRE(p.max_experts_per_acquire == kTopK);
  REQUIRE(p.device == EP_DEVICE_CPU);
  REQUIRE(p.device_index == -1);
  for (int round = 0; round < 3; ++round)
    for (uint32_t l = 0; l < kLayers; ++l)
      for (int32_t e = 0; e + 1 < static_cast<int32_t>(kExperts); e += 2) {
        if (round == 1) acquire_and_check(x, l, {e + 1, e, e + 1, e}, slice);  // repeats: one read each, no table
        else acquire_and_check(x, l, {e + 1, e}, slice);
      }
  // Experts asked for again right after their eviction come back from the host tier.
  for (int k = 0; k < 3; ++k) acquire_and_check(x, 0, k == 1 ? std::vector<int32_t>{2, 3} : std::vector<int32_t>{0, 1}, slice);
  const ep_store_stats s = stats(x);
  CHECK(s.acquires == 3 * kLayers * kExperts / 2 + 3);
  CHECK(s.cache_misses > 0);
  CHECK(s.cache_evictions > 0);
  CHECK(s.demotions > 0);
  CHECK(s.host_hits > 0);
  CHECK(s.cache_hits + s.cache_misses == 3 * kLayers * kExperts + 6);
}

/// The layout agrees with the source's tensors (types, shapes, whole rows, roles in order).
void check_layout(ep_experts *x, ep_experts_layer_layout *out_first = nullptr) {
  for (uint32_t l = 0; l < kLayers; ++l) {
    ep_experts_layer_layout lay;
    ep_experts_layer_layout_init(&lay);
    REQUIRE(ep_experts_layout(&lay, x, l) == EP_OK);
    CHECK(lay.layer == l);
    CHECK(lay.num_experts == kExperts);
    CHECK(lay.num_roles == 3);
    CHECK(lay.roles[EP_EXPERT_ROLE_GATE].ne[0] == 256);
    CHECK(lay.roles[EP_EXPERT_ROLE_GATE].ne[1] == 128);
    CHECK(lay.roles[EP_EXPERT_ROLE_UP].ne[0] == 256);
    CHECK(lay.roles[EP_EXPERT_ROLE_DOWN].ne[0] == 128);
    CHECK(lay.roles[EP_EXPERT_ROLE_DOWN].ne[1] == 256);
    CHECK(lay.roles[EP_EXPERT_ROLE_GATE].offset == 0);
    CHECK(lay.roles[EP_EXPERT_ROLE_UP].offset >= lay.roles[EP_EXPERT_ROLE_GATE].bytes);
    CHECK(lay.roles[EP_EXPERT_ROLE_DOWN].offset >= lay.roles[EP_EXPERT_ROLE_UP].offset + lay.roles[EP_EXPERT_ROLE_UP].bytes);
    CHECK(lay.object_bytes == lay.roles[EP_EXPERT_ROLE_DOWN].offset + lay.roles[EP_EXPERT_ROLE_DOWN].bytes);
    for (const auto &r : lay.roles) {
      CHECK(r.n_dims == 2);
      CHECK(r.bytes == r.row_bytes * r.ne[1]);
      CHECK(r.offset % 256 == 0);
    }
    if (out_first && l == 0) *out_first = lay;
  }
}

std::string error_after(ep_status got, ep_status want) {
  CHECK(got == want);
  return got == EP_OK ? std::string() : std::string(ep_last_error());
}

}  // namespace

TEST_CASE("experts: a GGUF read without a pack gives each role's source bytes, through evictions and the host tier",
          "[capi][experts]") {
  TempDir dir;
  const std::string gguf = dir / "model.gguf";
  ep::testkit::write_synthetic_gguf(spec(ep::format::GgmlType::q8_0), gguf);
  const std::string packs = dir / "packs";
  // Cache: top_k experts; host tier: two more.
  Store probe;
  open_ok(probe, gguf, host_options(packs, 0, 0, 1));
  const uint64_t slot = info(probe.x).slot_bytes;
  CHECK(fs::path(ep_experts_pack_path(probe.x)).extension() == ".epx");
  ep_experts_layer_layout first;
  check_layout(probe.x, &first);
  CHECK(first.roles[EP_EXPERT_ROLE_GATE].ggml_type == 8);  // Q8_0, as the GGUF has it
  ep_experts_close(probe.x);
  probe.x = nullptr;

  Store s;
  open_ok(s, gguf, host_options(packs, kTopK * slot, 2 * slot, 1));
  CHECK(info(s.x).host_slots == 2);
  sweep(s.x, gguf_slices(gguf));
}

TEST_CASE("experts: the pack built from a GGUF, found for the source or given itself, gives the source's bytes",
          "[capi][experts]") {
  TempDir dir;
  const std::string gguf = dir / "model.gguf";
  ep::testkit::write_synthetic_gguf(spec(ep::format::GgmlType::mxfp4), gguf);
  const std::string packs = dir / "packs";
  uint64_t done = 0;
  ep_experts_options o = host_options(packs, 0, 0, 0);
  o.progress = [](uint64_t d, uint64_t, void *payload) { *static_cast<uint64_t *>(payload) = d; };
  o.progress_payload = &done;
  Store built;
  open_ok(built, gguf, o);
  CHECK(done > 0);  // the pack was built now, with progress
  const std::string pack = ep_experts_pack_path(built.x);
  CHECK(fs::path(pack).extension() == ".epk");
  ep_experts_layer_layout lay;
  check_layout(built.x, &lay);
  CHECK(lay.roles[EP_EXPERT_ROLE_DOWN].ggml_type == 39);  // MXFP4
  const uint64_t slot = info(built.x).slot_bytes;
  ep_experts_close(built.x);
  built.x = nullptr;

  Store s;
  open_ok(s, pack, host_options(packs, kTopK * slot, 2 * slot, 0));
  sweep(s.x, gguf_slices(gguf));
  // The addresses ep_pack_object() gives in the file hold the same bytes (the pack is the layout).
  ep_pack *pk = nullptr;
  REQUIRE(ep_pack_open(&pk, pack.c_str(), nullptr) == EP_OK);
  ep_pack_object_info obj;
  REQUIRE(ep_pack_object(&obj, pk, 1, 3) == EP_OK);
  ep_experts_layer_layout l1;
  ep_experts_layer_layout_init(&l1);
  REQUIRE(ep_experts_layout(&l1, s.x, 1) == EP_OK);
  for (int r = 0; r < 3; ++r) {
    CHECK(obj.role_offset[r] - obj.offset == l1.roles[r].offset);
    CHECK(obj.role_bytes[r] == l1.roles[r].bytes);
    CHECK(obj.role_ggml_type[r] == l1.roles[r].ggml_type);
  }
  ep_pack_close(pk);
}

TEST_CASE("experts: a safetensors checkpoint read without a pack gives each expert's tensor bytes", "[capi][experts]") {
  TempDir dir;
  const std::string file =
      ep::testkit::write_synthetic_safetensors(spec(ep::format::GgmlType::bf16), dir / "ckpt", ep::testkit::StLayout::per_expert);
  Store probe;
  ep_experts *x = nullptr;  // the checkpoint has no config.json: no top_k
  const std::string packs = dir / "packs";
  const ep_experts_options no_top_k = host_options(packs, 0, 0, 1);
  const std::string e = error_after(ep_experts_open(&x, file.c_str(), &no_top_k), EP_ERR_INVALID_ARGUMENT);
  CHECK(e.find("records no top_k") != std::string::npos);
  open_ok(probe, file, host_options(dir / "packs", 0, 0, 1, kTopK));
  const uint64_t slot = info(probe.x).slot_bytes;
  ep_experts_layer_layout lay;
  ep_experts_layer_layout_init(&lay);
  REQUIRE(ep_experts_layout(&lay, probe.x, 0) == EP_OK);
  CHECK(lay.roles[EP_EXPERT_ROLE_UP].ggml_type == 30);  // BF16
  ep_experts_close(probe.x);
  probe.x = nullptr;
  Store s;
  open_ok(s, file, host_options(dir / "packs", kTopK * slot, 2 * slot, 1, kTopK));
  sweep(s.x, safetensors_slices(file));
}

TEST_CASE("experts: refusals name what is wrong", "[capi][experts]") {
  TempDir dir;
  const std::string gguf = dir / "model.gguf";
  ep::testkit::write_synthetic_gguf(spec(ep::format::GgmlType::q8_0), gguf);
  const std::string packs = dir / "packs";
  ep_experts_options o = host_options(packs, 0, 0, 1);
  Store s;
  open_ok(s, gguf, o);
  const uint64_t slot = info(s.x).slot_bytes;
  ep_experts_close(s.x);
  s.x = nullptr;
  open_ok(s, gguf, host_options(packs, kTopK * slot, 0, 1));
  ep_experts_lease *lease = nullptr;

  SECTION("ids and layers") {
    const int32_t bad[] = {1, 6};
    std::string e = error_after(ep_experts_acquire(&lease, s.x, 0, bad, 2, nullptr), EP_ERR_INVALID_ARGUMENT);
    CHECK(e.find("ep_experts_acquire") != std::string::npos);
    CHECK(e.find("expert id 6 at position 1 is outside 0..5") != std::string::npos);
    CHECK(lease == nullptr);
    const int32_t negative[] = {-1};
    e = error_after(ep_experts_acquire(&lease, s.x, 1, negative, 1, nullptr), EP_ERR_INVALID_ARGUMENT);
    CHECK(e.find("expert id -1 at position 0") != std::string::npos);
    const int32_t ok[] = {0};
    e = error_after(ep_experts_acquire(&lease, s.x, 2, ok, 1, nullptr), EP_ERR_INVALID_ARGUMENT);
    CHECK(e.find("layer 2 out of range (the store has 2 layers)") != std::string::npos);
    e = error_after(ep_experts_acquire(&lease, s.x, 0, ok, 0, nullptr), EP_ERR_INVALID_ARGUMENT);
    CHECK(e.find("n_ids is 0") != std::string::npos);
    const int32_t three[] = {0, 1, 2};
    e = error_after(ep_experts_acquire(&lease, s.x, 0, three, 3, nullptr), EP_ERR_INVALID_ARGUMENT);
    CHECK(e.find("3 distinct experts") != std::string::npos);
    ep_experts_layer_layout lay;
    ep_experts_layer_layout_init(&lay);
    e = error_after(ep_experts_layout(&lay, s.x, 7), EP_ERR_INVALID_ARGUMENT);
    CHECK(e.find("layer 7 out of range") != std::string::npos);
    e = error_after(ep_experts_hint(s.x, 0, ok, 1), EP_ERR_INVALID_ARGUMENT);
    CHECK(e.find("without prefetch") != std::string::npos);
    int stream = 0;
    e = error_after(ep_experts_acquire(&lease, s.x, 0, ok, 1, &stream), EP_ERR_INVALID_ARGUMENT);
    CHECK(e.find("host memory (pass NULL)") != std::string::npos);
    CHECK(stats(s.x).acquires == 0);  // nothing was acquired by any of these
  }

  SECTION("pinned experts are never evicted: a full cache refuses, a release makes room") {
    const int32_t a[] = {0, 1}, b[] = {2};
    REQUIRE(ep_experts_acquire(&lease, s.x, 0, a, 2, nullptr) == EP_OK);
    ep_experts_lease *other = nullptr;
    const std::string e = error_after(ep_experts_acquire(&other, s.x, 0, b, 1, nullptr), EP_ERR_BUDGET);
    CHECK(e.find("no slot to evict for expert 2") != std::string::npos);
    CHECK(other == nullptr);
    REQUIRE(ep_experts_release(lease, nullptr) == EP_OK);
    REQUIRE(ep_experts_acquire(&other, s.x, 0, b, 1, nullptr) == EP_OK);
    CHECK(ep_experts_release(other, nullptr) == EP_OK);
  }

  SECTION("a stream given at release in host memory is refused, and the experts are released all the same") {
    const int32_t a[] = {0, 1}, b[] = {2, 3};
    REQUIRE(ep_experts_acquire(&lease, s.x, 0, a, 2, nullptr) == EP_OK);
    int stream = 0;
    const std::string e = error_after(ep_experts_release(lease, &stream), EP_ERR_INVALID_ARGUMENT);
    CHECK(e.find("host memory (pass NULL)") != std::string::npos);
    REQUIRE(ep_experts_acquire(&lease, s.x, 0, b, 2, nullptr) == EP_OK);
    CHECK(ep_experts_release(lease, nullptr) == EP_OK);
  }

  SECTION("a lease of a closed store") {
    const int32_t a[] = {4};
    REQUIRE(ep_experts_acquire(&lease, s.x, 1, a, 1, nullptr) == EP_OK);
    ep_experts_close(s.x);
    s.x = nullptr;
    ep_experts_lease_properties li;
    ep_experts_lease_properties_init(&li);
    std::string e = error_after(ep_experts_lease_info(&li, lease), EP_ERR_INVALID_ARGUMENT);
    CHECK(e.find("store was closed") != std::string::npos);
    e = error_after(ep_experts_release(lease, nullptr), EP_ERR_INVALID_ARGUMENT);
    CHECK(e.find("ep_experts_release: the lease's expert store was closed") != std::string::npos);
  }

  SECTION("arguments and options") {
    CHECK(ep_experts_release(nullptr, nullptr) == EP_OK);
    ep_experts_close(nullptr);
    CHECK(ep_experts_pack_path(nullptr) == nullptr);
    ep_experts *x = nullptr;
    std::string e = error_after(ep_experts_open(&x, (dir / "none.gguf").c_str(), &o), EP_ERR_NOT_FOUND);
    CHECK(e.find("none.gguf") != std::string::npos);
    ep_experts_options bad = o;
    bad.stats_every = 4;
    e = error_after(ep_experts_open(&x, gguf.c_str(), &bad), EP_ERR_INVALID_ARGUMENT);
    CHECK(e.find("stats_every 4 without stats_path") != std::string::npos);
    bad = o;
    bad.prefetch = 2;
    e = error_after(ep_experts_open(&x, gguf.c_str(), &bad), EP_ERR_INVALID_ARGUMENT);
    CHECK(e.find("prefetch 2 (expected 0 or 1)") != std::string::npos);
    bad = o;
    bad.struct_size = 8;
    error_after(ep_experts_open(&x, gguf.c_str(), &bad), EP_ERR_STRUCT_SIZE);
    bad = o;
    bad.cache_budget_bytes = slot;  // one slot; an acquire may need top_k
    e = error_after(ep_experts_open(&x, gguf.c_str(), &bad), EP_ERR_BUDGET);
    CHECK(e.find("budget") != std::string::npos);
    CHECK(x == nullptr);
  }
}

TEST_CASE("experts: hints prefetch with the option, and the counters reach a statistics file", "[capi][experts]") {
  TempDir dir;
  const std::string gguf = dir / "model.gguf";
  ep::testkit::write_synthetic_gguf(spec(ep::format::GgmlType::q8_0), gguf);
  const std::string stats_file = dir / "stats.json";
  const std::string packs = dir / "packs";
  ep_experts_options o = host_options(packs, 0, 0, 1);
  o.prefetch = 1;
  o.tokens_per_acquire = 0;  // as many as the cache holds: every expert here
  o.stats_path = stats_file.c_str();
  o.stats_every = 1;
  Store s;
  open_ok(s, gguf, o);
  const ep_experts_properties p = info(s.x);
  CHECK(p.max_experts_per_acquire == kExperts);
  CHECK(p.tokens_per_acquire == kExperts / kTopK);
  const int32_t next[] = {3, 5};
  REQUIRE(ep_experts_hint(s.x, 1, next, 2) == EP_OK);
  acquire_and_check(s.x, 1, {5, 3}, gguf_slices(gguf));
  const ep_store_stats st = stats(s.x);
  CHECK(st.prefetch_issued == 2);
  CHECK(st.prefetch_used == 2);
  CHECK(st.cache_hits == 2);
  CHECK(st.cache_misses == 0);
  ep_store_stats f;
  ep_store_stats_init(&f);
  REQUIRE(ep_store_stats_read_file(&f, stats_file.c_str()) == EP_OK);
  CHECK(f.acquires == 1);
  CHECK(f.prefetch_used == 2);
}
