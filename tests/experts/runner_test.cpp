// The runner (src/experts/runner.hpp) on the CPU backend over ResidentExperts: the direct, staged
// and expert-major strategies give the same bits; start_moe() asks for the next layer's picks
// only when the provider wants hints and a MoE layer follows, and hands them to hint(); every
// path releases the acquisition, errors included.
#include "backend/cpu_backend.hpp"
#include "backend/device_buffer.hpp"
#include "core/error.hpp"
#include "experts/resident_experts.hpp"
#include "experts/runner.hpp"
#include "support/catch.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <span>
#include <vector>

using namespace ep;
using backend::GgmlType;
using backend::Tensor;

namespace {

constexpr int64_t kD = 64, kF = 32, kE = 8, kK = 2, kT = 5;

/// Seeded f32 experts of one role: n_experts matrices of ne1 rows of ne0 values.
experts::StackedRole random_role(int64_t ne0, int64_t ne1, uint32_t seed, const char *name) {
  experts::StackedRole r;
  r.type = GgmlType::f32;
  r.ne0 = ne0;
  r.ne1 = ne1;
  r.n_experts = kE;
  r.origin = name;
  r.read_expert = [=](int64_t e) {
    std::mt19937 rng(seed * 1000 + static_cast<uint32_t>(e));
    std::uniform_real_distribution<float> u(-0.5f, 0.5f);
    std::vector<float> v(static_cast<size_t>(ne0 * ne1));
    for (float &x : v) x = u(rng);
    std::vector<uint8_t> bytes(v.size() * 4);
    std::memcpy(bytes.data(), v.data(), bytes.size());
    return bytes;
  };
  return r;
}

/// Two MoE layers of resident experts, and a step's inputs in backend memory.
struct Fixture {
  backend::CpuBackend be{1};
  experts::ResidentExperts resident{be};
  backend::DeviceBuffer ids, hint_ids, weights, x;
  std::vector<int32_t> host_ids, host_hint;
  Fixture() {
    for (uint32_t l = 0; l < 2; ++l)
      resident.add_layer(random_role(kD, kF, 10 * l + 1, "gate"), random_role(kD, kF, 10 * l + 2, "up"),
                         random_role(kF, kD, 10 * l + 3, "down"));
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    // every token picks two distinct experts; the step covers all eight
    host_ids = {0, 1, 2, 3, 4, 5, 6, 7, 1, 6};
    host_hint = {2, 7, 5, 1, 0, 3, 4, 6, 7, 2};
    std::vector<float> w(kK * kT), xs(kD * kT);
    for (float &v : w) v = u(rng);
    for (float &v : xs) v = u(rng);
    ids = upload(host_ids.data(), host_ids.size() * 4);
    hint_ids = upload(host_hint.data(), host_hint.size() * 4);
    weights = upload(w.data(), w.size() * 4);
    x = upload(xs.data(), xs.size() * 4);
  }
  backend::DeviceBuffer upload(const void *src, uint64_t bytes) {
    backend::DeviceBuffer b(be, bytes);
    be.upload(b.get(), src, bytes);
    return b;
  }
  experts::MoeLayer layer(int64_t next_layer, int *next_routes = nullptr) {
    experts::MoeLayer ml;
    ml.layer = 0;
    ml.next_layer = next_layer;
    ml.route = [this, next_routes](bool next) {
      if (next && next_routes) ++*next_routes;
      const backend::Device dv = be.device();
      experts::Routed r;
      r.ids = Tensor::make(next ? hint_ids.get() : ids.get(), GgmlType::i32, dv, {kK, kT});
      r.weights = Tensor::make(weights.get(), GgmlType::f32, dv, {kK, kT});
      return r;
    };
    return ml;
  }
  /// One MoE layer through @p provider; returns y.
  std::vector<float> run(experts::ExpertProvider &provider, int64_t next_layer = -1, int *next_routes = nullptr) {
    backend::DeviceBuffer y(be, kD * kT * 4);
    const experts::MoeStep step = experts::start_moe(be, provider, layer(next_layer, next_routes));
    backend::Activation act;
    experts::finish_moe(be, provider, step, static_cast<const float *>(x.get()), static_cast<float *>(y.get()), kD, act);
    std::vector<float> out(kD * kT);
    be.download(out.data(), y.get(), out.size() * 4);
    return out;
  }
};

/// Delegates to ResidentExperts with the picks on the host, counting acquires and releases;
/// options make it stage its reads, cap max_unique() or want hints.
class Wrapped final : public experts::ExpertProvider {
 public:
  explicit Wrapped(experts::ResidentExperts &inner) : inner_(inner) {}
  int64_t max_unique_ = std::numeric_limits<int64_t>::max();
  bool staged_ = false, hints_ = false, fail_staged_ = false;
  int acquires = 0, releases = 0, waves = 0;
  std::vector<std::pair<int64_t, std::vector<int32_t>>> hints;
  std::set<int32_t> resident_now{0, 3};  // staged: the experts resident at the acquire

