// ep-server: an OpenAI-compatible HTTP server on one model, through the public C API only.
//
//   ep-server --model PATH [--host 127.0.0.1] [--port 8080] [--parallel N] [--api-key KEY] ...
//
// Endpoints: GET /health, GET /v1/models, POST /v1/chat/completions, POST /v1/completions
// (streamed as server-sent events or not), POST /tokenize, POST /detokenize, GET /props,
// GET /metrics (Prometheus text). Connections: http_server.hpp (deadlines, a cap per client
// address, no port sharing). Up to --parallel
// requests decode together in one forward pass per step (continuous batching, scheduler.hpp);
// a request whose prompt starts with a kept prefix (a conversation's next turn, a shared system
// prompt) continues from its state (the prefix cache, session_cache.hpp). docs/server.md has the whole story.
#include <expertpack/expertpack.h>

#include "api.hpp"
#include "http_server.hpp"
#include "cli/model_flags.hpp"
#include "metrics.hpp"
#include "reasoning.hpp"
#include "scheduler.hpp"

#include <httplib.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include <pthread.h>
#include <signal.h>

namespace {

const char *kUsage =
    "usage: ep-server --model PATH [--host ADDR] [--port N] [--parallel N] [--api-key KEY] [options]\n"
    "\n"
    "  --model PATH       GGUF (first shard), safetensors directory, or Expert Pack (.epk); a source is\n"
    "                     packed on first use, as ep-run does\n"
    "  --host ADDR        address to bind (default 127.0.0.1: this machine only; 0.0.0.0 for every interface)\n"
    "  --port N           TCP port (default 8080; 0 = any free port, printed at start)\n"
    "  --parallel N       requests decoding together in one step (default 4)\n"
    "  --api-key KEY      require 'Authorization: Bearer KEY' on /v1/* (or set EP_SERVER_API_KEY)\n"
    "  --name NAME        the model id clients use (default: the model file's name without extension)\n"
    "\n"
    "  --tokenizer PATH   tokenizer file (default: the model's own)\n"
    "\n"
    "serving:\n"
    "  --prefill-chunk N  prompt tokens of one request per step (default 64)\n"
    "  --step-tokens N    prompt tokens of all requests per step (default 256)\n"
    "  --prefix-cache-mib M  model memory for prompt-prefix states kept for later requests (default 1024;\n"
    "                     0 = off); its blocks are --prefill-chunk tokens\n"
    "  --thinking 0|1     chat thinking when a request does not say (default: the template's)\n"
    "  --temp T           temperature when a request does not say (default 1)\n"
    "  --top-p P          top_p when a request does not say (default 1)\n"
    "limits:\n"
    "  --max-connections N  connections served at once (default 32; more wait to be accepted)\n"
    "  --max-client-connections N  connections of one client address at once (default 16; more get 429)\n"
    "  --header-timeout S   seconds a request's line and headers may take, from when the connection is\n"
    "                       ready for them (default 10; also how long an idle connection is kept)\n"
    "  --body-timeout S     seconds a request's body may take after its headers (default 60)\n"
    "  --max-body-bytes N   request body (default 4194304)\n"
    "  --max-prompt-tokens N  rendered prompt (default 8192)\n"
    "  --max-tokens N     max_tokens a request may ask for, and the most it gets without one\n"
    "                     (default: no limit; without one a request gets what remains of the context,\n"
    "                     as much as the KV budget holds)\n"
    "\n"
    "model (as ep-run):\n";

[[noreturn]] void die(const std::string &m) {
  std::fprintf(stderr, "ep-server: %s\n", m.c_str());
  std::exit(2);
}

uint64_t parse_uint(const std::string &flag, const std::string &v, uint64_t lo, uint64_t hi) {
  char *end = nullptr;
  errno = 0;
  const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || v[0] == '-' || *end != '\0' || errno != 0 || x < lo || x > hi)
    die(flag + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + v + "'");
  return x;
}

double parse_double(const std::string &flag, const std::string &v, double lo, double hi) {
  char *end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !(x >= lo && x <= hi)) die(flag + " must be a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + v + "'");
  return x;
}

