// Faults injected through the I/O seam (src/io/seam.hpp) while the DeepSeek-V4 model generates
// from its Expert Pack: EIO (transient and persistent), short reads, EAGAIN/EINTR, slow reads and
// stale bytes (reads that deliver wrong data). Every forward pass either gives exactly the
// fault-free logits or fails with a clear error (EP_ERR_IO / EP_ERR_CORRUPT naming the layer and
// expert); no slot stays pinned; the next request on the same model works. A third case does
// the same through the C API with the pack rewritten on disk under an open model.
//
// Persistent EIO and stale bytes go through the model's own PackedExperts
// (PackedExpertsOptions::seam), with a cache of top_k slots and two staging slots, so every step
// reads and a leaked slot or staging buffer would make the next acquire fail. The transient
// faults need more EIO retries and a choice of reader backend than PackedExpertsOptions offers:
// that case installs an ExpertProvider of its own (the same ExpertStore over the same pack, with
// the seam, and the layouts PackedExperts derives).
#include "rel_support.hpp"

#include "backend/cpu_backend.hpp"
#include "core/error.hpp"
#include "format/pack_file.hpp"
#include "io/seam.hpp"
#include "model/deepseek_v4.hpp"
#include "experts/packed_experts.hpp"
#include "experts/provider.hpp"
#include "pack/builder.hpp"
#include "store/device.hpp"
#include "store/expert_store.hpp"
#include "store/pack_object_map.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>

using namespace ep;

namespace {

/// A seam whose fault plan can be changed between requests. @p uring_errno != 0 makes io_uring
/// setup fail with it, so the reader falls back to the pread pool (a kernel without io_uring).
class SwitchSeam final : public io::IoSeam {
 public:
  explicit SwitchSeam(int uring_errno = 0) : uring_errno_(uring_errno) {}
  int uring_setup_error() override { return uring_errno_; }
  void set(const io::FaultPlan &plan) {
    std::lock_guard lock(mutex_);
    inner_ = std::make_shared<io::FaultInjector>(plan);
  }
  std::shared_ptr<io::FaultInjector> current() const {
    std::lock_guard lock(mutex_);
    return inner_;
  }
  int64_t on_read_result(uint64_t offset, uint64_t bytes, int64_t result) override {
    return current()->on_read_result(offset, bytes, result);
  }
  void on_read_data(uint64_t offset, void *dst, int64_t result) override { current()->on_read_data(offset, dst, result); }

 private:
  const int uring_errno_;
  mutable std::mutex mutex_;
  std::shared_ptr<io::FaultInjector> inner_ = std::make_shared<io::FaultInjector>(io::FaultPlan{});
};

/// PackedExperts' job, with a seam: an ExpertStore of top_k slots over the pack.
class SeamExperts final : public experts::ExpertProvider {
 public:
  SeamExperts(const std::string &pack, const model::DeepseekV4Model &m, std::shared_ptr<io::IoSeam> seam,
              io::Backend backend) {
    const int64_t k = m.config().n_experts_used;
    experts::PackedExperts reference(pack, m.expert_shapes(), k, {});
    for (size_t l = 0; l < m.expert_shapes().size(); ++l) layouts_.push_back(reference.layout(static_cast<int64_t>(l)));
    layout_ = store::PackObjectMap::open(pack, false);
    store::StoreOptions so;
    so.pack_path = pack;
    so.objects = layout_;
    so.top_k = static_cast<uint32_t>(k);
    so.tokens_per_acquire = 1;
    so.cache_bytes = reference.slot_bytes() * static_cast<uint64_t>(k);
    so.staging_slots = 4;
    so.reader.backend = backend;
    so.reader.direct = io::DirectMode::buffered;
    so.reader.read_splits = 2;
    so.reader.eio_retries = 8;
    so.reader.seam = std::move(seam);
    store_ = std::make_unique<store::ExpertStore>(std::move(so), std::make_unique<store::HostDevice>());
    max_unique_ = k;
  }
  const backend::SlotLayout &layout(int64_t layer) const override { return layouts_.at(static_cast<size_t>(layer)); }
  bool needs_host_ids() const override { return true; }
  backend::ExpertBatch acquire(int64_t layer, const backend::Tensor &ids, const int32_t *host_ids,
                               std::span<const int32_t> only) override {
    const int64_t n = ids.n_elems();
    std::vector<uint32_t> want = only.empty() ? std::vector<uint32_t>(host_ids, host_ids + n)
                                              : std::vector<uint32_t>(only.begin(), only.end());
    held_ = store_->acquire(static_cast<uint32_t>(layer), want);  // throws: nothing held
    active_ = true;
    pair_slots_.assign(static_cast<size_t>(n), nullptr);
    for (int64_t p = 0; p < n; ++p)
      for (size_t i = 0; i < want.size(); ++i)
        if (want[i] == static_cast<uint32_t>(host_ids[p])) pair_slots_[static_cast<size_t>(p)] = held_.pointers[i];
    backend::ExpertBatch b;
    b.n_pairs = n;
    b.pair_slots = pair_slots_.data();
    b.pair_experts = host_ids;
    return b;
  }
  void release(int64_t) override {
    if (!active_) return;
    active_ = false;
    store_->release(held_);
  }
  int64_t max_unique() const override { return max_unique_; }
  store::ExpertStore &store() { return *store_; }