  const backend::SlotLayout &layout(int64_t layer) const override { return inner_.layout(layer); }
  bool needs_host_ids() const override { return true; }
  backend::ExpertBatch acquire(int64_t layer, const Tensor &ids, const int32_t *host_ids, std::span<const int32_t> only) override {
    ++acquires;
    REQUIRE(host_ids);
    REQUIRE(static_cast<int64_t>(std::set<int32_t>(only.begin(), only.end()).size()) <= max_unique_);
    return inner_.acquire(layer, ids, host_ids, only);
  }
  void release(int64_t layer) override {
    ++releases;
    inner_.release(layer);
  }
  int64_t max_unique() const override { return max_unique_; }
  bool stages_reads() const override { return staged_; }
  backend::ExpertBatch acquire_staged(int64_t layer, const Tensor &ids, const int32_t *host_ids) override {
    full_ = acquire(layer, ids, host_ids, {});
    pair_experts_ = host_ids;
    left_.clear();
    for (int64_t p = 0; p < full_.n_pairs; ++p)
      if (!resident_now.count(host_ids[p])) left_.insert(host_ids[p]);
    return masked([&](int32_t e) { return resident_now.count(e) != 0; });
  }
  bool next_staged(int64_t, backend::ExpertBatch &batch) override {
    if (left_.empty()) return false;
    if (fail_staged_) throw Error(Status::io, "a read failed");
    const int32_t e = *left_.begin();  // one expert lands per wave
    left_.erase(left_.begin());
    ++waves;
    batch = masked([&](int32_t x) { return x == e; });
    return true;
  }
  bool wants_hints() const override { return hints_; }
  void hint(int64_t layer, std::span<const int32_t> ids) override { hints.emplace_back(layer, std::vector<int32_t>(ids.begin(), ids.end())); }

 private:
  template <class Covered>
  backend::ExpertBatch masked(Covered covered) {
    slots_.assign(static_cast<size_t>(full_.n_pairs), nullptr);
    for (int64_t p = 0; p < full_.n_pairs; ++p)
      if (covered(pair_experts_[p])) slots_[static_cast<size_t>(p)] = full_.pair_slots[p];
    backend::ExpertBatch b;
    b.n_pairs = full_.n_pairs;
    b.pair_slots = slots_.data();
    b.pair_experts = pair_experts_;
    return b;
  }
  experts::ResidentExperts &inner_;
  backend::ExpertBatch full_;
  const int32_t *pair_experts_ = nullptr;
  std::set<int32_t> left_;
  std::vector<const void *> slots_;
};

}  // namespace

TEST_CASE("runner: direct, staged and expert-major give the same bits", "[experts]") {
  Fixture f;
  const std::vector<float> direct = f.run(f.resident);
  REQUIRE(std::any_of(direct.begin(), direct.end(), [](float v) { return v != 0.0f; }));

  SECTION("direct with the picks on the host") {
    Wrapped w(f.resident);
    CHECK(f.run(w) == direct);
    CHECK(w.acquires == 1);
    CHECK(w.releases == 1);
  }
  SECTION("staged: two experts resident, the other six landing one per wave") {
    Wrapped w(f.resident);
    w.staged_ = true;
    CHECK(f.run(w) == direct);
    CHECK(w.waves == 6);
    CHECK(w.releases == 1);
  }
  SECTION("staged with every expert resident: one moe(), no wave") {
    Wrapped w(f.resident);
    w.staged_ = true;
    w.resident_now = {0, 1, 2, 3, 4, 5, 6, 7};
    CHECK(f.run(w) == direct);
    CHECK(w.waves == 0);
  }
  SECTION("expert-major: at most three distinct experts per acquire") {
    Wrapped w(f.resident);
    w.max_unique_ = 3;
    CHECK(f.run(w) == direct);
    CHECK(w.acquires == 3);  // eight experts in groups of three
    CHECK(w.releases == w.acquires);
  }
}

TEST_CASE("runner: the next layer is routed and hinted only when the provider wants hints", "[experts]") {
  Fixture f;
  Wrapped w(f.resident);
  int next_routes = 0;
  const std::vector<float> plain = f.run(w, 1, &next_routes);
  CHECK(next_routes == 0);
  CHECK(w.hints.empty());

  w.hints_ = true;
  CHECK(f.run(w, -1, &next_routes) == plain);  // no MoE layer follows
  CHECK(next_routes == 0);
  CHECK(w.hints.empty());

  CHECK(f.run(w, 1, &next_routes) == plain);  // a hint never changes a result
  CHECK(next_routes == 1);
  REQUIRE(w.hints.size() == 1);
  CHECK(w.hints[0].first == 1);
  CHECK(w.hints[0].second == f.host_hint);
}

TEST_CASE("runner: a failed wave releases the acquisition and throws its error", "[experts]") {
  Fixture f;
  Wrapped w(f.resident);
  w.staged_ = true;
  w.fail_staged_ = true;
  try {
    f.run(w);
    FAIL("the failed read was not reported");
  } catch (const Error &e) {
    CHECK(e.status() == Status::io);
  }
  CHECK(w.acquires == 1);
  CHECK(w.releases == 1);
}

TEST_CASE("runner: a MoE layer without a router is an internal error", "[experts]") {
  Fixture f;
  experts::MoeLayer ml;
  try {
    experts::start_moe(f.be, f.resident, ml);
    FAIL("accepted");
  } catch (const Error &e) {
    CHECK(e.status() == Status::internal);
  }
}
