// ep-bench e2e: the endpoint-style workload (bench/workload/seed-10.jsonl: five Alpaca and five
// MMLU requests, one at a time, temperature 0) through the public C API (ep_model_open with the
// consumer-box cache / host tier / staging options, ep_generate_chat), reporting per dataset
// prefill and decode tok/s, the unique-key expert-cache hit rate and SSD bytes per generated token
// (deltas of ep_model_store_stats), and per run the I/O bound: SSD miss bytes / the disk's raw
// O_DIRECT bandwidth measured in the same run on the same pack (raw_loop_gbps, as `ep-bench io`
// does), and efficiency = bound / measured time. --mode ours,sglang runs the workload once per
// mode in the same process (the published SGLang algorithm on this engine beside ours) and
// prints them side by side. --replay-trace FILE: every MoE layer's picks come from a recorded
// routing trace instead of the router (engine/trace_replay.hpp: the mapping onto the model), the
// compute unchanged. decode_breakdown: where the generation steps' time went (the disk busy, the
// model stalled on it, the disk idle while the model computes, both idle; decode_breakdown_json).
#include "bench_common.hpp"

#include "cache/trace.hpp"
#include "capi/model_internal.hpp"
#include "core/error.hpp"
#include "engine/engine.hpp"
#include "engine/trace_replay.hpp"
#include "format/gguf.hpp"
#include "format/pack_file.hpp"
#include "io/file.hpp"
#include "store/pack_object_map.hpp"
#include "store/stats.hpp"

#include "expertpack/expertpack.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
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

/// How many leading MoE layers route by token id (DeepSeek-V4's hash_layer_count; the Kimi family
/// routes every layer by score); -1 when the source does not say (not a GGUF of a known
/// architecture). MoE layer l is the store's layer l (DeepSeek-V4's blocks all have experts).
int64_t hash_routed_layers(const std::string &source) {
  try {
    const auto set = format::GgufSet::open(source);
    const format::GgufValue *arch = set.find("general.architecture");
    if (!arch || arch->type != format::GgufType::string) return -1;
    if (arch->s.starts_with("kimi")) return 0;
    if (arch->s != "deepseek4") return -1;
    const format::GgufValue *n = set.find(arch->s + ".hash_layer_count");
    if (!n) return -1;
    return n->type == format::GgufType::i32 || n->type == format::GgufType::i64 ? n->i : static_cast<int64_t>(n->u);
  } catch (const Error &) {
    return -1;  // a safetensors source: not told apart
  }
}

/// The store's per-layer counts summed over MoE layers [begin, end).
nlohmann::ordered_json layer_group_json(const std::vector<store::LayerStats> &layers, size_t begin, size_t end,
                                        uint64_t generated_tokens) {
  store::LayerStats sum;
  for (size_t l = begin; l < std::min(end, layers.size()); ++l) {
    sum.cache_hits += layers[l].cache_hits;
    sum.cache_misses += layers[l].cache_misses;
    sum.host_hits += layers[l].host_hits;
    sum.pack_reads += layers[l].pack_reads;
    sum.pack_read_bytes += layers[l].pack_read_bytes;
    sum.expert_wait_ns += layers[l].expert_wait_ns;
  }
  nlohmann::ordered_json j;
  j["layers"] = std::min(end, layers.size()) - std::min(begin, layers.size());
  j["cache_hits"] = sum.cache_hits;
  j["cache_misses"] = sum.cache_misses;
  j["hit_rate"] = sum.cache_hits + sum.cache_misses
                      ? static_cast<double>(sum.cache_hits) / static_cast<double>(sum.cache_hits + sum.cache_misses)
                      : 0.0;
  j["host_hits"] = sum.host_hits;
  j["pack_reads"] = sum.pack_reads;
  j["pack_read_bytes"] = sum.pack_read_bytes;
  j["pack_read_bytes_per_token"] = generated_tokens ? static_cast<double>(sum.pack_read_bytes) / generated_tokens : 0.0;
  j["expert_wait_seconds"] = static_cast<double>(sum.expert_wait_ns) * 1e-9;  // the model's thread stalled on these layers' reads
  return j;
}

