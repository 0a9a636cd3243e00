// ep-cache-sim: replays routing traces through every placement policy and Belady's offline
// optimum at the same byte budget; prints hit rates and bytes read (a table, or --json). With a
// host budget, also the store's two tiers (the slots above an exclusive host-RAM tier) per policy,
// beside Belady at the slots alone and at slots + host tier (the fewest pack reads any placement
// of that total capacity allows).
#include "cache/budget.hpp"
#include "cache/host_tier.hpp"
#include "cache/simulate.hpp"
#include "core/error.hpp"
#include "testkit/trace.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr const char *kUsage =
    "usage: ep-cache-sim [--trace FILE]... [--synthetic uniform|zipf|zipf-temporal]...\n"
    "                    [--budget-mib N[,N...] | --budget-fraction F[,F...]] [--json]\n"
    "  --trace FILE          a BigMoeOnEdge route CSV (route_trace v1) or an ExpertStore trace\n"
    "  --phases decode|all   route CSVs: decode steps only (default), or also the prefill\n"
    "                        (one access per layer with all prompt tokens' experts)\n"
    "  --synthetic KIND      a generated trace: uniform, zipf, zipf-temporal\n"
    "     --layers N --experts N --top-k N --tokens N --zipf-s S --repeat P\n"
    "     --object-bytes N --seed N      (defaults 8, 128, 6, 256, 1.0, 0.5, 3 MiB, 1)\n"
    "  --budget-mib LIST     cache budgets in MiB (default: fractions 0.1,0.25,0.5 of the bank)\n"
    "  --budget-fraction LIST budgets as fractions of all experts' bytes\n"
    "  --host-mib N | --host-fraction F  a host-RAM tier below each budget: two-tier runs per policy\n"
    "                        (policy+host), Belady at budget + host (belady+host) and the static\n"
    "                        allocation (static+host)\n"
    "  --host-admit N        requests before an evicted expert is admitted to the host tier (default 2)\n"
    "  --policies LIST       default lru,sglang-lfu,decay,decay-bypass (Belady and the static\n"
    "                        allocation always run: static pins the most requested experts of the\n"
    "                        whole trace, the best a policy can do on draws without temporal locality)\n"
    "  --half-life-tokens N  decay half-life in tokens (x layers = ticks; default 32)\n"
    "  --json                one JSON object instead of the table\n"
    "slots = floor(budget / largest object); every policy, Belady and static get the same slots.\n";

std::vector<std::string> split(const std::string &s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, sep);)
    if (!item.empty()) out.push_back(item);
  return out;
}

double to_double(const std::string &s, const char *what) {
  char *end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || *end) ep::fail(ep::Status::invalid_argument, "{}: '{}' is not a number", what, s);
  return v;
}

}  // namespace

