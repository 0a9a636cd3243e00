// ep-bench e2e: the endpoint-style workload (bench/workload/seed-10.jsonl: five Alpaca and five
// MMLU requests, one at a time, temperature 0) through the public C API (ep_model_open with the
// consumer-box cache / staging options, ep_generate_chat), reporting per dataset prefill and
// decode tok/s, the unique-key expert-cache hit rate and SSD bytes per generated token (deltas of
// ep_model_store_stats), and per run the I/O bound: SSD miss bytes / the disk's raw O_DIRECT
// bandwidth measured in the same run on the same pack (raw_loop_gbps, as `ep-bench io` does), and
// efficiency = bound / measured time.
#include "bench_common.hpp"

#include "core/error.hpp"
#include "format/gguf.hpp"
#include "io/file.hpp"

#include "expertpack/expertpack.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <string_view>
#include <string>
#include <vector>

namespace ep::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Request {
  int order = 0;
  std::string id;
  std::string dataset;
  std::string prompt;
  uint32_t max_new_tokens = 200;
};

std::vector<Request> read_workload(const std::string &path) {
  std::ifstream f(path);
  if (!f) fail(Status::not_found, "{}: cannot open the workload", path);
  std::vector<Request> out;
  std::string line;
  int line_no = 0;
  while (std::getline(f, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      const auto j = nlohmann::json::parse(line);
      Request r;
      r.order = j.value("order", line_no);
      r.id = j.value("id", fmt::format("line-{}", line_no));
      r.dataset = j.at("dataset").get<std::string>();
      r.prompt = j.at("prompt").get<std::string>();
      r.max_new_tokens = j.value("max_new_tokens", 200u);
      out.push_back(std::move(r));
    } catch (const std::exception &e) {
      fail(Status::format, "{}:{}: expected a JSON object with dataset and prompt: {}", path, line_no, e.what());
    }
  }
  if (out.empty()) fail(Status::format, "{}: no requests", path);
  std::stable_sort(out.begin(), out.end(), [](const Request &a, const Request &b) { return a.order < b.order; });
  return out;
}

void check(ep_status st, const char *what) {
  if (st != EP_OK) fail(static_cast<Status>(st), "{}: {}", what, ep_last_error());
}

/// Bytes of the largest routed expert (gate + up + down of one expert) of a GGUF source, for
/// --staging-mib; 0 when the file is not a GGUF with routed experts.
uint64_t gguf_expert_bytes(const std::string &path) {
  // The largest (gate + up + down) slice of one expert over the MoE layers; blocks without
  // experts (a dense first layer, as in Kimi) are skipped.
  try {
    const auto set = format::GgufSet::open(path);
    std::map<uint64_t, uint64_t> per_layer;
    for (const format::GgufFile &f : set.shards())
      for (const format::GgufTensorInfo &t : f.tensors()) {
        const std::string_view n = t.name;
        if (!n.starts_with("blk.")) continue;
        const size_t dot = n.find('.', 4);
        if (dot == std::string_view::npos) continue;
        const std::string_view rest = n.substr(dot + 1);
        if (rest != "ffn_gate_exps.weight" && rest != "ffn_up_exps.weight" && rest != "ffn_down_exps.weight") continue;
        per_layer[std::stoull(std::string(n.substr(4, dot - 4)))] += t.nbytes / std::max<uint64_t>(1, t.ne[2]);
      }
    uint64_t best = 0;
    for (const auto &[layer, bytes] : per_layer) best = std::max(best, bytes);
    return best;
  } catch (const std::exception &) {
    return 0;
  }
}

struct RequestResult {
  Request req;
  uint32_t prompt_tokens = 0;
  uint32_t generated_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
  double wall_seconds = 0;  ///< the whole ep_generate_chat call
  uint64_t hits = 0, misses = 0, read_bytes = 0, reads = 0, h2d_bytes = 0, evictions = 0;
  uint64_t prefill_read_bytes = 0, decode_read_bytes = 0;  ///< read_bytes split at the first token (ep_generate_stats)
  double prefill_tps() const { return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0; }
  double decode_tps() const { return decode_seconds > 0 ? generated_tokens / decode_seconds : 0; }
};