 private:
  std::shared_ptr<store::PackObjectMap> layout_;
  std::vector<backend::SlotLayout> layouts_;
  std::unique_ptr<store::ExpertStore> store_;
  store::Acquisition held_;
  bool active_ = false;
  std::vector<const void *> pair_slots_;
  int64_t max_unique_ = 1;
};

const std::vector<int32_t> kPrompt = {3, 14, 15, 92, 65, 35};
constexpr int kDecodeSteps = 5;

/// Prefill, then decode kDecodeSteps greedy tokens; returns every row of logits produced.
std::vector<float> run(model::DeepseekV4Model &m) {
  const int64_t V = m.config().vocab;
  model::DeepseekV4State st = m.new_state();
  std::vector<float> rows(kPrompt.size() * static_cast<size_t>(V));
  m.forward(kPrompt.data(), static_cast<int64_t>(kPrompt.size()), st, rows.data());
  std::vector<float> out = rows;
  std::vector<float> row(static_cast<size_t>(V));
  const float *last = rows.data() + (kPrompt.size() - 1) * static_cast<size_t>(V);
  for (int s = 0; s < kDecodeSteps; ++s) {
    const int32_t next = static_cast<int32_t>(std::max_element(last, last + V) - last);
    m.forward(&next, 1, st, row.data());
    out.insert(out.end(), row.begin(), row.end());
    last = out.data() + out.size() - static_cast<size_t>(V);
  }
  return out;
}

/// After any number of failed passes, top_k fresh experts of every layer can still be acquired
/// at once through the provider the model uses: no slot of the top_k-slot cache stayed pinned
/// and the provider holds no acquisition (PackedExperts refuses an acquire while one is held).
void check_no_pins(experts::ExpertProvider &ex, uint32_t layers, uint32_t k, uint32_t n_experts) {
  for (uint32_t l = 0; l < layers; ++l) {
    std::vector<int32_t> ids;
    for (uint32_t i = 0; i < k; ++i) ids.push_back(static_cast<int32_t>((l + i) % n_experts));
    INFO("layer " << l);
    const backend::Tensor t = backend::Tensor::make(ids.data(), backend::GgmlType::i32, backend::Device::cpu,
                                                    {static_cast<int64_t>(ids.size()), 1});
    CHECK_NOTHROW(ex.acquire(l, t, ids.data(), {}));
    CHECK_NOTHROW(ex.release(l));
  }
}

struct World {
  test::TempDir dir;
  std::string gguf, pack;
  backend::CpuBackend be;
  std::unique_ptr<model::DeepseekV4Model> m;
  World() {
    gguf = rel::write_small_model(dir / "m.gguf", 31);
    pack = dir / "m.epk";
    pack::build_pack(std::vector<std::string>{gguf}, pack);
    model::DeepseekV4LoadOptions lo;
    lo.resident_experts = false;
    m = model::DeepseekV4Model::open(gguf, be, lo);
  }
};

}  // namespace