struct RequestResult {
  Request req;
  uint32_t prompt_tokens = 0;
  uint32_t generated_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
  double wall_seconds = 0;  ///< the whole ep_generate_chat call
  uint64_t hits = 0, misses = 0, host_hits = 0, read_bytes = 0, reads = 0, h2d_bytes = 0, evictions = 0;
  uint64_t prefill_read_bytes = 0, decode_read_bytes = 0;  ///< read_bytes split at the first token (ep_generate_stats)
  /// The store's times over the generation steps (ep_generate_stats; decode_breakdown_json).
  double decode_busy_seconds = 0, decode_full_seconds = 0, decode_wait_seconds = 0, decode_store_idle_seconds = 0;
  double prefill_tps() const { return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0; }
  double decode_tps() const { return decode_seconds > 0 ? generated_tokens / decode_seconds : 0; }
};

struct Summary {
  std::string name;
  uint32_t requests = 0;
  double prefill_tps_mean = 0, decode_tps_mean = 0;
  uint64_t prompt_tokens = 0, generated_tokens = 0, hits = 0, misses = 0, read_bytes = 0, decode_read_bytes = 0;
  double seconds = 0, decode_seconds = 0;
  double decode_busy_seconds = 0, decode_full_seconds = 0, decode_wait_seconds = 0, decode_store_idle_seconds = 0;
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
    s.decode_busy_seconds += r.decode_busy_seconds;
    s.decode_full_seconds += r.decode_full_seconds;
    s.decode_wait_seconds += r.decode_wait_seconds;
    s.decode_store_idle_seconds += r.decode_store_idle_seconds;
  }
  if (s.requests) {
    s.prefill_tps_mean /= s.requests;
    s.decode_tps_mean /= s.requests;
  }
  return s;
}

