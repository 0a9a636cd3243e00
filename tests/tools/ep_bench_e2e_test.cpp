// ep-synth and ep-bench e2e end to end on a tiny synthetic DeepSeek-V4 (CPU): the routing shape
// follows --zipf, and the e2e report holds real numbers (tokens generated, hit rates in [0, 1],
// SSD bytes > 0 on a cold cache, a positive disk bandwidth and I/O bound).
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
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
  // Hash- and score-routed layers apart (the tiny preset: DeepSeek-V4's first layer routes by
  // token id): together they are the run's counts.
  const auto &hash = j.at("layer_groups").at("hash_routed"), &score = j.at("layer_groups").at("score_routed");
  CHECK(hash.at("layers").get<uint64_t>() >= 1);
  CHECK(hash.at("layers").get<uint64_t>() + score.at("layers").get<uint64_t>() == 3);
  CHECK(hash.at("cache_hits").get<uint64_t>() + score.at("cache_hits").get<uint64_t>() == all.at("cache_hits").get<uint64_t>());
  CHECK(hash.at("cache_misses").get<uint64_t>() + score.at("cache_misses").get<uint64_t>() ==
        all.at("cache_misses").get<uint64_t>());
  CHECK(hash.at("pack_read_bytes").get<uint64_t>() + score.at("pack_read_bytes").get<uint64_t>() ==
        all.at("ssd_bytes").get<uint64_t>());
  // Without prefetch every byte read was asked for.
  CHECK(j.at("prefetch_read_bytes").get<uint64_t>() == 0);
  CHECK(j.at("prefetch_wasted_bytes").get<uint64_t>() == 0);
  CHECK(j.at("used_ssd_bytes") == all.at("ssd_bytes"));
  // Each request's SSD bytes split at its first token; decode's own bound and efficiency come
  // from decode's bytes and time (1 MiB of slots: the generation steps miss too).
  uint64_t decode_bytes = 0;
  for (const auto &r : j["requests"]) {
    CHECK(r.at("prefill_ssd_bytes").get<uint64_t>() + r.at("decode_ssd_bytes").get<uint64_t>() == r.at("ssd_bytes").get<uint64_t>());
    decode_bytes += r.at("decode_ssd_bytes").get<uint64_t>();
  }
  CHECK(all.at("decode_ssd_bytes").get<uint64_t>() == decode_bytes);
  REQUIRE(decode_bytes > 0);
  const double per_token = all.at("decode_ssd_bytes_per_token").get<double>();
  CHECK(std::abs(per_token - static_cast<double>(decode_bytes) / 8) <= 1e-6 * per_token);
  CHECK(std::abs(j.at("decode_bound_tps").get<double>() - disk * 1e9 / per_token) <= 1e-6 * j.at("decode_bound_tps").get<double>());
  const double decode_bound = j.at("decode_io_bound_seconds").get<double>();
  CHECK(std::abs(decode_bound - static_cast<double>(decode_bytes) / (disk * 1e9)) <= 1e-9 + 1e-6 * decode_bound);
  CHECK(std::abs(j.at("decode_measured_seconds").get<double>() - all.at("decode_seconds").get<double>()) <= 1e-9);
  const double decode_eff = j.at("decode_efficiency").get<double>();
  CHECK(std::abs(decode_eff - decode_bound / all.at("decode_seconds").get<double>()) <= 1e-9 + 1e-6 * decode_eff);

  // The decode steps' breakdown, per request and for the run: the four parts are each >= 0 and sum
  // to the decode time; the disk busy is the stall plus the overlap and never more than the time
  // (the generation steps read: the disk was busy).
  auto check_breakdown = [](const nlohmann::json &b, double decode_seconds, bool read) {
    CHECK(std::abs(b.at("decode_seconds").get<double>() - decode_seconds) <= 1e-12);
    double sum = 0, fractions = 0;
    for (const char *k : {"stalled_on_disk", "overlap", "disk_idle_compute", "both_idle"}) {
      const double v = b.at(k).at("seconds").get<double>();
      CHECK(v >= 0);
      sum += v;
      fractions += b.at(k).at("fraction").get<double>();
    }
    CHECK(std::abs(sum - decode_seconds) <= 1e-9 * std::max(1.0, decode_seconds));
    CHECK(std::abs(fractions - 1.0) <= 1e-9);
    const double busy = b.at("disk_busy").at("seconds").get<double>();
    CHECK(busy >= 0);
    if (read) CHECK(busy > 0);
    CHECK(busy <= decode_seconds);
    CHECK(std::abs(busy - b.at("stalled_on_disk").at("seconds").get<double>() - b.at("overlap").at("seconds").get<double>()) <=
          1e-12);
    CHECK(b.at("disk_queue_full").at("seconds").get<double>() <= busy);
  };
  for (const auto &r : j["requests"])
    check_breakdown(r.at("decode_breakdown"), r.at("decode_seconds").get<double>(), r.at("decode_ssd_bytes").get<uint64_t>() > 0);
  check_breakdown(j.at("decode_breakdown"), all.at("decode_seconds").get<double>(), true);
  CHECK(j.at("decode_breakdown") == all.at("decode_breakdown"));
  CHECK(j.at("read_queue_full_depth").get<uint64_t>() >= 1);
  // The stall per layer group is the run's (prompt passes included): together, the store's.
  const double wait = j.at("expert_wait_seconds").get<double>();
  CHECK(wait >= all.at("decode_breakdown").at("stalled_on_disk").at("seconds").get<double>() - 1e-12);
  CHECK(std::abs(hash.at("expert_wait_seconds").get<double>() + score.at("expert_wait_seconds").get<double>() - wait) <= 1e-9);
}