TEST_CASE("transient faults during generation: bit-identical logits", "[reliability][faults]") {
  World w;
  const uint32_t k = static_cast<uint32_t>(w.m->config().n_experts_used);
  // The fault-free reference, from the model's own PackedExperts.
  w.m->set_experts(std::make_unique<experts::PackedExperts>(w.pack, w.m->expert_shapes(), k, experts::PackedExpertsOptions{}));
  const std::vector<float> want = run(*w.m);

  for (const io::Backend backend : {io::Backend::automatic, io::Backend::pread}) {
    INFO("reader backend " << (backend == io::Backend::pread ? "pread" : "automatic"));
    auto seam = std::make_shared<SwitchSeam>();
    auto owned = std::make_unique<SeamExperts>(w.pack, *w.m, seam, backend);
    SeamExperts &ex = *owned;
    w.m->set_experts(std::move(owned));
    CHECK(rel::same_bits(run(*w.m), want));  // the seam provider itself is exact

    {
      INFO("transient EIO, short reads, EAGAIN/EINTR and latency: bit-identical logits");
      io::FaultPlan plan;
      plan.seed = 5;
      plan.eio_probability = 0.15;
      plan.short_probability = 0.3;
      plan.eagain_probability = 0.1;
      plan.eintr_probability = 0.1;
      plan.latency_ns = 50'000;
      seam->set(plan);
      const uint64_t reads0 = ex.store().stats().pack_reads;
      CHECK(rel::same_bits(run(*w.m), want));
      const auto inj = seam->current();
      CHECK(inj->injected_eio() > 0);
      CHECK(inj->injected_short() > 0);
      CHECK(inj->injected_retry() > 0);
      CHECK(ex.store().stats().pack_reads > reads0);
      CHECK(ex.store().stats().io_errors >= inj->injected_eio());
    }
    {
      INFO("slow reads (2 ms each): bit-identical logits");
      io::FaultPlan plan;
      plan.latency_ns = 2'000'000;
      seam->set(plan);
      CHECK(rel::same_bits(run(*w.m), want));
      CHECK(seam->current()->calls() > 0);
    }
  }
}

TEST_CASE("persistent EIO and stale bytes through the model's own PackedExperts: a clear error, never wrong output",
          "[reliability][faults]") {
  World w;
  const uint32_t layers = static_cast<uint32_t>(w.m->expert_shapes().size());
  const uint32_t k = static_cast<uint32_t>(w.m->config().n_experts_used);
  w.m->set_experts(std::make_unique<experts::PackedExperts>(w.pack, w.m->expert_shapes(), k, experts::PackedExpertsOptions{}));
  const std::vector<float> want = run(*w.m);
  auto pf = format::PackFile::open(w.pack, format::ValidationLevel::structure);
  const uint32_t n_experts = pf->num_experts();

  // 0: io_uring where the kernel allows it; ENOSYS at io_uring setup: the pread pool.
  for (const int uring_errno : {0, ENOSYS}) {
    INFO("io_uring setup " << (uring_errno ? "fails (ENOSYS): pread pool" : "as the kernel allows"));
    auto seam = std::make_shared<SwitchSeam>(uring_errno);
    experts::PackedExpertsOptions po;
    po.store.cache_budget_bytes = experts::PackedExperts::min_cache_bytes(w.pack, k);  // top_k slots: every step reads
    po.store.staging_slots = 2;
    po.store.read_splits = 2;
    po.store.direct_io = 0;
    po.seam = seam;
    auto owned = std::make_unique<experts::PackedExperts>(w.pack, w.m->expert_shapes(), k, po);
    experts::PackedExperts &ex = *owned;
    w.m->set_experts(std::move(owned));
    REQUIRE(ex.num_slots() == k);
    if (uring_errno) CHECK(ex.stats().fallback_count > 0);
    CHECK(rel::same_bits(run(*w.m), want));  // the seam itself changes nothing
    CHECK(seam->current()->calls() > 0);     // and every read passed through it

    {
      INFO("a persistent EIO on layer 1's experts: EP_ERR_IO naming it; then the model recovers");
      // Every object of layer 1: the first decode step that reaches layer 1 must read one.
      io::FaultPlan plan;
      plan.bad_offset = pf->object_offset(1, 0);
      plan.bad_bytes = pf->object_offset(1, n_experts - 1) + pf->object_bytes(1, n_experts - 1) - plan.bad_offset;
      seam->set(plan);
      const uint64_t errors0 = ex.stats().io_errors;
      for (int attempt = 0; attempt < 3; ++attempt) {
        try {
          run(*w.m);
          FAIL("a forward pass succeeded without layer 1's experts");
        } catch (const Error &e) {
          INFO(e.what());
          CHECK(e.status() == Status::io);
          CHECK(std::string(e.what()).find("layer 1 expert") != std::string::npos);
          CHECK(std::string(e.what()).find(w.pack) != std::string::npos);
        }
      }
      CHECK(ex.stats().io_errors > errors0);
      seam->set(io::FaultPlan{});
      check_no_pins(ex, layers, k, n_experts);
      CHECK(rel::same_bits(run(*w.m), want));  // the next request on the same model
    }
    {
      INFO("stale bytes: EP_ERR_CORRUPT (the store's per-role hash check) or exact logits");
      io::FaultPlan plan;
      plan.seed = 9;
      plan.stale_probability = 0.01;
      seam->set(plan);
      int corrupt = 0, exact = 0, wrong = 0, next_exact = 0;
      for (int attempt = 0; attempt < 12; ++attempt) {
        try {
          if (rel::same_bits(run(*w.m), want)) ++exact;
          else ++wrong;
        } catch (const Error &e) {
          INFO(e.what());
          CHECK(e.status() == Status::corrupt);
          CHECK(std::string(e.what()).find("payload hash mismatch") != std::string::npos);
          CHECK(std::string(e.what()).find(w.pack) != std::string::npos);
          ++corrupt;
          // The very next request, with the disk behaving again, is exact: nothing wrong was
          // cached and nothing stayed pinned or held.
          seam->set(io::FaultPlan{});
          next_exact += rel::same_bits(run(*w.m), want);
          plan.seed += 1000;  // then faults again, from a fresh sequence
          seam->set(plan);
        }
      }
      WARN("stale bytes (" << (uring_errno ? "pread" : "default reader") << "): " << corrupt << " of 12 runs refused "
                           << "(EP_ERR_CORRUPT), " << exact << " exact, " << wrong << " wrong");
      CHECK(corrupt > 0);
      CHECK(wrong == 0);
      CHECK(next_exact == corrupt);
      seam->set(io::FaultPlan{});
      check_no_pins(ex, layers, k, n_experts);
      CHECK(rel::same_bits(run(*w.m), want));
    }
  }
}