void on_progress(uint64_t done, uint64_t total, void *payload) {
  int &last = *static_cast<int *>(payload);
  const int pct = total ? static_cast<int>(done * 100 / total) : 100;
  if ((pct / 10 == last / 10 && done != total) || pct == last) return;
  last = pct;
  std::fprintf(stderr, "ep-server: building the Expert Pack: %d%% (%.1f of %.1f MiB)\n", pct, static_cast<double>(done) / (1 << 20),
               static_cast<double>(total) / (1 << 20));
}

std::string default_name(const std::string &path) {
  std::filesystem::path p(path);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // a directory given with a trailing slash
  std::string name = p.filename().string();
  for (const char *ext : {".gguf", ".epk", ".safetensors"}) {
    const std::string e = ext;
    if (name.size() > e.size() && name.compare(name.size() - e.size(), e.size(), e) == 0) name.resize(name.size() - e.size());
  }
  return name.empty() ? "model" : name;
}

}  // namespace

int main(int argc, char **argv) {
  std::string model_path, tokenizer_path, host = "127.0.0.1", name;
  int port = 8080;
  size_t max_connections = 32;
  ep_server::ConnectionLimits connection_limits;
  auto millis = [](double seconds) { return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000 + 0.5)); };
  ep::cli::ModelFlags model_flags;
  ep_server::SchedulerOptions sopt;
  ep_server::ApiContext ctx;
  if (const char *key = std::getenv("EP_SERVER_API_KEY")) ctx.api_key = key;
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
    else if (a == "--host") host = next();
    else if (a == "--port") port = static_cast<int>(parse_uint(a, next(), 0, 65535));
    else if (a == "--parallel") sopt.parallel = static_cast<uint32_t>(parse_uint(a, next(), 1, 1024));
    else if (a == "--api-key") ctx.api_key = next();
    else if (a == "--name") name = next();
    else if (a == "--tokenizer") tokenizer_path = next();
    else if (a == "--prefill-chunk") sopt.prefill_chunk = static_cast<uint32_t>(parse_uint(a, next(), 1, 1 << 20));
    else if (a == "--step-tokens") sopt.step_tokens = static_cast<uint32_t>(parse_uint(a, next(), 1, 1 << 24));
    else if (a == "--prefix-cache-mib") sopt.prefix_cache_bytes = static_cast<uint64_t>(parse_double(a, next(), 0, 1 << 24) * 1048576.0);
    else if (a == "--thinking") ctx.thinking = static_cast<int>(parse_uint(a, next(), 0, 1));
    else if (a == "--temp") ctx.temperature = static_cast<float>(parse_double(a, next(), 0, 2));
    else if (a == "--top-p") ctx.top_p = static_cast<float>(parse_double(a, next(), 1e-6, 1));
    else if (a == "--max-connections") max_connections = parse_uint(a, next(), 1, 4096);
    else if (a == "--max-client-connections") connection_limits.per_client = parse_uint(a, next(), 1, 4096);
    else if (a == "--header-timeout") connection_limits.header_timeout = millis(parse_double(a, next(), 0.01, 3600));
    else if (a == "--body-timeout") connection_limits.body_timeout = millis(parse_double(a, next(), 0.01, 3600));
    else if (a == "--max-body-bytes") ctx.limits.max_body_bytes = parse_uint(a, next(), 1024, uint64_t{1} << 32);
    else if (a == "--max-prompt-tokens") ctx.limits.max_prompt_tokens = static_cast<uint32_t>(parse_uint(a, next(), 1, 1 << 24));
    else if (a == "--max-tokens") ctx.limits.max_tokens = static_cast<uint32_t>(parse_uint(a, next(), 1, 1 << 24));
    else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::fputs(ep::cli::model_flags_usage(), stdout);
      return 0;
    } else {
      die("unknown argument " + a + "\n" + kUsage);
    }
  }
  if (model_path.empty()) die(std::string("--model is required\n") + kUsage);

  // SIGINT and SIGTERM are taken by one thread (below) that shuts the server down in order;
  // blocked here, before any thread exists, so every thread inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client that went away is a failed write, not the end of the process

  int progress = -1;
  ep_model_options mopt = model_flags.options();
  mopt.progress = on_progress;
  mopt.progress_payload = &progress;
  const auto t0 = std::chrono::steady_clock::now();
  ep_model *model = nullptr;
  if (ep_model_open(&model, model_path.c_str(), &mopt) != EP_OK) {
    std::fprintf(stderr, "ep-server: cannot open %s: %s\n", model_path.c_str(), ep_last_error());
    return 1;
  }
  ep_tokenizer *tok = nullptr;
  const ep_status ts = tokenizer_path.empty() ? ep_tokenizer_open_model(&tok, model) : ep_tokenizer_open(&tok, tokenizer_path.c_str());
  if (ts != EP_OK) {
    std::fprintf(stderr, "ep-server: cannot open the tokenizer: %s\n", ep_last_error());
    ep_model_close(model);
    return 1;
  }
  ep_model_properties props;
  ep_model_properties_init(&props);
  ep_tokenizer_properties tprops;
  ep_tokenizer_properties_init(&tprops);
  ep_model_info(&props, model);
  ep_tokenizer_info(&tprops, tok);

  ctx.model_name = name.empty() ? default_name(model_path) : name;
  ctx.created = static_cast<int64_t>(std::time(nullptr));
  ctx.tokenizer = tok;
  ctx.vocab_size = props.vocab_size;
  ctx.chat_template = tprops.chat_template;
  ctx.architecture = props.architecture;
  ctx.parallel = sopt.parallel;
  ep_server::Metrics metrics;
  ctx.metrics = &metrics;
  int rc = 0;
  {
    ep_server::Scheduler scheduler(model, tok, ep_server::ThinkingMarkers::of(tok, tprops.chat_template), sopt, metrics);
    ctx.scheduler = &scheduler;

    ep_server::HttpServer server(connection_limits, {[&metrics] { metrics.connection_refused(); },
                                                     [&metrics](const char *phase) { metrics.connection_timed_out(phase); }});
    server.new_task_queue = [max_connections] { return new httplib::ThreadPool(max_connections); };
    server.set_payload_max_length(ctx.limits.max_body_bytes);
    server.set_tcp_nodelay(true);  // streamed tokens leave at once
    server.set_keep_alive_max_count(1000);
    ep_server::install_routes(server, ctx);

    errno = 0;
    const bool bound = port == 0 ? (port = server.bind_to_any_port(host)) > 0 : server.bind_to_port(host, port);
    if (!bound) {
      const int err = errno;
      std::fprintf(stderr, "ep-server: cannot listen on %s:%d: %s\n", host.c_str(), port,
                   err == EADDRINUSE ? "the address is in use (another server on this port?)"
                   : err != 0        ? std::strerror(err)
                                     : "the address cannot be bound");
      rc = 1;
    } else {
      const char *pack = ep_model_pack_path(model);
      const std::string where = props.device == EP_DEVICE_CUDA ? "CUDA device " + std::to_string(props.device_index) : std::string("the CPU");
      std::fprintf(stderr, "ep-server: %s (%s) on %s, experts from %s, %u parallel, ready in %.1f s\n", ctx.model_name.c_str(),
                   props.architecture, where.c_str(), pack ? pack : "memory", sopt.parallel,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      std::fprintf(stderr, "ep-server: listening on http://%s:%d\n", host.c_str(), port);
      if (ctx.api_key.empty() && host != "127.0.0.1" && host != "localhost" && host != "::1")
        std::fprintf(stderr, "ep-server: warning: %s is not this machine only and no --api-key is set: whoever reaches the port "
                     "can use the model\n", host.c_str());
      std::fflush(stderr);

      std::atomic<bool> signalled{false}, listening_done{false};
      std::thread stopper([&] {
        int sig = 0;
        sigwait(&stop_signals, &sig);
        signalled = true;
        scheduler.shutdown();  // every request ends, so the connection threads finish
        // A signal may come before the accept loop runs, when stop() would not reach it yet.
        while (!listening_done) {
          server.stop();
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      });
      server.listen_after_bind();
      listening_done = true;
      if (!signalled) pthread_kill(stopper.native_handle(), SIGTERM);  // the server stopped by itself: end the waiter
      stopper.join();
      std::fprintf(stderr, "ep-server: stopped\n");
    }
    scheduler.shutdown();
  }
  ep_tokenizer_close(tok);
  ep_model_close(model);
  return rc;
}