TEST_CASE("ep-bench e2e: --staging-mib sizes staging from the experts of a model whose first layer is dense (Kimi)") {
  // kimi-tiny: block 0 is a dense FFN, the experts start at block 1. --staging-mib must find them
  // (it once looked at block 0 only and refused the model).
  ep::test::TempDir dir;
  const std::string gguf = dir / "k.gguf";
  REQUIRE(run(std::string(EP_SYNTH_EXE) + " --preset kimi-tiny --layers 3 --seed 5 --zipf 0 --out '" + gguf + "' >/dev/null 2>&1") == 0);
  const std::string report = dir / "e2e.json";
  const std::string cmd = std::string(EP_BENCH_EXE) + " e2e --model '" + gguf + "' --workload '" + EP_WORKLOAD_FILE +
                          "' --requests 1 --max-new 2 --ignore-eos --device cpu --cache-mib 1 --staging-mib 1 --io-seconds 0.2 --pack-dir '" +
                          (dir / "packs") + "' --json '" + report + "' >/dev/null 2>&1";
  REQUIRE(run(cmd) == 0);
  const auto j = load(report);
  CHECK(j.at("architecture") == "kimi-k3");
  const uint64_t slot = j.at("slot_bytes").get<uint64_t>(), staging = j.at("staging_slots").get<uint64_t>();
  REQUIRE(slot > 0);
  // 1 MiB of staging in slots of one expert each (slot_bytes is the 4096-aligned expert size)
  CHECK(staging == std::max<uint64_t>(1, (uint64_t{1} << 20) / slot));
  CHECK(j.at("requests").at(0).at("generated_tokens").get<uint32_t>() == 2);
}

TEST_CASE("ep-bench e2e --mode ours,sglang: both in one run, side by side, the same tokens") {
  ep::test::TempDir dir;
  const std::string gguf = synth(dir, "m", "1.5", 3);
  const std::string report = dir / "e2e.json";
  const std::string cmd = std::string(EP_BENCH_EXE) + " e2e --model '" + gguf + "' --workload '" + EP_WORKLOAD_FILE +
                          "' --requests 2 --max-new 4 --ignore-eos --device cpu --cache-mib 1 --host-cache-mib 1 --prefetch"
                          " --mode ours,sglang --io-seconds 0.5 --pack-dir '" +
                          (dir / "packs") + "' --json '" + report + "' >/dev/null 2>&1";
  REQUIRE(run(cmd) == 0);
  const auto j = load(report);
  REQUIRE(j.contains("modes"));
  const auto &ours = j["modes"]["ours"], &sglang = j["modes"]["sglang"];
  CHECK(j.at("mode") == "ours");  // the first mode is also the top level
  CHECK(ours.at("policy") == "decay");
  CHECK(ours.at("overlap") == true);
  CHECK(ours.at("prefetch") == true);
  CHECK(ours.at("host_slots").get<uint64_t>() > 0);
  CHECK(sglang.at("policy") == "sglang-lfu");
  CHECK(sglang.at("overlap") == false);
  CHECK(sglang.at("prefetch") == false);
  CHECK(sglang.at("host_slots").get<uint64_t>() == 0);
  CHECK(sglang.at("host_hits").get<uint64_t>() == 0);
  CHECK(ours.at("cache_slots") == sglang.at("cache_slots"));
  CHECK(ours.at("disk_gbps") == sglang.at("disk_gbps"));  // one measurement for the run
  for (const auto *m : {&ours, &sglang}) CHECK(m->at("all").at("generated_tokens").get<uint64_t>() == 8);
  // The host tier serves some misses: fewer pack bytes than the same slots without it.
  CHECK(ours.at("host_hits").get<uint64_t>() > 0);
  // Efficiency counts the used bytes only: the prefetch reads no acquire asked for are left out.
  const uint64_t read = ours.at("all").at("ssd_bytes").get<uint64_t>(), wasted = ours.at("prefetch_wasted_bytes").get<uint64_t>();
  CHECK(ours.at("prefetch_read_bytes").get<uint64_t>() > 0);
  CHECK(wasted <= ours.at("prefetch_read_bytes").get<uint64_t>());
  CHECK(ours.at("used_ssd_bytes").get<uint64_t>() == read - wasted);
  CHECK(ours.at("decode_used_ssd_bytes").get<uint64_t>() ==
        ours.at("all").at("decode_ssd_bytes").get<uint64_t>() - std::min(wasted, ours.at("all").at("decode_ssd_bytes").get<uint64_t>()));
  const double disk = ours.at("disk_gbps").get<double>();
  const double bound = static_cast<double>(read - wasted) / (disk * 1e9);
  CHECK(std::abs(ours.at("io_bound_seconds").get<double>() - bound) <= 1e-9 + 1e-6 * bound);
  CHECK(sglang.at("prefetch_wasted_bytes").get<uint64_t>() == 0);
  // A mode that does not exist is refused.
  CHECK(run(std::string(EP_BENCH_EXE) + " e2e --model '" + gguf + "' --mode vllm --device cpu --pack-dir '" + (dir / "packs") +
            "' >/dev/null 2>&1") != 0);
}

