// A model on several devices through the C API, with CPU backends standing for the devices
// (ep_model_options::devices "cpu,cpu", "cpu,cpu,cpu"): on the goldens' models (DeepSeek-V4 and
// Kimi-K3), the routed experts spread over 2 and 3 devices give the logits of one device bit for
// bit, for a prompt pass and token by token, resident and streamed from a pack (through small
// per-device caches that evict, with and without a shared-out host tier and prefetch); each
// device has its own cache; the owner of an expert spreads a layer's experts evenly; a device list
// that is malformed, mixes kinds or comes with a single device is refused by name.
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

#include "experts/sharded_experts.hpp"
#include "hierarchy_support.hpp"

#include <expertpack/expertpack.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

using namespace hierarchytest;

namespace {

ep_status try_open_on(ep_model **out, const Model &m, const std::string &packs, const Features &f, const char *devices) {
  ep_model_options o;
  ep_model_options_init(&o);
  o.devices = devices;
  o.pack_dir = packs.c_str();
  o.cache_budget_bytes = f.cache_bytes;
  o.host_cache_bytes = f.host_bytes;
  o.overlap_reads = f.overlap;
  o.prefetch = f.prefetch;
  o.resident_experts = f.resident;
  o.cache_policy = f.policy;
  o.direct_io = 0;
  o.cpu_threads = 1;
  return ep_model_open(out, m.gguf.c_str(), &o);
}

ep_model *open_on(const Model &m, const std::string &packs, const Features &f, const char *devices) {
  ep_model *out = nullptr;
  const ep_status st = try_open_on(&out, m, packs, f, devices);
  INFO(m.gguf << " on " << devices << ": " << ep_last_error());
  REQUIRE(st == EP_OK);
  return out;
}

}  // namespace

TEST_CASE("multi-device: every expert has one owner, a layer's experts spread evenly", "[experts][multi_device]") {
  for (int32_t n : {1, 2, 3, 8}) {
    for (int64_t layer = 0; layer < 6; ++layer) {
      std::vector<int64_t> owned(static_cast<size_t>(n), 0);
      for (int64_t e = 0; e < 256; ++e) {
        const int32_t d = ep::experts::expert_owner(layer, e, n);
        REQUIRE(d >= 0);
        REQUIRE(d < n);
        ++owned[static_cast<size_t>(d)];
      }
      for (int64_t c : owned) CHECK((c == 256 / n || c == 256 / n + 1));
    }
  }
  // The spread starts at a hash of the layer: expert 0 is not the first device's in every layer.
  bool moved = false;
  for (int64_t layer = 1; layer < 8; ++layer) moved = moved || ep::experts::expert_owner(layer, 0, 2) != ep::experts::expert_owner(0, 0, 2);
  CHECK(moved);
}