TEST_CASE("a pack rewritten under an open model: EP_ERR_CORRUPT, then exact again once restored", "[reliability][faults]") {
  test::TempDir dir;
  const std::string gguf = rel::write_small_model(dir / "m.gguf", 41);
  const std::string packs = dir / "packs";
  std::vector<int32_t> want;
  uint64_t slot_bytes = 0;
  {
    rel::ModelHandle h;
    const ep_model_options o = rel::options_in(packs);
    REQUIRE(ep_model_open(&h.model, gguf.c_str(), &o) == EP_OK);
    REQUIRE(rel::generate(h.model, kPrompt, 6, want) == EP_OK);
    ep_store_stats s;
    ep_store_stats_init(&s);
    REQUIRE(ep_model_store_stats(&s, h.model) == EP_OK);
    slot_bytes = s.slot_bytes;
  }
  rel::ModelHandle h;
  const ep_model_options o = rel::options_in(packs, 2 * slot_bytes, 0);  // top_k slots: every step reads
  REQUIRE(ep_model_open(&h.model, gguf.c_str(), &o) == EP_OK);
  const std::string pack = ep_model_pack_path(h.model);
  std::vector<int32_t> got;
  REQUIRE(rel::generate(h.model, kPrompt, 6, got) == EP_OK);
  CHECK(got == want);

  // Flip one byte in the gate payload of every expert of layer 0, in place (as a disk or
  // another process would).
  auto pf = format::PackFile::open(pack, format::ValidationLevel::structure);
  const int fd = ::open(pack.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  std::vector<std::pair<uint64_t, unsigned char>> saved;
  for (uint32_t x = 0; x < pf->num_experts(); ++x) {
    const uint64_t off = pf->entry(0, x, format::Role::gate).file_offset + 7;
    unsigned char b = 0;
    REQUIRE(::pread(fd, &b, 1, static_cast<off_t>(off)) == 1);
    saved.emplace_back(off, b);
    b ^= 0x20;
    REQUIRE(::pwrite(fd, &b, 1, static_cast<off_t>(off)) == 1);
  }
  CHECK(rel::generate(h.model, kPrompt, 6, got) == EP_ERR_CORRUPT);
  const std::string msg = ep_last_error();
  INFO(msg);
  CHECK(msg.find("layer 0 expert") != std::string::npos);
  CHECK(msg.find("payload hash mismatch") != std::string::npos);
  CHECK(rel::generate(h.model, kPrompt, 6, got) == EP_ERR_CORRUPT);  // still refused, not cached
  for (const auto &[off, b] : saved) REQUIRE(::pwrite(fd, &b, 1, static_cast<off_t>(off)) == 1);
  ::close(fd);
  REQUIRE(rel::generate(h.model, kPrompt, 6, got) == EP_OK);
  CHECK(got == want);
  ep_store_stats s;
  ep_store_stats_init(&s);
  REQUIRE(ep_model_store_stats(&s, h.model) == EP_OK);
  CHECK(s.cache_slots == 2);
}