int main(int argc, char **argv) {
  using namespace ep;
  try {
    std::vector<std::string> trace_paths, synthetic_kinds;
    std::vector<double> budgets_mib, fractions;
    double host_mib = 0, host_fraction = 0;
    uint32_t host_admit = cache::HostTier::kDefaultAdmitRequests;
    std::vector<std::string> policies = cache::policy_names();
    testkit::SyntheticTraceOptions syn;
    cache::TracePhases phases = cache::TracePhases::decode;
    double half_life_tokens = 32;
    bool json = false;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) fail(Status::invalid_argument, "{} needs a value", a);
        return argv[++i];
      };
      if (a == "--help" || a == "-h") {
        std::fputs(kUsage, stdout);
        return 0;
      } else if (a == "--trace") trace_paths.push_back(value());
      else if (a == "--synthetic") synthetic_kinds.push_back(value());
      else if (a == "--phases") {
        const std::string p = value();
        if (p == "decode") phases = cache::TracePhases::decode;
        else if (p == "all") phases = cache::TracePhases::all;
        else fail(Status::invalid_argument, "--phases {}: expected decode or all", p);
      } else if (a == "--budget-mib") {
        for (const auto &s : split(value(), ',')) budgets_mib.push_back(to_double(s, "--budget-mib"));
      } else if (a == "--budget-fraction") {
        for (const auto &s : split(value(), ',')) fractions.push_back(to_double(s, "--budget-fraction"));
      } else if (a == "--host-mib") host_mib = to_double(value(), "--host-mib");
      else if (a == "--host-fraction") host_fraction = to_double(value(), "--host-fraction");
      else if (a == "--host-admit") host_admit = static_cast<uint32_t>(to_double(value(), "--host-admit"));
      else if (a == "--policies") policies = split(value(), ',');
      else if (a == "--half-life-tokens") half_life_tokens = to_double(value(), a.c_str());
      else if (a == "--layers") syn.num_layers = static_cast<uint32_t>(to_double(value(), "--layers"));
      else if (a == "--experts") syn.num_experts = static_cast<uint32_t>(to_double(value(), "--experts"));
      else if (a == "--top-k") syn.top_k = static_cast<uint32_t>(to_double(value(), "--top-k"));
      else if (a == "--tokens") syn.tokens = static_cast<uint32_t>(to_double(value(), "--tokens"));
      else if (a == "--zipf-s") syn.zipf_s = to_double(value(), "--zipf-s");
      else if (a == "--repeat") syn.temporal_repeat = to_double(value(), "--repeat");
      else if (a == "--object-bytes") syn.object_bytes = static_cast<uint64_t>(to_double(value(), "--object-bytes"));
      else if (a == "--seed") syn.seed = static_cast<uint64_t>(to_double(value(), "--seed"));
      else if (a == "--json") json = true;
      else fail(Status::invalid_argument, "unknown argument '{}' (see --help)", a);
    }
    if (trace_paths.empty() && synthetic_kinds.empty()) {
      std::fputs(kUsage, stderr);
      return 2;
    }
    for (const auto &p : policies) cache::make_policy(p);  // validate names early
    if (budgets_mib.empty() && fractions.empty()) fractions = {0.1, 0.25, 0.5};

    std::vector<cache::Trace> traces;
    for (const auto &p : trace_paths) traces.push_back(cache::read_trace(p, phases));
    for (const auto &k : synthetic_kinds) {
      testkit::SyntheticTraceOptions o = syn;
      o.kind = testkit::parse_synthetic_kind(k);
      traces.push_back(testkit::synthetic_trace(o));
    }

    nlohmann::ordered_json out;
    out["tool"] = "ep-cache-sim";
    out["runs"] = nlohmann::ordered_json::array();
    for (const auto &t : traces) {
      const uint64_t slot_bytes = t.max_object_bytes();
      uint64_t bank = 0;
      for (uint32_t l = 0; l < t.num_layers; ++l) bank += t.object_bytes_of(l) * t.num_experts;
      std::vector<uint64_t> budgets;
      for (double m : budgets_mib) budgets.push_back(static_cast<uint64_t>(m * 1024 * 1024));
      for (double f : fractions) budgets.push_back(static_cast<uint64_t>(f * static_cast<double>(bank)));
      uint64_t unique_total = 0;
      const std::vector<cache::LayerSkew> skew = cache::routing_skew(t);
      if (!json) {
        fmt::print("\n{}: {} accesses, {} layers x {} experts, top-k {}, largest object {} B, all experts {:.0f} MiB\n",
                   t.name, t.accesses.size(), t.num_layers, t.num_experts, t.top_k, slot_bytes,
                   static_cast<double>(bank) / (1 << 20));
        fmt::print("  skew (entropy / log2 experts, share of the top 10 % of experts):");
        for (const cache::LayerSkew &k : skew) fmt::print(" L{} {:.3f} {:.3f}", k.layer, k.entropy_ratio, k.top_share);
        fmt::print("\n");
      }
      for (uint64_t budget : budgets) {
        cache::BudgetRequest br;
        br.requested_bytes = budget;
        br.object_bytes = slot_bytes;
        br.top_k = std::max<uint32_t>(1, t.top_k);
        br.tokens_per_acquire = t.tokens_per_acquire;
        br.num_experts = t.num_experts;
        br.total_objects = static_cast<uint64_t>(t.num_layers) * t.num_experts;
        const uint32_t slots = cache::compute_budget(br).slots;
        std::vector<cache::SimResult> results;
        cache::DecayOptions decay;
        decay.half_life_ticks = half_life_tokens * t.num_layers;
        for (const auto &p : policies) {
          auto policy = cache::make_policy(p, decay);
          results.push_back(cache::simulate(t, *policy, slots));
        }
        results.push_back(cache::simulate_belady(t, slots));
        unique_total = results.back().unique_keys;
        results.push_back(cache::simulate_static(t, slots));
        const uint64_t host_bytes =
            host_mib > 0 ? static_cast<uint64_t>(host_mib * 1024 * 1024) : static_cast<uint64_t>(host_fraction * static_cast<double>(bank));
        const uint64_t total_objects = static_cast<uint64_t>(t.num_layers) * t.num_experts;
        const auto host_slots = static_cast<uint32_t>(std::min<uint64_t>(host_bytes / slot_bytes, total_objects - slots));
        if (host_slots > 0) {
          for (const auto &p : policies) {
            auto policy = cache::make_policy(p, decay);
            results.push_back(cache::simulate_two_tier(t, *policy, slots, cache::make_policy(p, decay), host_slots, host_admit));
          }
          cache::SimResult b = cache::simulate_belady(t, slots + host_slots);
          b.policy = "belady+host";
          results.push_back(b);
          results.push_back(cache::simulate_static(t, slots, host_slots));
        }
        nlohmann::ordered_json run;
        run["trace"] = t.name;
        run["budget_bytes"] = budget;
        run["slots"] = slots;
        run["host_slots"] = host_slots;
        run["accesses"] = t.accesses.size();
        run["skew"] = nlohmann::ordered_json::array();
        for (const cache::LayerSkew &k : skew)
          run["skew"].push_back({{"layer", k.layer}, {"picks", k.picks}, {"entropy_ratio", k.entropy_ratio}, {"top_share", k.top_share}});
        run["unique_keys"] = unique_total;
        run["policies"] = nlohmann::ordered_json::object();
        for (const auto &r : results) {
          nlohmann::ordered_json pj;
          pj["hit_rate"] = r.hit_rate();
          pj["bytes_read"] = r.bytes_read;
          pj["host_hits"] = r.host_hits;
          pj["pack_reads"] = r.pack_reads();
          pj["hits"] = r.hits;
          pj["misses"] = r.misses;
          pj["evictions"] = r.evictions;
          run["policies"][r.policy] = pj;
        }
        out["runs"].push_back(run);
        if (!json) {
          fmt::print("  budget {:.0f} MiB = {} slots ({} unique keys requested){}\n", static_cast<double>(budget) / (1 << 20),
                     slots, unique_total, host_slots ? fmt::format(", host tier {} slots", host_slots) : std::string());
          fmt::print("    {:<18} {:>9} {:>10} {:>10} {:>10} {:>12}\n", "policy", "hit rate", "hits", "misses", "host hits",
                     "read GiB");
          for (const auto &r : results)
            fmt::print("    {:<18} {:>8.2f}% {:>10} {:>10} {:>10} {:>12.2f}\n", r.policy, 100.0 * r.hit_rate(), r.hits, r.misses,
                       r.host_hits, static_cast<double>(r.bytes_read) / (1ull << 30));
        }
      }
    }
    if (json) fmt::print("{}\n", out.dump(2));
    return 0;
  } catch (const ep::Error &e) {
    std::fprintf(stderr, "ep-cache-sim: %s: %s\n", ep::status_name(e.status()), e.what());
    return 1;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "ep-cache-sim: %s\n", e.what());
    return 1;
  }
}
