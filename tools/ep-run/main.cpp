// ep-run: generate from or score a token sequence with a model, through the public C API.
#include <expertpack/expertpack.h>

#include "cli/model_flags.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

const char *kUsage =
    "usage: ep-run --model PATH --tokens 1,2,3 [-n N] [--temp T] [--top-k-sample K] [--top-p P] [--seed S]\n"
    "              [--stop ID] [--score] [--dump-topk FILE [--top-k K]] [--stats] [model options]\n"
    "\n"
    "  --model PATH   a GGUF file (any shard of a set; any name, e.g. an Ollama blob), a directory\n"
    "                 with config.json + safetensors, or an\n"
    "                 Expert Pack (.epk) with its manifest. A source's routed experts are served from\n"
    "                 its pack, built on first use (with progress) and reused while the source is\n"
    "                 unchanged (a changed source is rebuilt). A small model to try:\n"
    "                 ep-synth --preset small --out m.gguf (seeded random weights, chat tokenizer)\n"
    "  --tokens LIST  prompt token ids, comma-separated\n"
    "  -n N           tokens to generate (default 16); streamed to stdout, one id per line\n"
    "  --temp T       sampling temperature (default 0 = greedy)\n"
    "  --score        teacher-forced scoring of the given tokens instead of generation\n"
    "  --dump-topk F  write {\"steps\": [{\"pos\": i, \"selected\": id, \"topk\": [[id, logit], ...]}]}:\n"
    "                 generation: one step per generated token (pos = position of the logits row,\n"
    "                 selected = the generated token); --score: step i holds the logits that\n"
    "                 predict token i+1 of the given sequence (selected = their top-1 id)\n"
    "  --top-k K      entries per step in the dump (default 10)\n"
    "  --dump-logits F  --score: write every row of logits to F (raw little-endian f32 [tokens][vocab])\n"
    "  --stats        timing, token counts and expert-cache counters on stderr\n"
    "\n"
    "text (instead of --tokens; the model's tokenizer, or --tokenizer PATH):\n"
    "  --prompt TEXT  generate text after TEXT, streamed to stdout as it is decoded\n"
    "  --chat         treat --prompt as a user message and apply the chat template\n"
    "  --system TEXT  a system message (with --chat)\n"
    "  --thinking 0|1 chat thinking off/on (default: the template's)\n"
    "  --stop-string S  stop when S appears (repeatable); --min-p P; --repeat-penalty R [--repeat-window N]\n"
    "  --ignore-eos   do not stop at EOS / end of turn\n"
    "\n"
    "model options:\n";

/// --prompt: text generation through the tokenizer, streamed as UTF-8 pieces.
struct TextArgs {
  std::string prompt, system, tokenizer;
  bool chat = false;
  int thinking = -1;
  std::vector<std::string> stop_strings;
};

int on_text(const char *piece, size_t length, void *) {
  std::fwrite(piece, 1, length, stdout);
  std::fflush(stdout);
  return 0;
}

const char *stop_reason_name(ep_stop_reason r) {
  switch (r) {
    case EP_STOP_LENGTH: return "max tokens";
    case EP_STOP_TOKEN: return "stop token";
    case EP_STOP_STRING: return "stop string";
    case EP_STOP_CANCELLED: return "cancelled";
    default: return "?";
  }
}

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
  std::fprintf(stderr, "ep-run: building the Expert Pack (or the source index): %d%% (%.1f of %.1f MiB)\n", pct,
               static_cast<double>(done) / (1 << 20), static_cast<double>(total) / (1 << 20));
}

/// The pack bytes one generation read, split at its first token (nothing with resident experts).
void print_expert_bytes(const ep_generate_stats &st) {
  if (st.prefill_expert_bytes || st.decode_expert_bytes)
    std::fprintf(stderr, "ep-run: experts read from the pack: %.2f MiB for the prompt, %.2f MiB while generating (%.2f MiB/token)\n",
                 static_cast<double>(st.prefill_expert_bytes) / (1 << 20), static_cast<double>(st.decode_expert_bytes) / (1 << 20),
                 st.generated_tokens ? static_cast<double>(st.decode_expert_bytes) / (1 << 20) / st.generated_tokens : 0.0);
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
  if (s.host_slots)
    std::fprintf(stderr, "ep-run: host tier: %llu hits, %llu misses, %llu demotions, %.2f MiB in %llu slots\n",
                 static_cast<unsigned long long>(s.host_hits), static_cast<unsigned long long>(s.host_misses),
                 static_cast<unsigned long long>(s.demotions), static_cast<double>(s.host_resident_bytes) / (1 << 20),
                 static_cast<unsigned long long>(s.host_slots));
  if (s.prefetch_issued)
    std::fprintf(stderr, "ep-run: prefetch: %llu issued, %llu used\n", static_cast<unsigned long long>(s.prefetch_issued),
                 static_cast<unsigned long long>(s.prefetch_used));
}