/// Where the decode steps' wall time went, in seconds and as fractions of it, from the store's
/// times over the generation steps (ep_generate_stats), summed over the requests:
///   stalled_on_disk   = expert_wait: the model's thread blocked waiting for reads (the disk busy);
///   overlap           = read_busy - expert_wait: the disk busy while the model computes;
///   disk_idle_compute = decode - read_busy - store_idle: no read in flight while the model computes
///                       (its work on the host and the device, and its waits for the device: the
///                       router's ids before a layer's reads can be submitted, the sampled token);
///   both_idle         = store_idle: the store's own work (deciding hits, submitting reads, issuing
///                       copies, publishing tables, releasing) with no read in flight.
/// They sum to decode_seconds (disk_idle_compute is the remainder, >= 0 because the store's times
/// are taken inside the decode window); disk_busy = stalled_on_disk + overlap. The model's thread is
/// "computing" whenever it is outside the store: on CUDA that covers the GPU's work and the host's
/// waits for it alike (the host cannot tell them apart without device timing).
nlohmann::ordered_json decode_breakdown_json(double decode, double busy, double full, double wait, double store_idle) {
  nlohmann::ordered_json j;
  const double overlap = busy - wait;
  const double compute = decode - busy - store_idle;
  auto part = [&](const char *name, double seconds) {
    j[name] = {{"seconds", seconds}, {"fraction", decode > 0 ? seconds / decode : 0.0}};
  };
  j["decode_seconds"] = decode;
  part("disk_busy", busy);
  part("disk_queue_full", full);
  part("stalled_on_disk", wait);
  part("overlap", overlap);
  part("disk_idle_compute", compute);
  part("both_idle", store_idle);
  j["identity"] = "stalled_on_disk + overlap + disk_idle_compute + both_idle = decode_seconds; disk_busy = stalled_on_disk + overlap";
  return j;
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
  j["decode_breakdown"] = decode_breakdown_json(s.decode_seconds, s.decode_busy_seconds, s.decode_full_seconds,
                                                s.decode_wait_seconds, s.decode_store_idle_seconds);
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

/// One configuration of the engine's expert delivery, run over the whole workload.
struct Mode {
  std::string name;
  std::string policy;
  uint64_t host_cache_bytes = 0;
  bool overlap = true;
  bool prefetch = false;
};

/// "ours": the flags as given (--policy, --host-cache-mib, --no-overlap, --prefetch);
/// "ours-prefetch": the same with prefetch on; "sglang": the published SGLang algorithm on this
/// engine: its LFU policy, no host tier, no overlap, no prefetch (every miss read on the critical
/// path).
Mode mode_of(const std::string &name, const Args &args) {
  Mode m;
  m.name = name;
  if (name == "sglang") {
    m.policy = "sglang-lfu";
    m.overlap = false;
    return m;
  }
  if (name != "ours" && name != "ours-prefetch")
    fail(Status::invalid_argument, "--mode: ours, ours-prefetch or sglang (comma-separated for several), not '{}'", name);
  m.policy = args.get("policy", "decay");
  m.host_cache_bytes = static_cast<uint64_t>(args.number("host-cache-mib", 0) * 1048576.0);
  m.overlap = !args.has("no-overlap");
  m.prefetch = args.has("prefetch") || name == "ours-prefetch";
  return m;
}

struct ModeRun {
  Mode mode;
  double open_seconds = 0;
  std::vector<RequestResult> results;
  ep_store_stats stats{};  // at the end
  /// Pack bytes read for prefetch hints that no acquire of the run asked for (the store's
  /// prefetch_read_bytes - prefetch_used_read_bytes at the end: the mode's model is fresh).
  uint64_t prefetch_wasted_bytes = 0;
  uint64_t prefetch_read_bytes = 0;
  std::vector<store::LayerStats> layers;  ///< the store's per-layer counts at the end
  int64_t hash_layers = -1;               ///< hash_routed_layers() of the source
  ep_model_properties props{};
  std::string pack_path;
};

/// What the raw O_DIRECT loop reads to measure the disk: the pack's objects, or for a source
/// index (no_pack) object-sized aligned blocks of its largest source file.
PackSource raw_source(const std::string &pack_path) {
  Args pack_args;
  pack_args.options["pack"] = pack_path;
  const auto index = store::PackObjectMap::open(pack_path, false);
  if (!index->pack().source_objects()) return pack_from_args(pack_args);
  std::string largest;
  uint64_t largest_bytes = 0;
  for (const std::string &f : index->pack().data_files())
    if (const uint64_t b = io::file_size_bytes(f); b > largest_bytes) largest = f, largest_bytes = b;
  pack_args.options["pack"] = largest;
  pack_args.options["object-bytes"] = std::to_string(io::align_up(index->max_object_bytes(), io::kDirectAlignment));
  return pack_from_args(pack_args);
}

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
  std::vector<Mode> modes;
  {
    std::string list = args.get("mode", "ours");
    for (size_t at = 0; at <= list.size();) {
      const size_t comma = std::min(list.find(',', at), list.size());
      if (comma > at) modes.push_back(mode_of(list.substr(at, comma - at), args));
      at = comma + 1;
    }
    if (modes.empty()) fail(Status::invalid_argument, "--mode: no mode given");
  }

  ep_model_options mopt;
  ep_model_options_init(&mopt);
  mopt.device = device_arg(args.get("device", "auto"));
  // Several devices (the library refuses it with --device): the cache budget is each device's.
  const std::string devices = args.get("devices", "");
  if (!devices.empty()) mopt.devices = devices.c_str();
  mopt.cache_budget_bytes = static_cast<uint64_t>(args.number("cache-mib", 0) * static_cast<double>(mib));
  mopt.staging_slots = static_cast<uint32_t>(args.number("staging-slots", 0));
  if (args.options.count("staging-mib")) {
    const uint64_t object = gguf_expert_bytes(model_path);
    if (object == 0) fail(Status::invalid_argument, "--staging-mib needs a GGUF model (to size its experts); give --staging-slots");
    const uint64_t slot = io::align_up(object, io::kDirectAlignment);
    mopt.staging_slots = static_cast<uint32_t>(std::max<uint64_t>(1, static_cast<uint64_t>(args.number("staging-mib", 0) * static_cast<double>(mib)) / slot));
  }
  mopt.queue_depth = static_cast<uint32_t>(args.number("queue-depth", 0));
  if (args.options.count("pack-dir")) mopt.pack_dir = args.options.at("pack-dir").c_str();
  if (args.options.count("direct-io")) mopt.direct_io = static_cast<int32_t>(args.number("direct-io", -1));
  mopt.no_pack = args.has("no-pack") ? 1 : 0;

  ep_generate_options gen;
  ep_generate_options_init(&gen);
  gen.temperature = 0;
  gen.ignore_eos = args.has("ignore-eos") ? 1 : 0;
  ep_chat_options chat;
  ep_chat_options_init(&chat);
  if (args.options.count("thinking")) chat.thinking = static_cast<int32_t>(args.number("thinking", -1));

  // Read once: each mode replays the trace from its start on a fresh model.
  const std::string replay_path = args.get("replay-trace", "");
  std::optional<cache::Trace> replay_trace;
  if (!replay_path.empty()) {
    for (const Mode &mode : modes)
      if (mode.prefetch)
        fail(Status::invalid_argument, "--replay-trace with mode {}: prefetch predicts the router's picks, not the replayed ones",
             mode.name);
    replay_trace = cache::read_trace(replay_path);
  }

  const double io_seconds = args.number("io-seconds", 5);
  const auto io_depth = static_cast<uint32_t>(args.number("io-depth", 32));
  std::vector<double> disk_runs;
  uint64_t block = 0;
  std::vector<ModeRun> runs;
  for (size_t mi = 0; mi < modes.size(); ++mi) {
    const Mode &mode = modes[mi];
    ModeRun run;
    run.mode = mode;
    mopt.cache_policy = mode.policy.c_str();
    mopt.host_cache_bytes = mode.host_cache_bytes;
    mopt.overlap_reads = mode.overlap ? 1 : 0;
    mopt.prefetch = mode.prefetch ? 1 : 0;
    Handles h;
    const auto t_open = Clock::now();
    check(ep_model_open(&h.model, model_path.c_str(), &mopt), "open model");
    run.open_seconds = std::chrono::duration<double>(Clock::now() - t_open).count();
    const char *pack_c = ep_model_pack_path(h.model);
    if (!pack_c) fail(Status::invalid_argument, "{}: the model holds its experts in memory; e2e needs an Expert Pack", model_path);
    run.pack_path = pack_c;
    ep_model_properties_init(&run.props);
    check(ep_model_info(&run.props, h.model), "model info");
    if (replay_trace)
      capi::model_engine(*h.model).set_route_override(
          std::make_shared<engine::TraceReplay>(*replay_trace, run.props.num_experts, run.props.experts_per_token));
    if (args.options.count("tokenizer")) check(ep_tokenizer_open(&h.tok, args.options.at("tokenizer").c_str()), "open tokenizer");
    else check(ep_tokenizer_open_model(&h.tok, h.model), "open the model's tokenizer");
    ep_store_stats st0;
    ep_store_stats_init(&st0);
    check(ep_model_store_stats(&st0, h.model), "store stats");
    std::fprintf(stderr,
                 "ep-bench e2e [%s]: %s: %u layers, %u experts (top-%u), pack %s, cache %llu slots x %llu B, host tier %llu slots, "
                 "policy %s, overlap %s, prefetch %s, opened in %.1f s\n",
                 mode.name.c_str(), run.props.architecture, run.props.num_layers, run.props.num_experts,
                 run.props.experts_per_token, run.pack_path.c_str(), static_cast<unsigned long long>(st0.cache_slots),
                 static_cast<unsigned long long>(st0.slot_bytes), static_cast<unsigned long long>(st0.host_slots),
                 mode.policy.c_str(), mode.overlap ? "on" : "off", mode.prefetch ? "on" : "off", run.open_seconds);
    if (open_only) {  // the pack step of scripts/dev/bench-e2e: build (or check) the pack, nothing else
      std::printf("%s\n", run.pack_path.c_str());
      return 0;
    }
    if (mi == 0) {
      // The disk's raw bandwidth on the files the experts are read from, in this run (same
      // cgroup, same files): before the first mode and after the last.
      const PackSource src = raw_source(run.pack_path);
      block = io::align_up(src.layout->max_object_bytes(), io::kDirectAlignment);
      if (io_seconds > 0) {
        disk_runs.push_back(raw_loop_gbps(src, block, io_depth, io_seconds));
        std::fprintf(stderr, "ep-bench e2e: raw O_DIRECT random reads of %llu B, depth %u: %.3f GB/s\n",
                     static_cast<unsigned long long>(block), io_depth, disk_runs.back());
      }
    }
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
      r.host_hits = b.host_hits - a.host_hits;
      r.read_bytes = b.pack_read_bytes - a.pack_read_bytes;
      r.reads = b.pack_reads - a.pack_reads;
      r.h2d_bytes = b.h2d_bytes - a.h2d_bytes;
      r.evictions = b.cache_evictions - a.cache_evictions;
      r.prefill_read_bytes = gs.prefill_expert_bytes;
      r.decode_read_bytes = gs.decode_expert_bytes;
      r.decode_busy_seconds = gs.decode_read_busy_seconds;
      r.decode_full_seconds = gs.decode_read_full_seconds;
      r.decode_wait_seconds = gs.decode_expert_wait_seconds;
      r.decode_store_idle_seconds = gs.decode_store_idle_seconds;
      std::fprintf(stderr,
                   "ep-bench e2e [%s]: %2d %-28s %4u prompt %4u new  prefill %8.2f tok/s  decode %7.3f tok/s  hit %.3f  %.1f MB read\n",
                   mode.name.c_str(), rq.order, rq.id.c_str(), r.prompt_tokens, r.generated_tokens, r.prefill_tps(), r.decode_tps(),
                   r.hits + r.misses ? static_cast<double>(r.hits) / static_cast<double>(r.hits + r.misses) : 0.0,
                   static_cast<double>(r.read_bytes) / 1e6);
      run.results.push_back(r);
    }
    ep_store_stats_init(&run.stats);
    check(ep_model_store_stats(&run.stats, h.model), "store stats");
    const store::StoreStats internal = capi::model_engine(*h.model).store_stats();
    run.prefetch_read_bytes = internal.prefetch_read_bytes;
    run.layers = internal.layers;
    run.hash_layers = hash_routed_layers(capi::model_engine(*h.model).source_path());
    run.prefetch_wasted_bytes = internal.prefetch_read_bytes - internal.prefetch_used_read_bytes;
    runs.push_back(std::move(run));
  }
  if (io_seconds > 0 && !disk_runs.empty()) {
    disk_runs.push_back(raw_loop_gbps(raw_source(runs.back().pack_path), block, io_depth, io_seconds));
    std::fprintf(stderr, "ep-bench e2e: raw O_DIRECT random reads of %llu B, depth %u: %.3f GB/s\n",
                 static_cast<unsigned long long>(block), io_depth, disk_runs.back());
  }
  double disk_gbps = 0;
  for (double g : disk_runs) disk_gbps += g;
  if (!disk_runs.empty()) disk_gbps /= static_cast<double>(disk_runs.size());

  // One report per mode (the first mode's is also the top level, as with a single mode).
  struct Report {
    nlohmann::ordered_json json;
    Summary all;
    double efficiency = 0, decode_efficiency = 0, decode_bound_tps = 0;
  };
  std::vector<Report> reports;
  for (const ModeRun &run : runs) {
    const auto &results = run.results;
    const ep_store_stats &st1 = run.stats;
    std::vector<std::string> datasets;
    for (const auto &r : results)
      if (std::find(datasets.begin(), datasets.end(), r.req.dataset) == datasets.end()) datasets.push_back(r.req.dataset);
    std::vector<Summary> sums;
    for (const auto &d : datasets) sums.push_back(summarize(d, results));
    const Summary all = summarize("all", results);
    // Efficiency counts only the bytes that were used: prefetch reads no acquire asked for are
    // waste, reported beside it. The store counts them per run, not per phase, so a run's whole
    // waste is taken from its decode bytes (a prompt pass's unused prefetches too): the decode
    // figure is a lower bound where prefetch is on, exact where it is off.
    const uint64_t wasted = run.prefetch_wasted_bytes;
    const uint64_t used_bytes = all.read_bytes - std::min(wasted, all.read_bytes);
    const uint64_t decode_used_bytes = all.decode_read_bytes - std::min(wasted, all.decode_read_bytes);
    const double bound_seconds = disk_gbps > 0 ? static_cast<double>(used_bytes) / (disk_gbps * 1e9) : 0;
    const double efficiency = all.seconds > 0 ? bound_seconds / all.seconds : 0;
    // Decode alone: its own used SSD bytes against its own time (the prompt passes read far more per token).
    const double decode_used_per_token = all.generated_tokens ? static_cast<double>(decode_used_bytes) / all.generated_tokens : 0;
    const double decode_bound_tps = disk_gbps > 0 && decode_used_per_token > 0 ? disk_gbps * 1e9 / decode_used_per_token : 0;
    const double decode_bound_seconds = disk_gbps > 0 ? static_cast<double>(decode_used_bytes) / (disk_gbps * 1e9) : 0;
    const double decode_efficiency = all.decode_seconds > 0 ? decode_bound_seconds / all.decode_seconds : 0;

    nlohmann::ordered_json j;
    j["bench"] = "e2e";
    j["mode"] = run.mode.name;
    j["policy"] = run.mode.policy;
    j["overlap"] = run.mode.overlap;
    j["prefetch"] = run.mode.prefetch;
    j["model"] = model_path;
    j["pack"] = run.pack_path;
    j["no_pack"] = mopt.no_pack != 0;
    j["workload"] = workload_path;
    j["replay_trace"] = replay_path.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(replay_path);
    j["device"] = args.get("device", "auto");
    j["devices"] = devices;
    j["architecture"] = run.props.architecture;
    j["layers"] = run.props.num_layers;
    j["experts"] = run.props.num_experts;
    j["experts_per_token"] = run.props.experts_per_token;
    j["cache_mib"] = mopt.cache_budget_bytes / mib;
    j["cache_slots"] = st1.cache_slots;
    j["slot_bytes"] = st1.slot_bytes;
    j["host_cache_mib"] = run.mode.host_cache_bytes / mib;
    j["host_slots"] = st1.host_slots;
    j["staging_slots"] = mopt.staging_slots;
    j["max_new_tokens"] = has_max_new ? max_new : 0;
    j["ignore_eos"] = gen.ignore_eos != 0;
    j["open_seconds"] = run.open_seconds;
    j["disk_gbps"] = disk_gbps;
    j["disk_runs_gbps"] = disk_runs;
    j["disk_object_bytes"] = block;
    j["used_ssd_bytes"] = used_bytes;
    j["prefetch_read_bytes"] = run.prefetch_read_bytes;
    j["prefetch_wasted_bytes"] = wasted;
    j["decode_used_ssd_bytes"] = decode_used_bytes;
    j["io_bound_seconds"] = bound_seconds;
    j["measured_seconds"] = all.seconds;
    j["efficiency"] = efficiency;
    j["decode_bound_tps"] = decode_bound_tps;
    j["decode_io_bound_seconds"] = decode_bound_seconds;
    j["decode_measured_seconds"] = all.decode_seconds;
    j["decode_efficiency"] = decode_efficiency;
    j["fallback_count"] = st1.fallback_count;
    j["io_errors"] = st1.io_errors;
    j["host_hits"] = st1.host_hits;
    j["host_misses"] = st1.host_misses;
    j["demotions"] = st1.demotions;
    j["host_resident_bytes"] = st1.host_resident_bytes;
    j["prefetch_issued"] = st1.prefetch_issued;
    j["prefetch_used"] = st1.prefetch_used;
    j["read_queue_full_depth"] = st1.pack_read_full_depth;
    j["expert_wait_seconds"] = static_cast<double>(st1.expert_wait_ns) * 1e-9;  // the whole run's stall, prompt passes too
    // The decode steps' breakdown of every request together (per dataset and per request below too).
    j["decode_breakdown"] = summary_json(all)["decode_breakdown"];
    // Hash- and score-routed layers apart (the whole run, prompt passes included), where the
    // source tells which are which.
    if (run.hash_layers >= 0) {
      const auto n_hash = static_cast<size_t>(run.hash_layers);
      j["layer_groups"]["hash_routed"] = layer_group_json(run.layers, 0, n_hash, all.generated_tokens);
      j["layer_groups"]["score_routed"] = layer_group_json(run.layers, n_hash, run.layers.size(), all.generated_tokens);
    } else {
      j["layer_groups"] = nullptr;
    }
    j["all"] = summary_json(all);
    for (const auto &sm : sums) j["datasets"][sm.name] = summary_json(sm);
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
                      {"host_hits", r.host_hits},
                      {"ssd_bytes", r.read_bytes},
                      {"prefill_ssd_bytes", r.prefill_read_bytes},
                      {"decode_ssd_bytes", r.decode_read_bytes},
                      {"decode_breakdown", decode_breakdown_json(r.decode_seconds, r.decode_busy_seconds, r.decode_full_seconds,
                                                                 r.decode_wait_seconds, r.decode_store_idle_seconds)},
                      {"ssd_reads", r.reads},
                      {"h2d_bytes", r.h2d_bytes},
                      {"evictions", r.evictions}});
    j["requests"] = rows;
    Report rep;
    rep.json = std::move(j);
    rep.all = all;
    rep.efficiency = efficiency;
    rep.decode_efficiency = decode_efficiency;
    rep.decode_bound_tps = decode_bound_tps;
    reports.push_back(std::move(rep));

    if (args.has("json-stdout")) continue;
    std::printf("[%s] model %s (%u layers), pack %s\n", run.mode.name.c_str(), model_path.c_str(), run.props.num_layers,
                run.pack_path.c_str());
    std::printf("[%s] device %s, cache %llu MiB = %llu slots x %.1f MiB, host tier %llu slots, staging slots %s, policy %s, overlap %s, "
                "prefetch %s\n",
                run.mode.name.c_str(), devices.empty() ? args.get("device", "auto").c_str() : devices.c_str(), static_cast<unsigned long long>(mopt.cache_budget_bytes / mib),
                static_cast<unsigned long long>(st1.cache_slots), static_cast<double>(st1.slot_bytes) / static_cast<double>(mib),
                static_cast<unsigned long long>(st1.host_slots), mopt.staging_slots ? std::to_string(mopt.staging_slots).c_str() : "auto",
                run.mode.policy.c_str(), run.mode.overlap ? "on" : "off", run.mode.prefetch ? "on" : "off");
    std::printf("%-8s %4s %12s %12s %9s %14s %17s %12s\n", "dataset", "req", "prefill t/s", "decode t/s", "hit rate",
                "SSD MB/token", "decode MB/token", "new tokens");
    std::vector<const Summary *> v;
    for (const auto &x : sums) v.push_back(&x);
    v.push_back(&all);
    for (const Summary *sm : v)
      std::printf("%-8s %4u %12.2f %12.3f %9.4f %14.2f %17.2f %12llu\n", sm->name.c_str(), sm->requests, sm->prefill_tps_mean,
                  sm->decode_tps_mean, sm->hit_rate(), sm->bytes_per_token() / 1e6, sm->decode_bytes_per_token() / 1e6,
                  static_cast<unsigned long long>(sm->generated_tokens));
    if (st1.host_slots)
      std::printf("host tier: %llu hits, %llu misses, %llu demotions, %.1f MiB resident\n",
                  static_cast<unsigned long long>(st1.host_hits), static_cast<unsigned long long>(st1.host_misses),
                  static_cast<unsigned long long>(st1.demotions), static_cast<double>(st1.host_resident_bytes) / static_cast<double>(mib));
    if (run.hash_layers >= 0)
      for (const char *group : {"hash_routed", "score_routed"}) {
        const auto &g = reports.back().json["layer_groups"][group];
        std::printf("%s layers (%llu, whole run): hit rate %.4f, %.2f MB read per generated token\n", group,
                    static_cast<unsigned long long>(g["layers"].get<uint64_t>()), g["hit_rate"].get<double>(),
                    g["pack_read_bytes_per_token"].get<double>() / 1e6);
      }
    if (run.mode.prefetch)
      std::printf("prefetch: %llu issued, %llu used\n", static_cast<unsigned long long>(st1.prefetch_issued),
                  static_cast<unsigned long long>(st1.prefetch_used));
    std::printf("disk (raw O_DIRECT, %llu B reads, depth %u): %.3f GB/s; SSD bytes %.3f GB, of them unused prefetch %.3f GB\n",
                static_cast<unsigned long long>(block), io_depth, disk_gbps, static_cast<double>(all.read_bytes) / 1e9,
                static_cast<double>(wasted) / 1e9);
    std::printf("I/O bound of the used bytes %.2f s vs measured %.2f s (prefill + decode): efficiency %.3f\n", bound_seconds,
                all.seconds, efficiency);
    std::printf("decode only: I/O bound %.2f s vs measured %.2f s: efficiency %.3f; decode bound %.3f tok/s\n",
                decode_bound_seconds, all.decode_seconds, decode_efficiency, decode_bound_tps);
    {
      const auto &b = reports.back().json["decode_breakdown"];
      auto sec = [&](const char *k) { return b[k]["seconds"].get<double>(); };
      auto pct = [&](const char *k) { return 100.0 * b[k]["fraction"].get<double>(); };
      std::printf("decode %.2f s: disk busy %.2f s (%.1f %%; queue of %llu full %.1f %%) = stalled on the disk %.2f s (%.1f %%) + "
                  "overlap %.2f s (%.1f %%); disk idle while computing %.2f s (%.1f %%); both idle (the store's work) %.2f s (%.1f %%)\n",
                  all.decode_seconds, sec("disk_busy"), pct("disk_busy"), static_cast<unsigned long long>(st1.pack_read_full_depth),
                  pct("disk_queue_full"), sec("stalled_on_disk"), pct("stalled_on_disk"), sec("overlap"), pct("overlap"),
                  sec("disk_idle_compute"), pct("disk_idle_compute"), sec("both_idle"), pct("both_idle"));
      if (run.hash_layers >= 0) {
        const auto &g = reports.back().json["layer_groups"];
        std::printf("stalled on the disk per layer group (whole run): hash-routed %.2f s, score-routed %.2f s\n",
                    g["hash_routed"]["expert_wait_seconds"].get<double>(), g["score_routed"]["expert_wait_seconds"].get<double>());
      }
      std::printf("\n");
    }
  }

  nlohmann::ordered_json top = reports.front().json;
  if (reports.size() > 1) {
    top["modes"] = nlohmann::ordered_json::object();
    for (const Report &r : reports) top["modes"][r.json["mode"].get<std::string>()] = r.json;
  }
  if (args.options.count("json")) {
    std::ofstream f(args.options.at("json"));
    if (!f) fail(Status::io, "{}: cannot write the JSON report", args.options.at("json"));
    f << top.dump(2) << "\n";
  }
  if (args.has("json-stdout")) {
    std::printf("%s\n", top.dump().c_str());
    return 0;
  }
  if (reports.size() > 1) {
    // The modes side by side; ratios against the first sglang mode when there is one.
    const Report *base = nullptr;
    for (const Report &r : reports)
      if (r.json["mode"] == "sglang") base = &r;
    std::printf("%-14s %12s %12s %9s %10s %14s %17s %10s %10s %12s\n", "mode", "prefill t/s", "decode t/s", "hit rate",
                "host hits", "SSD MB/token", "decode MB/token", "decode eff", "x decode", "x SSD bytes");
    for (const Report &r : reports) {
      const double x_tps = base && base->all.decode_tps_mean > 0 ? r.all.decode_tps_mean / base->all.decode_tps_mean : 0;
      const double x_bytes =
          base && base->all.decode_bytes_per_token() > 0 ? r.all.decode_bytes_per_token() / base->all.decode_bytes_per_token() : 0;
      std::printf("%-14s %12.2f %12.3f %9.4f %10llu %14.2f %17.2f %10.3f %10.2f %12.3f\n", r.json["mode"].get<std::string>().c_str(),
                  r.all.prefill_tps_mean, r.all.decode_tps_mean, r.all.hit_rate(),
                  static_cast<unsigned long long>(r.json["host_hits"].get<uint64_t>()), r.all.bytes_per_token() / 1e6,
                  r.all.decode_bytes_per_token() / 1e6, r.decode_efficiency, x_tps, x_bytes);
    }
  }
  return 0;
}

}  // namespace ep::bench
