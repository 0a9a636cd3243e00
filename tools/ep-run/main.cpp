// ep-run: generate from or score a token sequence with a model, through the public C API.
#include <expertpack/expertpack.h>

#include "format/ggml_type.hpp"
#include "model/deepseek_v4_synthetic.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

const char *kUsage =
    "usage: ep-run --model PATH --tokens 1,2,3 [-n N] [--temp T] [--top-k-sample K] [--top-p P] [--seed S]\n"
    "              [--stop ID] [--cache-mib MIB] [--score] [--dump-topk FILE [--top-k K]] [--stats]\n"
    "              [--pack-dir DIR] [--no-pack-build] [--resident-experts] [--staging-slots N]\n"
    "              [--queue-depth N] [--read-splits N] [--direct-io 0|1]\n"
    "\n"
    "  --model PATH   a .gguf file (first shard), a directory with config.json + safetensors, or an\n"
    "                 Expert Pack (.epk) with its manifest. A source's routed experts are served from\n"
    "                 its pack, built on first use (with progress) and reused while the source is\n"
    "                 unchanged (a changed source is rebuilt)\n"
    "  --pack-dir DIR where packs of sources live (default $XDG_CACHE_HOME/expertpack, else\n"
    "                 ~/.cache/expertpack)\n"
    "  --no-pack-build  never build: a missing or stale pack is an error\n"
    "  --resident-experts  no pack: read every expert from the source into memory\n"
    "  --cache-mib MIB  expert cache budget, fractions allowed (default: every expert, at most half\n"
    "                 the physical memory)\n"
    "  --tokens LIST  prompt token ids, comma-separated\n"
    "  -n N           tokens to generate (default 16); streamed to stdout, one id per line\n"
    "  --temp T       sampling temperature (default 0 = greedy)\n"
    "  --score        teacher-forced scoring of the given tokens instead of generation\n"
    "  --dump-topk F  write {\"steps\": [{\"pos\": i, \"selected\": id, \"topk\": [[id, logit], ...]}]}:\n"
    "                 generation: one step per generated token (pos = position of the logits row,\n"
    "                 selected = the generated token); --score: step i holds the logits that\n"
    "                 predict token i+1 of the given sequence (selected = their top-1 id)\n"
    "  --top-k K      entries per step in the dump (default 10)\n"
    "  --stats        timing, token counts and expert-cache counters on stderr\n"
    "  --synthetic PATH [--synthetic-seed N] [--synthetic-experts TYPE]\n"
    "                 first write a small seeded synthetic DeepSeek-V4 GGUF to PATH (unless it\n"
    "                 exists) and use it as the model (without --tokens: only write it);\n"
    "                 TYPE: mxfp4 (default), q2_K, q4_K, q8_0, iq2_xxs\n";

[[noreturn]] void die(const std::string &msg) {
  std::fprintf(stderr, "ep-run: %s\n", msg.c_str());
  std::exit(2);
}

void check(ep_status st, const char *what) {
  if (st != EP_OK && st != EP_ERR_CANCELLED) {
    std::fprintf(stderr, "ep-run: %s: %s (%s)\n", what, ep_last_error(), ep_status_str(st));
    std::exit(1);
  }
}

std::vector<int32_t> parse_tokens(const std::string &s) {
  std::vector<int32_t> out;
  size_t p = 0;
  while (p < s.size()) {
    size_t q = s.find(',', p);
    if (q == std::string::npos) q = s.size();
    const std::string item = s.substr(p, q - p);
    char *end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v > INT32_MAX) die("bad token id '" + item + "' in --tokens");
    out.push_back(static_cast<int32_t>(v));
    p = q + 1;
  }
  return out;
}

struct Stream {
  std::vector<int32_t> tokens;
};

void on_progress(uint64_t done, uint64_t total, void *payload) {
  int &last = *static_cast<int *>(payload);
  const int pct = total ? static_cast<int>(done * 100 / total) : 100;
  if (pct / 10 == last / 10 && done != total) return;
  if (pct == last) return;
  last = pct;
  std::fprintf(stderr, "ep-run: building the Expert Pack: %d%% (%.1f of %.1f MiB)\n", pct, static_cast<double>(done) / (1 << 20),
               static_cast<double>(total) / (1 << 20));
}

