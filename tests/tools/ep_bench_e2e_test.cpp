// ep-synth and ep-bench e2e end to end on a tiny synthetic DeepSeek-V4 (CPU): the routing shape
// follows --zipf, and the e2e report holds real numbers (tokens generated, hit rates in [0, 1],
// SSD bytes > 0 on a cold cache, a positive disk bandwidth and I/O bound).
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>

namespace {

int run(const std::string &cmd) {
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

nlohmann::json load(const std::string &path) {
  std::ifstream f(path);
  REQUIRE(f.good());
  return nlohmann::json::parse(f);
}

std::string synth(const ep::test::TempDir &dir, const std::string &name, const std::string &zipf, int layers) {
  const std::string gguf = dir / (name + ".gguf");
  const std::string cmd = std::string(EP_SYNTH_EXE) + " --preset tiny --layers " + std::to_string(layers) + " --seed 3 --zipf " +
                          zipf + " --route-samples 1500 --out '" + gguf + "' --json '" + (dir / (name + ".json")) + "' >/dev/null";
  REQUIRE(run(cmd) == 0);
  return gguf;
}

}  // namespace

TEST_CASE("ep-synth: --zipf shapes the routing, the report measures it") {
  ep::test::TempDir dir;
  synth(dir, "z0", "0", 3);
  synth(dir, "z2", "2", 3);
  const auto u = load(dir / "z0.json"), s = load(dir / "z2.json");
  REQUIRE(u.at("routing").size() == 3);
  REQUIRE(s.at("routing").size() == 3);
  REQUIRE(u.at("file_bytes").get<uint64_t>() > 0);
  // Uniform: near-maximal entropy, top 10% of experts (4 of 32) near 4/32 of the picks.
  CHECK(u.at("mean_entropy_norm").get<double>() > 0.97);
  CHECK(u.at("mean_top10_share").get<double>() < 0.2);
  // Zipf 2: clearly skewed, in every layer (hash and router layers alike).
  for (size_t i = 0; i < 3; ++i) {
    CHECK(s["routing"][i]["entropy_norm"].get<double>() < u["routing"][i]["entropy_norm"].get<double>() - 0.05);
    CHECK(s["routing"][i]["top10_share"].get<double>() > 0.3);
  }
  // Without --zipf the model is the library's default synthetic one (zipf null in the report).
  REQUIRE(run(std::string(EP_SYNTH_EXE) + " --preset tiny --layers 2 --route-samples 0 --out '" + (dir / "d.gguf") +
              "' --json '" + (dir / "d.json") + "' >/dev/null") == 0);
  CHECK(load(dir / "d.json").at("zipf").is_null());
  // Bad arguments fail clearly.
  CHECK(run(std::string(EP_SYNTH_EXE) + " --preset tiny --zipf -1 --out '" + (dir / "x.gguf") + "' 2>/dev/null") != 0);
  CHECK(run(std::string(EP_SYNTH_EXE) + " --preset huge --out '" + (dir / "x.gguf") + "' 2>/dev/null") != 0);
}

TEST_CASE("ep-bench e2e: two requests on a tiny synthetic model, cold cache") {
  ep::test::TempDir dir;
  const std::string gguf = synth(dir, "m", "1", 3);
  const std::string report = dir / "e2e.json";
  const std::string cmd = std::string(EP_BENCH_EXE) + " e2e --model '" + gguf + "' --workload '" + EP_WORKLOAD_FILE +
                          "' --requests 2 --max-new 4 --ignore-eos --device cpu --cache-mib 1 --io-seconds 0.5 --pack-dir '" +
                          (dir / "packs") + "' --json '" + report + "' >/dev/null 2>&1";
  REQUIRE(run(cmd) == 0);
  const auto j = load(report);
  REQUIRE(j.at("requests").size() == 2);
  CHECK(j["requests"][0]["dataset"] == "alpaca");
  CHECK(j["requests"][1]["dataset"] == "mmlu");
  for (const auto &r : j["requests"]) {
    CHECK(r.at("generated_tokens").get<uint32_t>() == 4);  // --ignore-eos: exactly --max-new
    CHECK(r.at("prompt_tokens").get<uint32_t>() > 5);
    CHECK(r.at("decode_tps").get<double>() > 0);
    CHECK(r.at("prefill_tps").get<double>() > 0);
    CHECK(r.at("cache_hits").get<uint64_t>() + r.at("cache_misses").get<uint64_t>() > 0);
  }
  // Cold cache: the first request reads from the pack.
  CHECK(j["requests"][0]["ssd_bytes"].get<uint64_t>() > 0);
  CHECK(j["requests"][0]["cache_misses"].get<uint64_t>() > 0);
  for (const char *d : {"alpaca", "mmlu"}) {
    const auto &s = j.at("datasets").at(d);
    CHECK(s.at("requests").get<uint32_t>() == 1);
    const double hit = s.at("hit_rate").get<double>();
    CHECK(hit >= 0.0);
    CHECK(hit <= 1.0);
    CHECK(s.at("decode_tps_mean").get<double>() > 0);
  }
  const auto &all = j.at("all");
  CHECK(all.at("generated_tokens").get<uint64_t>() == 8);
  CHECK(all.at("ssd_bytes_per_token").get<double>() > 0);
  // The consumer-box budget: 1 MiB of slots, far fewer than 3 layers x 32 experts.
  CHECK(j.at("cache_slots").get<uint64_t>() >= 4);
  CHECK(j.at("cache_slots").get<uint64_t>() * j.at("slot_bytes").get<uint64_t>() <= (1u << 20));
  const double disk = j.at("disk_gbps").get<double>();
  REQUIRE(disk > 0);
  REQUIRE(j.at("disk_runs_gbps").size() == 2);  // before and after the requests
  // The bound and the efficiency follow from the measured numbers (their size depends on the
  // disk of the machine, so only the relations are checked).
  const double bound = j.at("io_bound_seconds").get<double>();
  const double expect_bound = all.at("ssd_bytes").get<double>() / (disk * 1e9);
  CHECK(bound > 0);
  CHECK(std::abs(bound - expect_bound) <= 1e-9 + 1e-6 * expect_bound);
  const double measured = j.at("measured_seconds").get<double>();
  CHECK(measured > 0);
  CHECK(std::abs(measured - all.at("seconds").get<double>()) <= 1e-9);
  const double eff = j.at("efficiency").get<double>();
  CHECK(std::abs(eff - bound / measured) <= 1e-9 + 1e-6 * eff);
  CHECK(std::abs(j.at("decode_bound_tps").get<double>() - disk * 1e9 / all.at("ssd_bytes_per_token").get<double>()) <=
        1e-6 * j.at("decode_bound_tps").get<double>());
}
