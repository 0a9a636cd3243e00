// ep-chat: an interactive chat on any model libexpertpack opens, through the public C API only.
//
//   ep-chat --model MODEL [--system TEXT] [--thinking 0|1] [-n N] [--temp T] [--script FILE] ...
//
// Type a message and press Enter: the answer streams as it is decoded. Commands: /stats (last
// answer's speed and the expert cache), /reset (new conversation), /system TEXT, /help, /quit.
// Ctrl-C stops the current answer (the conversation keeps what was written), not the program.
// Without a terminal (a pipe or --script FILE) each input line is echoed after the prompt, so the
// transcript reads like a session.
#include <expertpack/expertpack.h>

#include "cli/model_flags.hpp"

#include <atomic>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

volatile std::sig_atomic_t g_interrupt = 0;
volatile std::sig_atomic_t g_generating = 0;

void on_sigint(int) {
  g_interrupt = 1;
  if (!g_generating) {
    const char msg[] = "\n(Ctrl-C stops an answer; /quit leaves)\n> ";
    ssize_t r = write(STDOUT_FILENO, msg, sizeof msg - 1);
    (void)r;
  }
}

const char *kUsage =
    "usage: ep-chat --model PATH [--tokenizer PATH] [--system TEXT] [--thinking 0|1]\n"
    "               [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R] [--seed S]\n"
    "               [--script FILE] [--raw] [--ignore-eos] [model options]\n"
    "  --model PATH   GGUF, safetensors directory, or Expert Pack (a source is packed on first use)\n"
    "  --tokenizer P  tokenizer file (default: the model's own)\n"
    "  -n N           tokens per answer at most (default 256)\n"
    "  --script FILE  read the user's lines from FILE instead of stdin\n"
    "  --raw          print control characters as they are (default: shown as \\xNN)\n"
    "  --ignore-eos   answers run to -n tokens (do not stop at the end-of-turn token)\n"
    "commands: /stats /reset /system TEXT /thinking on|off /help /quit\n"
    "\n"
    "model options:\n";

[[noreturn]] void die(const std::string &m) {
  std::fprintf(stderr, "ep-chat: %s\n", m.c_str());
  std::exit(2);
}

void check(ep_status st, const char *what) {
  if (st != EP_OK) {
    std::fprintf(stderr, "ep-chat: %s: %s (%s)\n", what, ep_last_error(), ep_status_str(st));
    std::exit(1);
  }
}

struct Turn {
  std::string answer;
  bool raw = false;
};

/// Streams a piece: C0 controls other than \n and \t, and DEL, are escaped unless --raw (a
/// random synthetic model writes any byte).
int on_piece(const char *piece, size_t length, void *payload) {
  Turn &t = *static_cast<Turn *>(payload);
  t.answer.append(piece, length);
  if (t.raw) {
    std::fwrite(piece, 1, length, stdout);
  } else {
    for (size_t i = 0; i < length; ++i) {
      const unsigned char c = static_cast<unsigned char>(piece[i]);
      if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f)
        std::printf("\\x%02x", c);
      else
        std::fputc(c, stdout);
    }
  }
  std::fflush(stdout);
  return g_interrupt ? 1 : 0;
}

void on_progress(uint64_t done, uint64_t total, void *payload) {
  int &last = *static_cast<int *>(payload);
  const int pct = total ? static_cast<int>(done * 100 / total) : 100;
  if (pct / 10 == last / 10 && done != total) return;
  last = pct;
  std::fprintf(stderr, "ep-chat: building the Expert Pack: %d%% (%.1f of %.1f MiB)\n", pct, static_cast<double>(done) / (1 << 20),
               static_cast<double>(total) / (1 << 20));
}

const char *reason_name(ep_stop_reason r) {
  switch (r) {
    case EP_STOP_LENGTH: return "token limit";
    case EP_STOP_TOKEN: return "end of turn";
    case EP_STOP_STRING: return "stop string";
    case EP_STOP_CANCELLED: return "cancelled";
    default: return "?";
  }
}

