// DeepSeek-V4 with its routed experts served from an Expert Pack through the ExpertStore
// (host-memory device): the oracle goldens through the pack path (GGUF and safetensors
// sources); bit-identical logits to ResidentExperts with an unlimited cache and with the
// smallest cache the store accepts (forced evictions; stats add up); the pack is built once,
// reused while the source is unchanged and rebuilt (or EP_ERR_STALE) when it changes; the C API.
#include "support/catch.hpp"

#include "backend/cpu_backend.hpp"
#include "core/error.hpp"
#include "support/deepseek_v4_golden.hpp"
#include "model/deepseek_v4.hpp"
#include "experts/packed_experts.hpp"
#include "experts/provider.hpp"
#include "engine/pack_resolution.hpp"
#include "pack/manifest.hpp"
#include "store/stats.hpp"

#include <expertpack/expertpack.h>

#include <sys/stat.h>

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>

using namespace deepseek_v4test;
using ep::experts::PackedExperts;
using ep::experts::PackedExpertsOptions;

namespace {

/// Counts the distinct experts of every acquire, then forwards to the real provider.
class CountingExperts final : public ep::experts::ExpertProvider {
 public:
  explicit CountingExperts(std::unique_ptr<PackedExperts> inner) : inner_(std::move(inner)) {}
  const ep::backend::SlotLayout &layout(int64_t layer) const override { return inner_->layout(layer); }
  bool needs_host_ids() const override { return inner_->needs_host_ids(); }
  ep::backend::ExpertBatch acquire(int64_t layer, const ep::backend::Tensor &ids, const int32_t *host_ids,
                                   std::span<const int32_t> only) override {
    const std::set<int32_t> u = only.empty() ? std::set<int32_t>(host_ids, host_ids + ids.n_elems())
                                             : std::set<int32_t>(only.begin(), only.end());
    unique_keys += u.size();
    max_unique_seen = std::max<uint64_t>(max_unique_seen, u.size());
    ++acquires;
    return inner_->acquire(layer, ids, host_ids, only);
  }
  void release(int64_t layer) override { inner_->release(layer); }
  int64_t max_unique() const override { return inner_->max_unique(); }
  PackedExperts &inner() { return *inner_; }
  uint64_t unique_keys = 0, acquires = 0, max_unique_seen = 0;