TEST_CASE("ep-bench e2e --no-pack: the experts read from the GGUF through a source index, the disk measured on it") {
  ep::test::TempDir dir;
  const std::string gguf = synth(dir, "m", "1", 3);
  auto e2e = [&](const std::string &name, const std::string &extra) {
    const std::string report = dir / (name + ".json");
    const std::string cmd = std::string(EP_BENCH_EXE) + " e2e --model '" + gguf + "' --workload '" + EP_WORKLOAD_FILE +
                            "' --requests 2 --max-new 4 --ignore-eos --device cpu --cache-mib 1 --io-seconds 0.3 --pack-dir '" +
                            (dir / name) + "' --json '" + report + "' " + extra + " >/dev/null 2>&1";
    REQUIRE(run(cmd) == 0);
    return load(report);
  };
  const auto packed = e2e("packs", "");
  const auto direct = e2e("index", "--no-pack");
  CHECK(packed.at("no_pack") == false);
  CHECK(direct.at("no_pack") == true);
  const std::string index = direct.at("pack").get<std::string>();
  CHECK(index.size() > 4);
  CHECK(index.substr(index.size() - 4) == ".epx");
  // No pack was written: the directory holds the index and its manifest only.
  for (const auto &entry : std::filesystem::directory_iterator(dir / "index")) {
    const std::string f = entry.path().filename().string();
    INFO(f);
    CHECK((f.size() > 4 && (f.substr(f.size() - 4) == ".epx" || f.substr(f.size() - 9) == ".epx.json")));
  }
  CHECK(direct.at("disk_gbps").get<double>() > 0);
  // The same requests miss the same experts either way (the same cache); from the source each
  // role is read as its 4096-aligned range, so at least the pack's bytes are read.
  CHECK(direct.at("all").at("generated_tokens") == packed.at("all").at("generated_tokens"));
  CHECK(direct.at("all").at("ssd_bytes").get<uint64_t>() >= packed.at("all").at("ssd_bytes").get<uint64_t>());
  for (size_t i = 0; i < 2; ++i)
    CHECK(direct.at("requests").at(i).at("cache_misses") == packed.at("requests").at(i).at("cache_misses"));
}

TEST_CASE("ep-bench e2e --replay-trace: a routing trace's picks in place of the router's") {
  ep::test::TempDir dir;
  const std::string gguf = synth(dir, "m", "1", 3);
  const std::string trace = std::string(EP_TEST_DATA_DIR) + "/traces/bigmoeonedge-route-trace-2026-07-15/qwen.route.csv";
  auto e2e = [&](const std::string &name, const std::string &extra) {
    const std::string report = dir / (name + ".json");
    const std::string cmd = std::string(EP_BENCH_EXE) + " e2e --model '" + gguf + "' --workload '" + EP_WORKLOAD_FILE +
                            "' --requests 1 --max-new 3 --ignore-eos --device cpu --cache-mib 1 --io-seconds 0 --pack-dir '" +
                            (dir / "packs") + "' --json '" + report + "' " + extra + " >/dev/null 2>&1";
    REQUIRE(run(cmd) == 0);
    return load(report);
  };
  const auto routed = e2e("routed", "--mode ours,sglang");
  const auto replayed = e2e("replayed", "--mode ours,sglang --replay-trace '" + trace + "'");
  CHECK(routed.at("replay_trace").is_null());
  for (const char *mode : {"ours", "sglang"}) {
    const auto &m = replayed.at("modes").at(mode);
    CHECK(m.at("replay_trace") == trace);
    CHECK(m.at("all").at("generated_tokens").get<uint64_t>() == 3);
    // Other experts than the router's: another hit count (model_route_replay_test checks the ids).
    CHECK(m.at("all").at("cache_hits") != routed.at("modes").at(mode).at("all").at("cache_hits"));
  }
  // Refused: replay with prefetch (its hints predict the router's picks), a missing trace.
  CHECK(run(std::string(EP_BENCH_EXE) + " e2e --model '" + gguf + "' --device cpu --prefetch --replay-trace '" + trace +
            "' --pack-dir '" + (dir / "packs") + "' >/dev/null 2>&1") != 0);
  CHECK(run(std::string(EP_BENCH_EXE) + " e2e --model '" + gguf + "' --device cpu --replay-trace '" + (dir / "none.csv") +
            "' --pack-dir '" + (dir / "packs") + "' >/dev/null 2>&1") != 0);
}