void print_store_stats(const ep_model *model) {
  ep_store_stats s;
  ep_store_stats_init(&s);
  if (ep_model_store_stats(&s, model) != EP_OK || !ep_model_pack_path(model)) return;
  std::fprintf(stderr,
               "ep-run: experts: %llu acquires, %llu hits, %llu misses, %llu evictions, %llu pack reads (%.2f MiB), "
               "%llu/%llu slots of %llu B resident\n",
               static_cast<unsigned long long>(s.acquires), static_cast<unsigned long long>(s.cache_hits),
               static_cast<unsigned long long>(s.cache_misses), static_cast<unsigned long long>(s.cache_evictions),
               static_cast<unsigned long long>(s.pack_reads), static_cast<double>(s.pack_read_bytes) / (1 << 20),
               static_cast<unsigned long long>(s.resident_experts), static_cast<unsigned long long>(s.cache_slots),
               static_cast<unsigned long long>(s.slot_bytes));
}

int on_token(int32_t token, uint32_t, void *payload) {
  static_cast<Stream *>(payload)->tokens.push_back(token);
  std::printf("%d\n", token);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  std::string model_path, tokens_arg, dump_path, pack_dir;
  int progress_state = -1;
  ep_generate_options gen;
  ep_generate_options_init(&gen);
  ep_model_options mopt;
  ep_model_options_init(&mopt);
  bool score = false, stats = false;
  std::string synthetic_path, synthetic_type = "mxfp4";
  uint64_t synthetic_seed = 1;
  uint32_t dump_k = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value after " + a);
      return argv[++i];
    };
    if (a == "--model") model_path = next();
    else if (a == "--tokens") tokens_arg = next();
    else if (a == "-n") gen.max_new_tokens = static_cast<uint32_t>(std::stoul(next()));
    else if (a == "--temp") gen.temperature = std::stof(next());
    else if (a == "--top-k-sample") gen.top_k = std::stoi(next());
    else if (a == "--top-p") gen.top_p = std::stof(next());
    else if (a == "--seed") gen.seed = std::stoull(next());
    else if (a == "--stop") gen.stop_token = std::stoi(next());
    else if (a == "--cache-mib") {
      const double mib = std::stod(next());
      if (!(mib > 0)) die("--cache-mib must be positive");
      mopt.cache_budget_bytes = static_cast<uint64_t>(mib * 1048576.0);
    }
    else if (a == "--pack-dir") pack_dir = next();
    else if (a == "--no-pack-build") mopt.pack_build = 0;
    else if (a == "--resident-experts") mopt.resident_experts = 1;
    else if (a == "--staging-slots") mopt.staging_slots = static_cast<uint32_t>(std::stoul(next()));
    else if (a == "--queue-depth") mopt.queue_depth = static_cast<uint32_t>(std::stoul(next()));
    else if (a == "--read-splits") mopt.read_splits = static_cast<uint32_t>(std::stoul(next()));
    else if (a == "--direct-io") mopt.direct_io = std::stoi(next());
    else if (a == "--score") score = true;
    else if (a == "--dump-topk") dump_path = next();
    else if (a == "--top-k") dump_k = static_cast<uint32_t>(std::stoul(next()));
    else if (a == "--stats") stats = true;
    else if (a == "--synthetic") synthetic_path = next();
    else if (a == "--synthetic-seed") synthetic_seed = std::stoull(next());
    else if (a == "--synthetic-experts") synthetic_type = next();
    else if (a == "--prompt") die("--prompt needs the tokenizer integration, which is not done yet; use --tokens");
    else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      die("unknown argument " + a + "\n" + kUsage);
    }
  }
  if (!synthetic_path.empty()) {
    if (!std::filesystem::exists(synthetic_path)) {
      const auto type = ep::format::ggml_type_by_name(synthetic_type);
      if (!type) die("unknown --synthetic-experts type " + synthetic_type);
      ep::model::Dsv4SyntheticSpec spec;
      spec.seed = synthetic_seed;
      spec.expert_gate_up = spec.expert_down = type->type;
      if (type->block_elems == 256) spec.hidden = spec.moe_ff = 256;
      try {
        ep::model::write_dsv4_synthetic_gguf(spec, synthetic_path);
      } catch (const std::exception &e) {
        die(std::string("writing the synthetic model: ") + e.what());
      }
      std::fprintf(stderr, "ep-run: wrote synthetic DeepSeek-V4 model %s (seed %llu, %s experts)\n", synthetic_path.c_str(),
                   static_cast<unsigned long long>(synthetic_seed), synthetic_type.c_str());
    }
    model_path = synthetic_path;
    if (tokens_arg.empty()) return 0;  // only write the model
  }
  if (model_path.empty() || tokens_arg.empty()) die(std::string("--model and --tokens are required\n") + kUsage);
  const std::vector<int32_t> prompt = parse_tokens(tokens_arg);
  if (prompt.empty()) die("--tokens is empty");

  if (!pack_dir.empty()) mopt.pack_dir = pack_dir.c_str();
  mopt.progress = on_progress;
  mopt.progress_payload = &progress_state;
  ep_model *model = nullptr;
  check(ep_model_open(&model, model_path.c_str(), &mopt), "open model");
  if (stats) {
    const char *pack = ep_model_pack_path(model);
    std::fprintf(stderr, "ep-run: routed experts from %s\n", pack ? pack : "the source (resident in memory)");
  }
  ep_model_properties props;
  ep_model_properties_init(&props);
  check(ep_model_info(&props, model), "model info");
  if (dump_k == 0 || dump_k > props.vocab_size) die("--top-k must be in 1.." + std::to_string(props.vocab_size));
  ep_session *session = nullptr;
  check(ep_session_open(&session, model), "open session");

  nlohmann::json steps = nlohmann::json::array();
  auto add_steps = [&](const std::vector<int32_t> &seq, size_t first_row, const std::vector<int32_t> *selected) {
    std::vector<int32_t> ids(seq.size() * dump_k);
    std::vector<float> logits(seq.size() * dump_k);
    ep_session *scorer = nullptr;
    check(ep_session_open(&scorer, model), "open scoring session");
    check(ep_score(scorer, seq.data(), seq.size(), dump_k, ids.data(), logits.data()), "score");
    ep_session_close(scorer);
    for (size_t r = first_row; r < seq.size(); ++r) {
      nlohmann::json topk = nlohmann::json::array();
      for (uint32_t j = 0; j < dump_k; ++j) topk.push_back({ids[r * dump_k + j], logits[r * dump_k + j]});
      const int32_t sel = selected ? (*selected)[r - first_row] : ids[r * dump_k];
      steps.push_back({{"pos", r}, {"selected", sel}, {"topk", topk}});
    }
  };

  if (score) {
    std::vector<float> dummy(props.vocab_size * prompt.size());
    check(ep_score(session, prompt.data(), prompt.size(), 0, nullptr, dummy.data()), "score");
    if (!dump_path.empty()) add_steps(prompt, 0, nullptr);
    if (stats) {
      std::fprintf(stderr, "ep-run: scored %zu tokens\n", prompt.size());
      print_store_stats(model);
    }
  } else {
    Stream stream;
    ep_generate_stats st;
    ep_generate_stats_init(&st);
    check(ep_generate(&st, session, prompt.data(), prompt.size(), &gen, on_token, &stream), "generate");
    if (!dump_path.empty() && !stream.tokens.empty()) {
      std::vector<int32_t> seq = prompt;
      seq.insert(seq.end(), stream.tokens.begin(), stream.tokens.end() - 1);
      add_steps(seq, prompt.size() - 1, &stream.tokens);
    }
    if (stats)
      std::fprintf(stderr, "ep-run: %u prompt tokens in %.3f s, %u generated in %.3f s (%.2f tok/s), weights %.1f MiB\n",
                   st.prompt_tokens, st.prefill_seconds, st.generated_tokens, st.decode_seconds,
                   st.decode_seconds > 0 ? st.generated_tokens / st.decode_seconds : 0.0,
                   static_cast<double>(props.weight_bytes) / (1 << 20));
    if (stats) print_store_stats(model);
  }
  if (!dump_path.empty()) {
    std::ofstream f(dump_path);
    if (!f) die("cannot write " + dump_path);
    f << nlohmann::json{{"steps", steps}}.dump() << "\n";
  }
  ep_session_close(session);
  ep_model_close(model);
  return 0;
}