int on_token(int32_t token, uint32_t, void *payload) {
  static_cast<Stream *>(payload)->tokens.push_back(token);
  std::printf("%d\n", token);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  std::string model_path, tokens_arg, dump_path, dump_logits_path;
  int progress_state = -1;
  ep_generate_options gen;
  ep_generate_options_init(&gen);
  bool score = false, stats = false;
  uint32_t dump_k = 10;
  TextArgs text;
  ep::cli::ModelFlags model_flags;
  for (int i = 1; i < argc; ++i) {
    try {
      if (model_flags.take(argc, argv, i)) continue;
    } catch (const ep::cli::FlagError &e) {
      die(e.what());
    }
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
    else if (a == "--score") score = true;
    else if (a == "--dump-topk") dump_path = next();
    else if (a == "--dump-logits") dump_logits_path = next();
    else if (a == "--top-k") dump_k = static_cast<uint32_t>(std::stoul(next()));
    else if (a == "--stats") stats = true;
    else if (a == "--prompt") text.prompt = next();
    else if (a == "--chat") text.chat = true;
    else if (a == "--system") text.system = next();
    else if (a == "--tokenizer") text.tokenizer = next();
    else if (a == "--thinking") text.thinking = std::stoi(next());
    else if (a == "--stop-string") text.stop_strings.push_back(next());
    else if (a == "--min-p") gen.min_p = std::stof(next());
    else if (a == "--repeat-penalty") gen.repetition_penalty = std::stof(next());
    else if (a == "--repeat-window") gen.repetition_window = static_cast<uint32_t>(std::stoul(next()));
    else if (a == "--ignore-eos") gen.ignore_eos = 1;
    else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::fputs(ep::cli::model_flags_usage(), stdout);
      return 0;
    } else {
      die("unknown argument " + a + "\n" + kUsage);
    }
  }
  const bool text_mode = !text.prompt.empty();
  if (text_mode && !tokens_arg.empty()) die("--prompt and --tokens exclude each other");
  if (!dump_logits_path.empty() && !score) die("--dump-logits needs --score");
  if (text_mode && (score || !dump_path.empty())) die("--prompt generates text; --score and --dump-topk take --tokens");
  if (model_path.empty() || (tokens_arg.empty() && !text_mode))
    die(std::string("--model and --tokens (or --prompt) are required\n") + kUsage);
  const std::vector<int32_t> prompt = text_mode ? std::vector<int32_t>{} : parse_tokens(tokens_arg);
  if (prompt.empty() && !text_mode) die("--tokens is empty");

  ep_model_options mopt = model_flags.options();
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
  if (stats) {
    if (props.device == EP_DEVICE_CUDA)
      std::fprintf(stderr, "ep-run: %s model on CUDA device %d\n", props.architecture, props.device_index);
    else
      std::fprintf(stderr, "ep-run: %s model on the CPU\n", props.architecture);
  }
  if (dump_k == 0 || dump_k > props.vocab_size) die("--top-k must be in 1.." + std::to_string(props.vocab_size));
  ep_session *session = nullptr;
  check(ep_session_open(&session, model), "open session");
  if (text_mode) {
    ep_tokenizer *tok = nullptr;
    if (text.tokenizer.empty())
      check(ep_tokenizer_open_model(&tok, model), "open the model's tokenizer");
    else
      check(ep_tokenizer_open(&tok, text.tokenizer.c_str()), "open tokenizer");
    std::vector<const char *> stops;
    for (const std::string &s : text.stop_strings) stops.push_back(s.c_str());
    gen.stop_strings = stops.data();
    gen.n_stop_strings = stops.size();
    ep_generate_stats st;
    ep_generate_stats_init(&st);
    if (text.chat) {
      std::vector<ep_chat_message> msgs;
      if (!text.system.empty()) msgs.push_back({"system", text.system.c_str(), nullptr});
      msgs.push_back({"user", text.prompt.c_str(), nullptr});
      ep_chat_options co;
      ep_chat_options_init(&co);
      co.thinking = text.thinking;
      check(ep_generate_chat(&st, session, tok, msgs.data(), msgs.size(), &co, &gen, on_text, nullptr), "generate");
    } else {
      check(ep_generate_text(&st, session, tok, text.prompt.c_str(), &gen, on_text, nullptr), "generate");
    }
    std::printf("\n");
    if (stats) {
      std::fprintf(stderr, "ep-run: %u prompt tokens in %.3f s (%.1f tok/s), %u generated in %.3f s (%.2f tok/s), stop: %s\n",
                   st.prompt_tokens, st.prefill_seconds, st.prefill_tokens_per_second, st.generated_tokens, st.decode_seconds,
                   st.decode_tokens_per_second, stop_reason_name(st.stop_reason));
      print_expert_bytes(st);
      print_store_stats(model);
    }
    ep_tokenizer_close(tok);
    ep_session_close(session);
    ep_model_close(model);
    return 0;
  }

  nlohmann::json steps = nlohmann::json::array();
  // Steps of the dump from each row's top dump_k (ids, logits).
  auto push_steps = [&](const std::vector<int32_t> &ids, const std::vector<float> &logits, size_t rows, size_t first_row,
                        const std::vector<int32_t> *selected) {
    for (size_t r = first_row; r < rows; ++r) {
      nlohmann::json topk = nlohmann::json::array();
      for (uint32_t j = 0; j < dump_k; ++j) topk.push_back({ids[r * dump_k + j], logits[r * dump_k + j]});
      const int32_t sel = selected ? (*selected)[r - first_row] : ids[r * dump_k];
      steps.push_back({{"pos", r}, {"selected", sel}, {"topk", topk}});
    }
  };
  auto add_steps = [&](const std::vector<int32_t> &seq, size_t first_row, const std::vector<int32_t> *selected) {
    std::vector<int32_t> ids(seq.size() * dump_k);
    std::vector<float> logits(seq.size() * dump_k);
    ep_session *scorer = nullptr;
    check(ep_session_open(&scorer, model), "open scoring session");
    check(ep_score(scorer, seq.data(), seq.size(), dump_k, ids.data(), logits.data()), "score");
    ep_session_close(scorer);
    push_steps(ids, logits, seq.size(), first_row, selected);
  };

  if (score) {
    // One teacher-forced pass; the dumps are taken from its logits.
    const size_t V = props.vocab_size;
    std::vector<float> all(V * prompt.size());
    const auto t0 = std::chrono::steady_clock::now();
    check(ep_score(session, prompt.data(), prompt.size(), 0, nullptr, all.data()), "score");
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!dump_logits_path.empty()) {
      std::ofstream f(dump_logits_path, std::ios::binary);
      if (!f.write(reinterpret_cast<const char *>(all.data()), static_cast<std::streamsize>(all.size() * sizeof(float))))
        die("cannot write " + dump_logits_path);
    }
    if (!dump_path.empty()) {
      std::vector<int32_t> ids(prompt.size() * dump_k), order(V);
      std::vector<float> top(prompt.size() * dump_k);
      for (size_t r = 0; r < prompt.size(); ++r) {
        const float *row = all.data() + r * V;
        for (size_t i = 0; i < V; ++i) order[i] = static_cast<int32_t>(i);
        std::partial_sort(order.begin(), order.begin() + dump_k, order.end(),
                          [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
        for (uint32_t j = 0; j < dump_k; ++j) {
          ids[r * dump_k + j] = order[j];
          top[r * dump_k + j] = row[order[j]];
        }
      }
      push_steps(ids, top, prompt.size(), 0, nullptr);
    }
    if (stats) {
      std::fprintf(stderr, "ep-run: scored %zu tokens in %.3f s (%.1f tok/s)\n", prompt.size(), secs,
                   secs > 0 ? static_cast<double>(prompt.size()) / secs : 0.0);
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
    if (stats) print_expert_bytes(st);
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