bool read_line(FILE *in, std::string &line) {
  line.clear();
  char buf[4096];
  for (;;) {
    if (!std::fgets(buf, sizeof buf, in)) {
      if (ferror(in) && errno == EINTR) {  // Ctrl-C while waiting: keep waiting
        clearerr(in);
        g_interrupt = 0;
        continue;
      }
      return !line.empty();
    }
    line += buf;
    if (!line.empty() && line.back() == '\n') {
      line.pop_back();
      if (!line.empty() && line.back() == '\r') line.pop_back();
      return true;
    }
  }
}

}  // namespace

int main(int argc, char **argv) {
  std::string model_path, tokenizer_path, system_prompt, script;
  ep_generate_options gen;
  ep_generate_options_init(&gen);
  gen.max_new_tokens = 256;
  gen.temperature = 0.7f;
  gen.top_p = 0.95f;
  gen.seed = 1;
  ep::cli::ModelFlags model_flags;
  ep_chat_options chat;
  ep_chat_options_init(&chat);
  bool raw = false;
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
    else if (a == "--tokenizer") tokenizer_path = next();
    else if (a == "--system") system_prompt = next();
    else if (a == "--thinking") chat.thinking = std::atoi(next().c_str());
    else if (a == "-n") gen.max_new_tokens = static_cast<uint32_t>(std::strtoul(next().c_str(), nullptr, 10));
    else if (a == "--temp") gen.temperature = std::strtof(next().c_str(), nullptr);
    else if (a == "--top-k") gen.top_k = std::atoi(next().c_str());
    else if (a == "--top-p") gen.top_p = std::strtof(next().c_str(), nullptr);
    else if (a == "--min-p") gen.min_p = std::strtof(next().c_str(), nullptr);
    else if (a == "--repeat-penalty") gen.repetition_penalty = std::strtof(next().c_str(), nullptr);
    else if (a == "--seed") gen.seed = std::strtoull(next().c_str(), nullptr, 10);
    else if (a == "--script") script = next();
    else if (a == "--raw") raw = true;
    else if (a == "--ignore-eos") gen.ignore_eos = 1;
    else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::fputs(ep::cli::model_flags_usage(), stdout);
      return 0;
    } else {
      die("unknown argument " + a + "\n" + kUsage);
    }
  }
  if (model_path.empty()) die(std::string("--model is required\n") + kUsage);

  FILE *in = stdin;
  if (!script.empty() && !(in = std::fopen(script.c_str(), "r"))) die("cannot open --script " + script);
  const bool echo = !script.empty() || !isatty(fileno(in));

  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);  // no SA_RESTART: fgets returns EINTR, handled in read_line

  int progress = -1;
  ep_model_options mopt = model_flags.options();
  mopt.progress = on_progress;
  mopt.progress_payload = &progress;
  std::fprintf(stderr, "ep-chat: opening %s ...\n", model_path.c_str());
  const auto t0 = std::chrono::steady_clock::now();
  ep_model *model = nullptr;
  check(ep_model_open(&model, model_path.c_str(), &mopt), "open model");
  ep_tokenizer *tok = nullptr;
  if (tokenizer_path.empty())
    check(ep_tokenizer_open_model(&tok, model), "open the model's tokenizer");
  else
    check(ep_tokenizer_open(&tok, tokenizer_path.c_str()), "open tokenizer");
  ep_model_properties props;
  ep_model_properties_init(&props);
  check(ep_model_info(&props, model), "model info");
  ep_tokenizer_properties tprops;
  ep_tokenizer_properties_init(&tprops);
  check(ep_tokenizer_info(&tprops, tok), "tokenizer info");
  const char *pack = ep_model_pack_path(model);
  const std::string where =
      props.device == EP_DEVICE_CUDA ? "CUDA device " + std::to_string(props.device_index) : std::string("the CPU");
  std::fprintf(stderr, "ep-chat: %s on %s, %u layers, %u experts (%u per token), vocabulary %u; experts from %s; ready in %.1f s\n",
               props.architecture, where.c_str(), props.num_layers, props.num_experts, props.experts_per_token,
               tprops.vocab_size, pack ? pack : "memory", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  std::printf("Chat (/help for commands, Ctrl-C stops an answer).\n");
  ep_session *session = nullptr;
  check(ep_session_open(&session, model), "open session");

  struct Msg {
    std::string role, content;
  };
  std::vector<Msg> history;
  if (!system_prompt.empty()) history.push_back({"system", system_prompt});
  ep_generate_stats last;
  ep_generate_stats_init(&last);
  bool have_last = false;
  std::string line;
  for (;;) {
    std::printf("> ");
    std::fflush(stdout);
    if (!read_line(in, line)) {
      std::printf("\n");
      break;
    }
    if (echo) std::printf("%s\n", line.c_str());
    if (line.empty()) continue;
    if (line == "/quit" || line == "/exit") break;
    if (line == "/help") {
      std::fputs(kUsage, stdout);
      continue;
    }
    if (line == "/reset") {
      history.clear();
      if (!system_prompt.empty()) history.push_back({"system", system_prompt});
      check(ep_session_reset(session), "reset");
      std::printf("(new conversation)\n");
      continue;
    }
    if (line.rfind("/system ", 0) == 0) {
      system_prompt = line.substr(8);
      history.clear();
      history.push_back({"system", system_prompt});
      std::printf("(new conversation with that system prompt)\n");
      continue;
    }
    if (line == "/thinking on" || line == "/thinking off") {
      chat.thinking = line == "/thinking on" ? 1 : 0;
      std::printf("(thinking %s)\n", chat.thinking ? "on" : "off");
      continue;
    }
    if (line == "/stats") {
      uint64_t n = 0;
      ep_session_length(&n, session);
      if (have_last)
        std::printf("last answer: %u prompt tokens (%u reused) in %.3f s (%.1f tok/s), %u generated in %.3f s (%.2f tok/s), "
                    "stopped: %s\n",
                    last.prompt_tokens, last.reused_tokens, last.prefill_seconds, last.prefill_tokens_per_second,
                    last.generated_tokens, last.decode_seconds, last.decode_tokens_per_second, reason_name(last.stop_reason));
      std::printf("conversation: %zu messages, %llu tokens in the session\n", history.size(), static_cast<unsigned long long>(n));
      ep_store_stats s;
      ep_store_stats_init(&s);
      if (ep_model_store_stats(&s, model) == EP_OK && pack)
        std::printf("experts: %llu acquires, %llu hits, %llu misses, %llu evictions, %llu pack reads (%.2f MiB), %llu/%llu slots\n",
                    static_cast<unsigned long long>(s.acquires), static_cast<unsigned long long>(s.cache_hits),
                    static_cast<unsigned long long>(s.cache_misses), static_cast<unsigned long long>(s.cache_evictions),
                    static_cast<unsigned long long>(s.pack_reads), static_cast<double>(s.pack_read_bytes) / (1 << 20),
                    static_cast<unsigned long long>(s.resident_experts), static_cast<unsigned long long>(s.cache_slots));
      if (pack && s.host_slots)
        std::printf("host tier: %llu hits, %llu misses, %llu demotions, %.2f MiB in %llu slots\n",
                    static_cast<unsigned long long>(s.host_hits), static_cast<unsigned long long>(s.host_misses),
                    static_cast<unsigned long long>(s.demotions), static_cast<double>(s.host_resident_bytes) / (1 << 20),
                    static_cast<unsigned long long>(s.host_slots));
      continue;
    }
    if (line[0] == '/') {
      std::printf("unknown command %s (/help)\n", line.c_str());
      continue;
    }
    history.push_back({"user", line});
    std::vector<ep_chat_message> msgs;
    for (const Msg &m : history) msgs.push_back({m.role.c_str(), m.content.c_str(), nullptr});
    Turn turn;
    turn.raw = raw;
    g_interrupt = 0;
    g_generating = 1;
    ep_generate_stats_init(&last);
    ++gen.seed;  // a different draw per answer, still reproducible from --seed
    const ep_status st = ep_generate_chat(&last, session, tok, msgs.data(), msgs.size(), &chat, &gen, on_piece, &turn);
    g_generating = 0;
    have_last = true;
    if (st == EP_ERR_CANCELLED) {
      std::printf(" [stopped]\n");
    } else {
      check(st, "generate");
      std::printf("\n");
    }
    history.push_back({"assistant", turn.answer});
  }
  ep_session_close(session);
  ep_tokenizer_close(tok);
  ep_model_close(model);
  if (in != stdin) std::fclose(in);
  return 0;
}