struct Summary {
  std::string name;
  uint32_t requests = 0;
  double prefill_tps_mean = 0, decode_tps_mean = 0;
  uint64_t prompt_tokens = 0, generated_tokens = 0, hits = 0, misses = 0, read_bytes = 0, decode_read_bytes = 0;
  double seconds = 0, decode_seconds = 0;
  double hit_rate() const { return hits + misses ? static_cast<double>(hits) / static_cast<double>(hits + misses) : 0; }
  /// Every SSD byte of the requests (prompt passes included) per generated token.
  double bytes_per_token() const { return generated_tokens ? static_cast<double>(read_bytes) / generated_tokens : 0; }
  /// SSD bytes of the generation steps only, per generated token: what decode speed depends on.
  double decode_bytes_per_token() const {
    return generated_tokens ? static_cast<double>(decode_read_bytes) / generated_tokens : 0;
  }
};

Summary summarize(const std::string &name, const std::vector<RequestResult> &rs) {
  Summary s;
  s.name = name;
  for (const auto &r : rs) {
    if (name != "all" && r.req.dataset != name) continue;
    ++s.requests;
    s.prefill_tps_mean += r.prefill_tps();
    s.decode_tps_mean += r.decode_tps();
    s.prompt_tokens += r.prompt_tokens;
    s.generated_tokens += r.generated_tokens;
    s.hits += r.hits;
    s.misses += r.misses;
    s.read_bytes += r.read_bytes;
    s.decode_read_bytes += r.decode_read_bytes;
    s.seconds += r.prefill_seconds + r.decode_seconds;
    s.decode_seconds += r.decode_seconds;
  }
  if (s.requests) {
    s.prefill_tps_mean /= s.requests;
    s.decode_tps_mean /= s.requests;
  }
  return s;
}

nlohmann::ordered_json summary_json(const Summary &s) {
  nlohmann::ordered_json j;
  j["requests"] = s.requests;
  j["prefill_tps_mean"] = s.prefill_tps_mean;
  j["decode_tps_mean"] = s.decode_tps_mean;
  j["prompt_tokens"] = s.prompt_tokens;
  j["generated_tokens"] = s.generated_tokens;
  j["cache_hits"] = s.hits;
  j["cache_misses"] = s.misses;
  j["hit_rate"] = s.hit_rate();
  j["ssd_bytes"] = s.read_bytes;
  j["ssd_bytes_per_token"] = s.bytes_per_token();
  j["decode_ssd_bytes"] = s.decode_read_bytes;
  j["decode_ssd_bytes_per_token"] = s.decode_bytes_per_token();
  j["seconds"] = s.seconds;
  j["decode_seconds"] = s.decode_seconds;
  return j;
}

ep_device_kind device_arg(const std::string &d) {
  if (d == "cpu") return EP_DEVICE_CPU;
  if (d == "cuda" || d == "gpu") return EP_DEVICE_CUDA;
  if (d == "auto") return EP_DEVICE_AUTO;
  fail(Status::invalid_argument, "--device: cpu, cuda or auto, not '{}'", d);
}

struct Handles {
  ep_model *model = nullptr;
  ep_tokenizer *tok = nullptr;
  ep_session *session = nullptr;
  Handles() = default;
  Handles(const Handles &) = delete;
  Handles &operator=(const Handles &) = delete;
  ~Handles() {
    ep_session_close(session);
    ep_tokenizer_close(tok);
    ep_model_close(model);
  }
};

}  // namespace