TEST_CASE("multi-device: 2 and 3 CPU devices give the logits of one, bit for bit", "[model][capi][multi_device]") {
  for (const Model &m : models()) {
    INFO(m.gguf);
    ep::test::TempDir dir;
    const std::string packs = dir / "packs";
    Features resident;
    resident.resident = 1;
    ep_model *ref_model = open(m, packs, resident, EP_DEVICE_CPU);
    ep_model_properties p;
    ep_model_properties_init(&p);
    REQUIRE(ep_model_info(&p, ref_model) == EP_OK);
    const size_t V = p.vocab_size;
    const std::vector<float> ref = run(ref_model, m.tokens, V);
    ep_model_close(ref_model);

    // Resident: each device holds the experts it owns.
    for (const char *devices : {"cpu", "cpu,cpu", "cpu,cpu,cpu"}) {
      INFO("resident on " << devices);
      ep_model *r = open_on(m, packs, resident, devices);
      CHECK(same_bits(run(r, m.tokens, V), ref));
      ep_model_close(r);
    }

    // Streamed: the slot size and the count of every expert from an unlimited open.
    ep_model *probe = open(m, packs, Features{}, EP_DEVICE_CPU);
    const ep_store_stats ps = store_stats(probe);
    const uint64_t slot = ps.slot_bytes, all = ps.cache_slots;
    ep_model_close(probe);
    REQUIRE(all >= 8);
    // A quarter of the experts per device: every device evicts.
    Features small;
    small.cache_bytes = slot * (all / 4);
    small.policy = "lru";
    Features tiered = small;
    tiered.host_bytes = slot * (all / 4);
    tiered.overlap = 1;
    tiered.prefetch = 1;
    uint64_t one_device_reads = 0;
    for (const char *devices : {"cpu", "cpu,cpu", "cpu,cpu,cpu"}) {
      const uint64_t n = std::string(devices) == "cpu" ? 1 : std::string(devices) == "cpu,cpu" ? 2 : 3;
      INFO("pack on " << devices);
      ep_model *a = open_on(m, packs, small, devices);
      CHECK(same_bits(run(a, m.tokens, V), ref));
      const ep_store_stats sa = store_stats(a);
      CHECK(sa.cache_slots == n * (all / 4));  // each device its own cache of the budget
      CHECK(sa.cache_evictions > 0);
      // LRU per device over its own experts never misses more than one LRU cache of the same
      // size over all of them: the devices' caches add up.
      if (n == 1) one_device_reads = sa.pack_reads;
      else CHECK(sa.pack_reads <= one_device_reads);
      ep_model_close(a);

      INFO("with the host tier, overlap and prefetch");
      ep_model *b = open_on(m, packs, tiered, devices);
      CHECK(same_bits(run(b, m.tokens, V), ref));
      const ep_store_stats sb = store_stats(b);
      CHECK(sb.host_slots > 0);
      CHECK(sb.host_slots <= all / 4);  // the tier is shared out, not multiplied
      CHECK(sb.cache_misses == sb.host_hits + sb.host_misses);
      // The hints reach the stores of the devices that own the predicted experts (with one
      // device's quarter of the experts every slot is the current token's: nothing to prefetch into).
      if (n > 1) CHECK(sb.prefetch_issued > 0);
      ep_model_close(b);
    }
  }
}

TEST_CASE("multi-device: device lists that are refused", "[model][capi][multi_device]") {
  const Model m = models().front();
  ep::test::TempDir dir;
  const std::string packs = dir / "packs";
  auto refused = [&](const char *devices, ep_device_kind device, int32_t index) {
    ep_model_options o;
    ep_model_options_init(&o);
    o.devices = devices;
    o.device = device;
    o.device_index = index;
    o.pack_dir = packs.c_str();
    ep_model *out = nullptr;
    const ep_status st = ep_model_open(&out, m.gguf.c_str(), &o);
    CHECK(out == nullptr);
    return std::pair<ep_status, std::string>(st, ep_last_error());
  };
  auto [st, msg] = refused("cpu,cpu", EP_DEVICE_CPU, 0);
  CHECK(st == EP_ERR_INVALID_ARGUMENT);
  CHECK(msg.find("devices 'cpu,cpu'") != std::string::npos);
  CHECK(msg.find("and device cpu") != std::string::npos);
  std::tie(st, msg) = refused("cpu,cpu", EP_DEVICE_AUTO, 1);
  CHECK(st == EP_ERR_INVALID_ARGUMENT);
  CHECK(msg.find("device_index 1") != std::string::npos);
  std::tie(st, msg) = refused("cpu,gpu1", EP_DEVICE_AUTO, 0);
  CHECK(st == EP_ERR_INVALID_ARGUMENT);
  CHECK(msg.find("entry 'gpu1'") != std::string::npos);
  std::tie(st, msg) = refused("cpu,,cpu", EP_DEVICE_AUTO, 0);
  CHECK(st == EP_ERR_INVALID_ARGUMENT);
  CHECK(msg.find("entry ''") != std::string::npos);
  std::tie(st, msg) = refused("cuda:0,cpu", EP_DEVICE_AUTO, 0);
  CHECK(st == EP_ERR_INVALID_ARGUMENT);
  CHECK(msg.find("one kind") != std::string::npos);
  std::tie(st, msg) = refused("cuda:-1", EP_DEVICE_AUTO, 0);
  CHECK(st == EP_ERR_INVALID_ARGUMENT);
  // A GPU that does not exist (none in CI; no machine has 1000).
  std::tie(st, msg) = refused("cuda:0,cuda:999", EP_DEVICE_AUTO, 0);
  CHECK(st == EP_ERR_NO_DEVICE);
}