 private:
  std::unique_ptr<PackedExperts> inner_;
};

struct PackedModel {
  std::unique_ptr<DeepseekV4Model> model;
  CountingExperts *experts = nullptr;
};

PackedModel open_packed(const std::string &source, const std::string &pack, ep::backend::Backend &be, uint64_t cache_bytes) {
  ep::model::DeepseekV4LoadOptions lo;
  lo.resident_experts = false;
  PackedModel pm;
  pm.model = DeepseekV4Model::open(source, be, lo);
  PackedExpertsOptions po;
  po.store.cache_budget_bytes = cache_bytes;
  po.store.direct_io = 0;
  auto inner = std::make_unique<PackedExperts>(pack, pm.model->expert_shapes(), pm.model->config().n_experts_used, po);
  auto counting = std::make_unique<CountingExperts>(std::move(inner));
  pm.experts = counting.get();
  pm.model->set_experts(std::move(counting));
  return pm;
}

/// Decodes token by token (after a prefill of @p prefill tokens); returns every row.
std::vector<float> run_decode(DeepseekV4Model &m, const std::vector<int32_t> &tokens, size_t prefill) {
  const size_t V = static_cast<size_t>(m.config().vocab);
  ep::model::DeepseekV4State st = m.new_state();
  std::vector<float> out(tokens.size() * V);
  m.forward(tokens.data(), static_cast<int64_t>(prefill), st, out.data());
  for (size_t t = prefill; t < tokens.size(); ++t) m.forward(&tokens[t], 1, st, out.data() + t * V);
  return out;
}

bool bit_identical(const std::vector<float> &a, const std::vector<float> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

ep::engine::PackPlacement placement(const fs::path &dir, bool build = true) {
  ep::engine::PackPlacement p;
  p.pack_dir = dir.string();
  p.build = build;
  return p;
}

struct FileId {
  ino_t ino = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileId &o) const { return ino == o.ino && mtime_ns == o.mtime_ns; }
};

FileId file_id(const std::string &path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return FileId{st.st_ino, static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

ep::Status status_of(const std::function<void()> &f) {
  try {
    f();
  } catch (const ep::Error &e) {
    return e.status();
  }
  return ep::Status::ok;
}

}  // namespace

TEST_CASE("deepseek_v4 pack: goldens through the pack, bit-identical to resident experts", "[model][deepseek_v4][pack]") {
  ep::backend::CpuBackend cpu;
  for (const char *name : kConfigs) {
    const Golden g = load_golden(name);
    const fs::path dir = scratch_dir(std::string("pack_") + name);
    // GGUF source
    const ep::engine::ResolvedModel rm = ep::engine::resolve_model(g.gguf, placement(dir));
    CHECK(rm.built);
    CHECK(fs::path(rm.pack).parent_path() == dir);
    CHECK(fs::exists(ep::pack::manifest_path(rm.pack)));
    PackedModel pm = open_packed(rm.source, rm.pack, cpu, 0);
    const std::vector<float> packed = run_full(*pm.model, g.tokens);
    const Diff d = compare(packed, g.logits);
    std::printf("deepseek_v4 %s GGUF via pack: max|dlogit| %.3g, max|logit| %.4g, ratio %.3g (limit 1e-4)\n", name,
                d.max_abs_diff, d.max_abs_ref, d.rel());
    CHECK(d.rel() <= 1e-4);
    auto resident = DeepseekV4Model::open(g.gguf, cpu);
    CHECK(bit_identical(packed, run_full(*resident, g.tokens)));
    // unlimited cache: every expert read once, never evicted
    const ep::store::StoreStats s = pm.experts->inner().stats();
    CHECK(s.cache_evictions == 0);
    CHECK(s.cache_hits + s.cache_misses == pm.experts->unique_keys);
    CHECK(s.cache_misses <= static_cast<uint64_t>(pm.model->config().n_layers * pm.model->config().n_experts));

    // safetensors source (the checkpoint transformers wrote, rebuilt from the golden GGUF)
    const fs::path ckpt = dir / "checkpoint";
    fs::create_directories(ckpt);
    write_checkpoint(g, ckpt);
    const ep::engine::ResolvedModel rs = ep::engine::resolve_model(ckpt.string(), placement(dir));
    CHECK(rs.built);
    CHECK(rs.pack != rm.pack);
    PackedModel ps = open_packed(rs.source, rs.pack, cpu, 0);
    const Diff ds = compare(run_full(*ps.model, g.tokens), g.logits);
    std::printf("deepseek_v4 %s safetensors via pack: max|dlogit| %.3g, max|logit| %.4g, ratio %.3g (limit 1e-4)\n", name,
                ds.max_abs_diff, ds.max_abs_ref, ds.rel());
    CHECK(ds.rel() <= 1e-4);
    // the pack's manifest names the checkpoint: opening the pack finds the source
    const ep::engine::ResolvedModel rp = ep::engine::resolve_model(rs.pack, placement(dir, false));
    CHECK(fs::path(rp.source) == fs::absolute(ckpt).lexically_normal());
    CHECK_FALSE(rp.built);
    fs::remove_all(dir);
  }
}

TEST_CASE("deepseek_v4 pack: the smallest cache (forced evictions) gives identical logits", "[model][deepseek_v4][pack]") {
  ep::backend::CpuBackend cpu;
  for (const char *name : kConfigs) {
    const Golden g = load_golden(name);
    const fs::path dir = scratch_dir(std::string("evict_") + name);
    const ep::engine::ResolvedModel rm = ep::engine::resolve_model(g.gguf, placement(dir));
    auto resident = DeepseekV4Model::open(g.gguf, cpu);
    const int64_t K = resident->config().n_experts_used, E = resident->config().n_experts, L = resident->config().n_layers;
    const uint64_t min_bytes = PackedExperts::min_cache_bytes(rm.pack, K);
    // one byte less than the minimum is refused with EP_ERR_BUDGET
    CHECK(status_of([&] { open_packed(rm.source, rm.pack, cpu, min_bytes - 1); }) == ep::Status::budget);

    PackedModel small = open_packed(rm.source, rm.pack, cpu, min_bytes);
    PackedModel big = open_packed(rm.source, rm.pack, cpu, 0);
    REQUIRE(small.experts->inner().num_slots() == static_cast<uint32_t>(K));
    CHECK(small.experts->max_unique() == K);
    CHECK(big.experts->inner().num_slots() == static_cast<uint32_t>(E * L));

    const std::vector<float> ref_full = run_full(*resident, g.tokens);
    const std::vector<float> small_full = run_full(*small.model, g.tokens);
    CHECK(bit_identical(small_full, ref_full));
    CHECK(bit_identical(run_full(*big.model, g.tokens), ref_full));
    const Diff d = compare(small_full, g.logits);
    CHECK(d.rel() <= 1e-4);
    // decode, token by token, after a short prefill
    const size_t prefill = 5;
    const std::vector<float> ref_dec = run_decode(*resident, g.tokens, prefill);
    CHECK(bit_identical(run_decode(*small.model, g.tokens, prefill), ref_dec));
    CHECK(bit_identical(run_decode(*big.model, g.tokens, prefill), ref_dec));

    const ep::store::StoreStats s = small.experts->inner().stats();
    std::printf("deepseek_v4 %s, %u slots: %llu acquires, %llu hits, %llu misses, %llu evictions\n", name,
                small.experts->inner().num_slots(), static_cast<unsigned long long>(s.acquires),
                static_cast<unsigned long long>(s.cache_hits), static_cast<unsigned long long>(s.cache_misses),
                static_cast<unsigned long long>(s.cache_evictions));
    CHECK(s.cache_evictions > 0);
    CHECK(s.cache_hits + s.cache_misses == small.experts->unique_keys);
    CHECK(s.acquires == small.experts->acquires);
    CHECK(small.experts->max_unique_seen <= static_cast<uint64_t>(K));
    CHECK(s.resident_experts <= static_cast<uint64_t>(K));
    const ep::store::StoreStats sb = big.experts->inner().stats();
    CHECK(sb.cache_evictions == 0);
    CHECK(sb.cache_hits + sb.cache_misses == big.experts->unique_keys);
    CHECK(s.cache_misses > sb.cache_misses);
    fs::remove_all(dir);
  }
}

TEST_CASE("deepseek_v4 pack: a cache of every expert reads each once, then serves without the store", "[model][deepseek_v4][pack]") {
  ep::backend::CpuBackend cpu;
  for (const char *name : kConfigs) {
    const Golden g = load_golden(name);
    const fs::path dir = scratch_dir(std::string("every_") + name);
    const ep::engine::ResolvedModel rm = ep::engine::resolve_model(g.gguf, placement(dir));
    auto resident = DeepseekV4Model::open(g.gguf, cpu);
    const int64_t K = resident->config().n_experts_used, E = resident->config().n_experts, L = resident->config().n_layers;
    // Too few slots: refused, nothing read, the store path unchanged.
    PackedModel small = open_packed(rm.source, rm.pack, cpu, PackedExperts::min_cache_bytes(rm.pack, K));
    CHECK_FALSE(small.experts->inner().load_every_expert(cpu));
    CHECK_FALSE(small.experts->inner().holds_every_expert());
    CHECK(small.experts->inner().needs_host_ids());
    CHECK(small.experts->inner().stats().pack_read_bytes == 0);

    PackedModel every = open_packed(rm.source, rm.pack, cpu, 0);
    REQUIRE(every.experts->inner().load_every_expert(cpu));
    CHECK(every.experts->inner().holds_every_expert());
    CHECK_FALSE(every.experts->inner().needs_host_ids());
    CHECK_FALSE(every.experts->inner().stages_reads());
    const ep::store::StoreStats loaded = every.experts->inner().stats();
    CHECK(loaded.cache_misses == static_cast<uint64_t>(L * E));  // each expert read once...
    CHECK(loaded.cache_hits == static_cast<uint64_t>(L * E));    // ...and found again by the check pass
    CHECK(loaded.cache_evictions == 0);
    CHECK(every.experts->inner().load_every_expert(cpu));  // a second call reads nothing
    CHECK(every.experts->inner().stats().cache_misses == loaded.cache_misses);

    CHECK(bit_identical(run_full(*every.model, g.tokens), run_full(*resident, g.tokens)));
    CHECK(bit_identical(run_decode(*every.model, g.tokens, 5), run_decode(*resident, g.tokens, 5)));
    CHECK(every.experts->acquires > 0);
    const ep::store::StoreStats after = every.experts->inner().stats();
    CHECK(after.acquires == loaded.acquires);  // the steps never called the store
    CHECK(after.pack_read_bytes == loaded.pack_read_bytes);
    fs::remove_all(dir);
  }
}

TEST_CASE("deepseek_v4 pack: a prompt pass with a small cache reads each picked expert once per layer", "[model][deepseek_v4][pack]") {
  // Expert-major (run_routed_experts with Backend::moe_pairs): the experts a prompt picks go
  // through the top_k slots once per layer, not once per small group of tokens, with the same
  // logits as the resident model.
  ep::backend::CpuBackend cpu;
  for (const char *name : kConfigs) {
    const Golden g = load_golden(name);
    const fs::path dir = scratch_dir(std::string("bypass_") + name);
    const ep::engine::ResolvedModel rm = ep::engine::resolve_model(g.gguf, placement(dir));
    auto resident = DeepseekV4Model::open(g.gguf, cpu);
    const int64_t K = resident->config().n_experts_used, E = resident->config().n_experts, L = resident->config().n_layers;
    PackedModel small = open_packed(rm.source, rm.pack, cpu, PackedExperts::min_cache_bytes(rm.pack, K));
    const std::vector<float> got = run_full(*small.model, g.tokens);  // one pass over every token
    CHECK(bit_identical(got, run_full(*resident, g.tokens)));
    const ep::store::StoreStats s = small.experts->inner().stats();
    std::printf("deepseek_v4 %s, one pass of %zu tokens through %lld slots: %llu acquires, %llu distinct keys, %llu misses (%lld experts x %lld layers)\n",
                name, g.tokens.size(), static_cast<long long>(K), static_cast<unsigned long long>(s.acquires),
                static_cast<unsigned long long>(small.experts->unique_keys), static_cast<unsigned long long>(s.cache_misses),
                static_cast<long long>(E), static_cast<long long>(L));
    // every (layer, expert) at most once: the acquires of a layer ask for disjoint sets of experts
    CHECK(small.experts->unique_keys <= static_cast<uint64_t>(E * L));
    CHECK(s.cache_misses == small.experts->unique_keys);
    CHECK(small.experts->max_unique_seen <= static_cast<uint64_t>(K));
    // and there were more picks than slots (the path under test, not one acquire per layer)
    CHECK(s.acquires > static_cast<uint64_t>(L));
    fs::remove_all(dir);
  }
}

TEST_CASE("deepseek_v4 pack: built once, reused, rebuilt or stale when the source changes", "[model][deepseek_v4][pack]") {
  const Golden g = load_golden("deepseek_v4_b");
  const fs::path dir = scratch_dir("reuse");
  const fs::path src = dir / "model.gguf";
  fs::copy_file(g.gguf, src);
  const fs::path packs = dir / "packs";
  uint64_t progress_calls = 0, last_done = 0, last_total = 0;
  ep::engine::PackPlacement place = placement(packs);
  place.progress = [&](uint64_t done, uint64_t total) {
    ++progress_calls;
    last_done = done;
    last_total = total;
  };
  const ep::engine::ResolvedModel r1 = ep::engine::resolve_model(src.string(), place);
  CHECK(r1.built);
  CHECK(r1.generation == 1);
  CHECK(progress_calls > 0);
  CHECK(last_total > 0);
  CHECK(last_done == last_total);
  const FileId id1 = file_id(r1.pack);

  // second open: no rebuild
  progress_calls = 0;
  const ep::engine::ResolvedModel r2 = ep::engine::resolve_model(src.string(), place);
  CHECK_FALSE(r2.built);
  CHECK(r2.pack == r1.pack);
  CHECK(r2.generation == 1);
  CHECK(progress_calls == 0);
  CHECK(file_id(r2.pack) == id1);
  // the pack itself opens, and names its source
  const ep::engine::ResolvedModel r3 = ep::engine::resolve_model(r1.pack, place);
  CHECK(r3.source == fs::absolute(src).lexically_normal().string());

  // the source changes (mtime): building disabled → stale; the pack given explicitly → stale
  fs::last_write_time(src, fs::last_write_time(src) + std::chrono::seconds(5));
  CHECK(status_of([&] { ep::engine::resolve_model(src.string(), placement(packs, false)); }) == ep::Status::stale);
  CHECK(status_of([&] { ep::engine::resolve_model(r1.pack, place); }) == ep::Status::stale);
  CHECK(file_id(r1.pack) == id1);
  // default: rebuilt, generation 2
  const ep::engine::ResolvedModel r4 = ep::engine::resolve_model(src.string(), place);
  CHECK(r4.built);
  CHECK(r4.generation == 2);
  CHECK_FALSE(r4.rebuild_reason.empty());
  CHECK(r4.pack == r1.pack);
  CHECK_FALSE(file_id(r4.pack) == id1);
  const ep::engine::ResolvedModel r5 = ep::engine::resolve_model(src.string(), place);
  CHECK_FALSE(r5.built);
  // the rebuilt pack still serves the golden logits
  ep::backend::CpuBackend cpu;
  PackedModel pm = open_packed(r5.source, r5.pack, cpu, 0);
  CHECK(compare(run_full(*pm.model, g.tokens), g.logits).rel() <= 1e-4);
  // a missing pack with building disabled
  CHECK(status_of([&] { ep::engine::resolve_model(src.string(), placement(dir / "none", false)); }) == ep::Status::not_found);
  // a pack without its manifest
  fs::remove(ep::pack::manifest_path(r5.pack));
  CHECK(status_of([&] { ep::engine::resolve_model(r5.pack, place); }) == ep::Status::not_found);
  fs::remove_all(dir);
}

TEST_CASE("deepseek_v4 pack: a pack of another model is refused", "[model][deepseek_v4][pack]") {
  const Golden a = load_golden("deepseek_v4_a"), b = load_golden("deepseek_v4_b");
  const fs::path dir = scratch_dir("mismatch");
  const ep::engine::ResolvedModel rb = ep::engine::resolve_model(b.gguf, placement(dir));
  ep::backend::CpuBackend cpu;
  ep::model::DeepseekV4LoadOptions lo;
  lo.resident_experts = false;
  auto ma = DeepseekV4Model::open(a.gguf, cpu, lo);
  const ep::Status st = status_of([&] {
    PackedExperts p(rb.pack, ma->expert_shapes(), ma->config().n_experts_used, PackedExpertsOptions{});
  });
  CHECK((st == ep::Status::format || st == ep::Status::shape));
  // forward without a provider is an error, not a crash
  std::vector<float> logits(static_cast<size_t>(ma->config().vocab));
  ep::model::DeepseekV4State s = ma->new_state();
  const int32_t tok = 1;
  CHECK(status_of([&] { ma->forward(&tok, 1, s, logits.data()); }) == ep::Status::internal);
  fs::remove_all(dir);
}

namespace {
void count_progress(uint64_t, uint64_t, void *payload) { ++*static_cast<int *>(payload); }
}  // namespace

TEST_CASE("deepseek_v4 pack: C API open through the pack, cache options, stats", "[model][deepseek_v4][pack][capi]") {
  const Golden g = load_golden("deepseek_v4_a");
  const fs::path dir = scratch_dir("capi");
  const std::string packs = (dir / "packs").string();
  const size_t V = static_cast<size_t>(g.vocab), S = g.tokens.size();

  ep_model_options ro;
  ep_model_options_init(&ro);
  ro.device = EP_DEVICE_CPU;  // the exact reference (tests/backend/cuda covers CUDA)
  CHECK(ro.pack_build == 1);
  CHECK(ro.resident_experts == 0);
  CHECK(ro.pack_dir == nullptr);
  ro.resident_experts = 1;
  ep_model *resident = nullptr;
  REQUIRE(ep_model_open(&resident, g.gguf.c_str(), &ro) == EP_OK);
  CHECK(ep_model_pack_path(resident) == nullptr);
  auto score = [&](ep_model *m) {
    ep_session *s = nullptr;
    REQUIRE(ep_session_open(&s, m) == EP_OK);
    std::vector<float> out(S * V);
    REQUIRE(ep_score(s, g.tokens.data(), S, 0, nullptr, out.data()) == EP_OK);
    ep_session_close(s);
    return out;
  };
  const std::vector<float> ref = score(resident);

  ep_model_options o;
  ep_model_options_init(&o);
  o.device = EP_DEVICE_CPU;  // the exact reference (tests/backend/cuda covers CUDA)
  o.pack_dir = packs.c_str();
  int progress = 0;
  o.progress = count_progress;
  o.progress_payload = &progress;
  ep_model *unlimited = nullptr;
  REQUIRE(ep_model_open(&unlimited, g.gguf.c_str(), &o) == EP_OK);
  CHECK(progress > 0);
  const char *pack = ep_model_pack_path(unlimited);
  REQUIRE(pack != nullptr);
  const std::string pack_path = pack;
  CHECK(fs::path(pack_path).parent_path() == fs::path(packs));
  CHECK(bit_identical(score(unlimited), ref));
  ep_store_stats su;
  ep_store_stats_init(&su);
  REQUIRE(ep_model_store_stats(&su, unlimited) == EP_OK);
  CHECK(su.cache_evictions == 0);
  CHECK(su.cache_misses > 0);
  ep_model_close(unlimited);

  // reopened: the pack is reused (no build progress), now with the smallest cache
  progress = 0;
  const FileId before = file_id(pack_path);
  o.cache_budget_bytes = PackedExperts::min_cache_bytes(pack_path, 2);
  o.staging_slots = 2;
  o.queue_depth = 4;
  o.read_splits = 2;
  o.direct_io = 0;
  ep_model *small = nullptr;
  REQUIRE(ep_model_open(&small, g.gguf.c_str(), &o) == EP_OK);
  CHECK(progress == 0);
  CHECK(file_id(pack_path) == before);
  CHECK(bit_identical(score(small), ref));
  ep_store_stats ss;
  ep_store_stats_init(&ss);
  REQUIRE(ep_model_store_stats(&ss, small) == EP_OK);
  CHECK(ss.cache_slots == 2);
  CHECK(ss.cache_evictions > 0);
  ep_model_close(small);

  // too small a budget
  o.cache_budget_bytes -= 1;
  ep_model *m = nullptr;
  CHECK(ep_model_open(&m, g.gguf.c_str(), &o) == EP_ERR_BUDGET);
  CHECK(m == nullptr);
  o.cache_budget_bytes = 0;

  // opened through the pack itself
  REQUIRE(ep_model_open(&m, pack_path.c_str(), &o) == EP_OK);
  CHECK(bit_identical(score(m), ref));
  ep_model_close(m);
  m = nullptr;
  // bad option values
  o.pack_build = 2;
  CHECK(ep_model_open(&m, g.gguf.c_str(), &o) == EP_ERR_INVALID_ARGUMENT);
  o.pack_build = 1;
  ep_model_options ro2 = ro;
  CHECK(ep_model_open(&m, pack_path.c_str(), &ro2) == EP_ERR_INVALID_ARGUMENT);
  // an old caller (options of the first version) gets the defaults for the appended fields
  // (pack_dir NULL → $XDG_CACHE_HOME/expertpack, pointed into the scratch dir here)
  ::setenv("XDG_CACHE_HOME", (dir / "xdg").string().c_str(), 1);
  ep_model_options old;
  ep_model_options_init(&old);
  old.device = EP_DEVICE_CPU;  // the exact reference (tests/backend/cuda covers CUDA)
  old.struct_size = offsetof(ep_model_options, pack_dir);
  REQUIRE(ep_model_open(&m, g.gguf.c_str(), &old) == EP_OK);
  REQUIRE(ep_model_pack_path(m) != nullptr);
  CHECK(fs::path(ep_model_pack_path(m)).parent_path() == dir / "xdg" / "expertpack");
  ep_model_close(m);
  m = nullptr;
  ep_store_stats st0;
  ep_store_stats_init(&st0);
  CHECK(ep_model_store_stats(&st0, resident) == EP_OK);
  CHECK(st0.acquires == 0);
  ep_model_close(resident);
  CHECK(ep_model_store_stats(nullptr, nullptr) == EP_ERR_INVALID_ARGUMENT);
  CHECK(ep_model_pack_path(nullptr) == nullptr);

  // a changed source with pack_build 0: EP_ERR_STALE
  const fs::path src = dir / "copy.gguf";
  fs::copy_file(g.gguf, src);
  o.cache_budget_bytes = 0;
  REQUIRE(ep_model_open(&m, src.string().c_str(), &o) == EP_OK);
  ep_model_close(m);
  m = nullptr;
  fs::last_write_time(src, fs::last_write_time(src) + std::chrono::seconds(3));
  o.pack_build = 0;
  CHECK(ep_model_open(&m, src.string().c_str(), &o) == EP_ERR_STALE);
  CHECK(std::strstr(ep_last_error(), "source changed") != nullptr);
  o.pack_build = 1;
  REQUIRE(ep_model_open(&m, src.string().c_str(), &o) == EP_OK);
  ep_model_close(m);
  fs::remove_all(dir);
}