int cmd_e2e(const Args &args) {
  const std::string model_path = args.get("model", "");
  if (model_path.empty()) fail(Status::invalid_argument, "--model PATH is required (a GGUF, or a pack with its manifest)");
  const std::string workload_path = args.get("workload", "bench/workload/seed-10.jsonl");
  const bool open_only = args.has("open-only");
  auto requests = open_only ? std::vector<Request>{} : read_workload(workload_path);
  if (args.options.count("requests"))
    requests.resize(std::min<size_t>(requests.size(), static_cast<size_t>(args.number("requests", 10))));
  const bool has_max_new = args.options.count("max-new") != 0;
  const auto max_new = static_cast<uint32_t>(args.number("max-new", 200));
  const uint64_t mib = 1ull << 20;

  ep_model_options mopt;
  ep_model_options_init(&mopt);
  mopt.device = device_arg(args.get("device", "auto"));
  mopt.cache_budget_bytes = static_cast<uint64_t>(args.number("cache-mib", 0)) * mib;
  mopt.staging_slots = static_cast<uint32_t>(args.number("staging-slots", 0));
  if (args.options.count("staging-mib")) {
    const uint64_t object = gguf_expert_bytes(model_path);
    if (object == 0) fail(Status::invalid_argument, "--staging-mib needs a GGUF model (to size its experts); give --staging-slots");
    const uint64_t slot = io::align_up(object, io::kDirectAlignment);
    mopt.staging_slots = static_cast<uint32_t>(std::max<uint64_t>(1, static_cast<uint64_t>(args.number("staging-mib", 0)) * mib / slot));
  }
  mopt.queue_depth = static_cast<uint32_t>(args.number("queue-depth", 0));
  if (args.options.count("pack-dir")) mopt.pack_dir = args.options.at("pack-dir").c_str();
  if (args.options.count("direct-io")) mopt.direct_io = static_cast<int32_t>(args.number("direct-io", -1));

  Handles h;
  const auto t_open = Clock::now();
  check(ep_model_open(&h.model, model_path.c_str(), &mopt), "open model");
  const double open_seconds = std::chrono::duration<double>(Clock::now() - t_open).count();
  const char *pack_c = ep_model_pack_path(h.model);
  if (!pack_c) fail(Status::invalid_argument, "{}: the model holds its experts in memory; e2e needs an Expert Pack", model_path);
  const std::string pack_path = pack_c;
  ep_model_properties props;
  ep_model_properties_init(&props);
  check(ep_model_info(&props, h.model), "model info");
  if (args.options.count("tokenizer")) check(ep_tokenizer_open(&h.tok, args.options.at("tokenizer").c_str()), "open tokenizer");
  else check(ep_tokenizer_open_model(&h.tok, h.model), "open the model's tokenizer");
  ep_store_stats st0;
  ep_store_stats_init(&st0);
  check(ep_model_store_stats(&st0, h.model), "store stats");
  std::fprintf(stderr, "ep-bench e2e: %s: %u layers, %u experts (top-%u), pack %s, cache %llu slots x %llu B, opened in %.1f s\n",
               props.architecture, props.num_layers, props.num_experts, props.experts_per_token, pack_path.c_str(),
               static_cast<unsigned long long>(st0.cache_slots), static_cast<unsigned long long>(st0.slot_bytes), open_seconds);

  if (open_only) {  // the pack step of scripts/dev/bench-e2e: build (or check) the pack, nothing else
    std::printf("%s\n", pack_path.c_str());
    return 0;
  }

  // The disk's raw bandwidth on this pack, in this run (same cgroup, same file).
  const double io_seconds = args.number("io-seconds", 5);
  const auto io_depth = static_cast<uint32_t>(args.number("io-depth", 32));
  Args pack_args;
  pack_args.options["pack"] = pack_path;
  const PackSource src = pack_from_args(pack_args);
  const uint64_t block = io::align_up(src.layout->max_object_bytes(), io::kDirectAlignment);
  std::vector<double> disk_runs;
  auto measure_disk = [&] {
    if (io_seconds <= 0) return;
    disk_runs.push_back(raw_loop_gbps(src, block, io_depth, io_seconds));
    std::fprintf(stderr, "ep-bench e2e: raw O_DIRECT random reads of %llu B, depth %u: %.3f GB/s\n",
                 static_cast<unsigned long long>(block), io_depth, disk_runs.back());
  };
  measure_disk();

  ep_generate_options gen;
  ep_generate_options_init(&gen);
  gen.temperature = 0;
  gen.ignore_eos = args.has("ignore-eos") ? 1 : 0;
  ep_chat_options chat;
  ep_chat_options_init(&chat);
  if (args.options.count("thinking")) chat.thinking = static_cast<int32_t>(args.number("thinking", -1));

  std::vector<RequestResult> results;
  for (const Request &rq : requests) {
    RequestResult r;
    r.req = rq;
    gen.max_new_tokens = has_max_new ? max_new : rq.max_new_tokens;
    check(ep_session_open(&h.session, h.model), "open session");
    ep_store_stats a, b;
    ep_store_stats_init(&a);
    ep_store_stats_init(&b);
    check(ep_model_store_stats(&a, h.model), "store stats");
    ep_generate_stats gs;
    ep_generate_stats_init(&gs);
    const ep_chat_message msg{"user", rq.prompt.c_str(), nullptr};
    const auto t0 = Clock::now();
    check(ep_generate_chat(&gs, h.session, h.tok, &msg, 1, &chat, &gen, nullptr, nullptr), "generate");
    r.wall_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    check(ep_model_store_stats(&b, h.model), "store stats");
    ep_session_close(h.session);
    h.session = nullptr;
    r.prompt_tokens = gs.prompt_tokens;
    r.generated_tokens = gs.generated_tokens;
    r.prefill_seconds = gs.prefill_seconds;
    r.decode_seconds = gs.decode_seconds;
    r.hits = b.cache_hits - a.cache_hits;
    r.misses = b.cache_misses - a.cache_misses;
    r.read_bytes = b.pack_read_bytes - a.pack_read_bytes;
    r.reads = b.pack_reads - a.pack_reads;
    r.h2d_bytes = b.h2d_bytes - a.h2d_bytes;
    r.evictions = b.cache_evictions - a.cache_evictions;
    r.prefill_read_bytes = gs.prefill_expert_bytes;
    r.decode_read_bytes = gs.decode_expert_bytes;
    std::fprintf(stderr, "ep-bench e2e: %2d %-28s %4u prompt %4u new  prefill %8.2f tok/s  decode %7.3f tok/s  hit %.3f  %.1f MB read\n",
                 rq.order, rq.id.c_str(), r.prompt_tokens, r.generated_tokens, r.prefill_tps(), r.decode_tps(),
                 r.hits + r.misses ? static_cast<double>(r.hits) / static_cast<double>(r.hits + r.misses) : 0.0,
                 static_cast<double>(r.read_bytes) / 1e6);
    results.push_back(r);
  }
  measure_disk();
  double disk_gbps = 0;
  for (double g : disk_runs) disk_gbps += g;
  if (!disk_runs.empty()) disk_gbps /= static_cast<double>(disk_runs.size());

  std::vector<std::string> datasets;
  for (const auto &r : results)
    if (std::find(datasets.begin(), datasets.end(), r.req.dataset) == datasets.end()) datasets.push_back(r.req.dataset);
  std::vector<Summary> sums;
  for (const auto &d : datasets) sums.push_back(summarize(d, results));
  const Summary all = summarize("all", results);
  const double bound_seconds = disk_gbps > 0 ? static_cast<double>(all.read_bytes) / (disk_gbps * 1e9) : 0;
  const double efficiency = all.seconds > 0 ? bound_seconds / all.seconds : 0;
  // Decode alone: its own SSD bytes against its own time (the prompt passes read far more per token).
  const double decode_bound_tps =
      disk_gbps > 0 && all.decode_bytes_per_token() > 0 ? disk_gbps * 1e9 / all.decode_bytes_per_token() : 0;
  const double decode_bound_seconds = disk_gbps > 0 ? static_cast<double>(all.decode_read_bytes) / (disk_gbps * 1e9) : 0;
  const double decode_efficiency = all.decode_seconds > 0 ? decode_bound_seconds / all.decode_seconds : 0;
  ep_store_stats st1;
  ep_store_stats_init(&st1);
  check(ep_model_store_stats(&st1, h.model), "store stats");

  nlohmann::ordered_json j;
  j["bench"] = "e2e";
  j["model"] = model_path;
  j["pack"] = pack_path;
  j["workload"] = workload_path;
  j["device"] = args.get("device", "auto");
  j["architecture"] = props.architecture;
  j["layers"] = props.num_layers;
  j["experts"] = props.num_experts;
  j["experts_per_token"] = props.experts_per_token;
  j["cache_mib"] = mopt.cache_budget_bytes / mib;
  j["cache_slots"] = st1.cache_slots;
  j["slot_bytes"] = st1.slot_bytes;
  j["staging_slots"] = mopt.staging_slots;
  j["max_new_tokens"] = has_max_new ? max_new : 0;
  j["ignore_eos"] = gen.ignore_eos != 0;
  j["open_seconds"] = open_seconds;
  j["disk_gbps"] = disk_gbps;
  j["disk_runs_gbps"] = disk_runs;
  j["disk_object_bytes"] = block;
  j["io_bound_seconds"] = bound_seconds;
  j["measured_seconds"] = all.seconds;
  j["efficiency"] = efficiency;
  j["decode_bound_tps"] = decode_bound_tps;
  j["decode_io_bound_seconds"] = decode_bound_seconds;
  j["decode_measured_seconds"] = all.decode_seconds;
  j["decode_efficiency"] = decode_efficiency;
  j["fallback_count"] = st1.fallback_count;
  j["io_errors"] = st1.io_errors;
  j["all"] = summary_json(all);
  for (const auto &s : sums) j["datasets"][s.name] = summary_json(s);
  auto rows = nlohmann::ordered_json::array();
  for (const auto &r : results)
    rows.push_back({{"order", r.req.order},
                    {"id", r.req.id},
                    {"dataset", r.req.dataset},
                    {"prompt_tokens", r.prompt_tokens},
                    {"generated_tokens", r.generated_tokens},
                    {"prefill_seconds", r.prefill_seconds},
                    {"decode_seconds", r.decode_seconds},
                    {"wall_seconds", r.wall_seconds},
                    {"prefill_tps", r.prefill_tps()},
                    {"decode_tps", r.decode_tps()},
                    {"cache_hits", r.hits},
                    {"cache_misses", r.misses},
                    {"ssd_bytes", r.read_bytes},
                    {"prefill_ssd_bytes", r.prefill_read_bytes},
                    {"decode_ssd_bytes", r.decode_read_bytes},
                    {"ssd_reads", r.reads},
                    {"h2d_bytes", r.h2d_bytes},
                    {"evictions", r.evictions}});
  j["requests"] = rows;
  if (args.options.count("json")) {
    std::ofstream f(args.options.at("json"));
    if (!f) fail(Status::io, "{}: cannot write the JSON report", args.options.at("json"));
    f << j.dump(2) << "\n";
  }
  if (args.has("json-stdout")) {
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("model %s (%u layers), pack %s\n", model_path.c_str(), props.num_layers, pack_path.c_str());
  std::printf("device %s, cache %llu MiB = %llu slots x %.1f MiB, staging slots %s\n", args.get("device", "auto").c_str(),
              static_cast<unsigned long long>(mopt.cache_budget_bytes / mib), static_cast<unsigned long long>(st1.cache_slots),
              static_cast<double>(st1.slot_bytes) / static_cast<double>(mib),
              mopt.staging_slots ? std::to_string(mopt.staging_slots).c_str() : "auto");
  std::printf("%-8s %4s %12s %12s %9s %14s %17s %12s\n", "dataset", "req", "prefill t/s", "decode t/s", "hit rate",
              "SSD MB/token", "decode MB/token", "new tokens");
  for (const Summary *s : [&] {
         std::vector<const Summary *> v;
         for (const auto &x : sums) v.push_back(&x);
         v.push_back(&all);
         return v;
       }())
    std::printf("%-8s %4u %12.2f %12.3f %9.4f %14.2f %17.2f %12llu\n", s->name.c_str(), s->requests, s->prefill_tps_mean,
                s->decode_tps_mean, s->hit_rate(), s->bytes_per_token() / 1e6, s->decode_bytes_per_token() / 1e6,
                static_cast<unsigned long long>(s->generated_tokens));
  std::printf("disk (raw O_DIRECT, %llu B reads, depth %u): %.3f GB/s; SSD miss bytes %.3f GB\n",
              static_cast<unsigned long long>(block), io_depth, disk_gbps, static_cast<double>(all.read_bytes) / 1e9);
  std::printf("I/O bound %.2f s vs measured %.2f s (prefill + decode): efficiency %.3f\n", bound_seconds, all.seconds,
              efficiency);
  std::printf("decode only: I/O bound %.2f s vs measured %.2f s: efficiency %.3f; decode bound %.3f tok/s\n",
              decode_bound_seconds, all.decode_seconds, decode_efficiency, decode_bound_tps);
  return 0;
}

}  // namespace ep::bench
