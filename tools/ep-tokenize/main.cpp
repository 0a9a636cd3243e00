// ep-tokenize: encode/decode JSON lines with a tokenizer.json, tiktoken rank file or GGUF vocab,
// and measure encoding speed.
#include "core/error.hpp"
#include "tokenizer/tokenizer.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fmt/format.h>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace tk = ep::tokenizer;

const char *kUsage =
    "usage: ep-tokenize --tokenizer PATH [--decode] [--add-special] [--skip-special]\n"
    "                   [--pattern kimi|cl100k|gpt2|REGEX] [--bench FILE [--seconds S] [--threads N] [--no-cache]]\n"
    "\n"
    "  PATH: a HF tokenizer.json, a tiktoken rank file (\"<base64> <rank>\" lines; the split\n"
    "  pattern is --pattern, Kimi's by default; specials from a tokenizer_config.json\n"
    "  \"added_tokens_decoder\" beside it) or a .gguf model (tokenizer.ggml.* metadata).\n"
    "\n"
    "  encode (default): reads JSON lines {\"text\": ...} on stdin, writes {\"ids\": [...]} per line.\n"
    "      No special tokens are added; --add-special adds BOS/EOS as the tokenizer's\n"
    "      post-processor or tokenizer_config.json (add_bos_token/add_eos_token) say.\n"
    "  --decode: reads {\"ids\": [...]} lines, writes {\"text\": ...}; --skip-special drops\n"
    "      special tokens. Invalid UTF-8 is replaced by U+FFFD.\n"
    "  --bench FILE: encodes FILE repeatedly for S seconds (default 3) and prints MB/s. A .jsonl\n"
    "      FILE is encoded one {\"text\"} line at a time, any other file as one text.\n"
    "      --threads N runs N encoders at once on the same tokenizer (aggregate MB/s);\n"
    "      --no-cache bypasses the word cache (identical ids, uncached speed). Also prints MB per\n"
    "      CPU-second, which is steadier than wall time on a busy machine.\n";

std::string pattern_for(const std::string &name) {
  if (name == "kimi" || name == "kimi-k2") return tk::kKimiPattern;
  if (name == "cl100k") return tk::kCl100kPattern;
  if (name == "gpt2") return tk::kGpt2Pattern;
  return name;
}

std::string read_all(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) ep::fail(ep::Status::not_found, "{}: cannot open: {}", path, std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int run_bench(const tk::Tokenizer &tok, const std::string &path, double seconds, int threads, bool use_cache) {
  std::vector<std::string> texts;
  const std::string content = read_all(path);
  if (path.size() >= 6 && path.compare(path.size() - 6, 6, ".jsonl") == 0) {
    std::istringstream in(content);
    std::string line;
    size_t n = 0;
    while (std::getline(in, line)) {
      ++n;
      if (line.empty()) continue;
      const json j = json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.contains("text") || !j["text"].is_string()) {
        ep::fail(ep::Status::format, "{}: line {}: expected {{\"text\": ...}}", path, n);
      }
      texts.push_back(j["text"].get<std::string>());
    }
  } else {
    texts.push_back(content);
  }
  size_t bytes = 0;
  for (const auto &t : texts) bytes += t.size();
  size_t ids_per_pass = 0;
  for (const auto &t : texts) ids_per_pass += tok.encode(t).size();  // warm-up + id count

  tk::EncodeOptions options;
  options.use_cache = use_cache;
  std::vector<size_t> passes(static_cast<size_t>(threads), 0);
  std::vector<double> cpu_s(static_cast<size_t>(threads), 0.0);
  const auto t0 = Clock::now();
  auto thread_cpu_s = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  };
  auto worker = [&](size_t w) {
    std::vector<int32_t> ids;
    const double c0 = thread_cpu_s();
    do {
      for (const auto &t : texts) {
        ids.clear();
        tok.encode_append(t, ids, options);
      }
      ++passes[w];
    } while (std::chrono::duration<double>(Clock::now() - t0).count() < seconds);
    cpu_s[w] = thread_cpu_s() - c0;
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < threads; ++w) pool.emplace_back(worker, static_cast<size_t>(w));
  worker(0);
  for (auto &th : pool) th.join();
  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  size_t total_passes = 0;
  for (size_t p : passes) total_passes += p;
  double total_cpu_s = 0;
  for (double c : cpu_s) total_cpu_s += c;
  const double mbps = static_cast<double>(bytes) * static_cast<double>(total_passes) / dt / 1e6;
  const double mb_per_cpu_s = static_cast<double>(bytes) * static_cast<double>(total_passes) / total_cpu_s / 1e6;
  fmt::print("file {}: {} texts, {} bytes, {} ids per pass ({:.2f} bytes/id)\n", path, texts.size(), bytes,
             ids_per_pass, ids_per_pass ? static_cast<double>(bytes) / static_cast<double>(ids_per_pass) : 0.0);
  fmt::print("encode{}: {:.2f} MB/s wall ({} threads, {} passes in {:.2f} s); {:.2f} MB per CPU-second\n",
             use_cache ? "" : " (word cache off)", mbps, threads, total_passes, dt, mb_per_cpu_s);
  return 0;
}

int run(int argc, char **argv) {
  std::string tokenizer_path, bench_path, pattern = tk::kKimiPattern;
  bool decode = false, add_special = false, skip_special = false, use_cache = true;
  double seconds = 3.0;
  int threads = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) ep::fail(ep::Status::invalid_argument, "{} needs a value\n{}", a, kUsage);
      return argv[++i];
    };
    if (a == "--tokenizer") tokenizer_path = value();
    else if (a == "--decode") decode = true;
    else if (a == "--add-special") add_special = true;
    else if (a == "--skip-special") skip_special = true;
    else if (a == "--pattern") pattern = pattern_for(value());
    else if (a == "--bench") bench_path = value();
    else if (a == "--seconds") seconds = std::stod(value());
    else if (a == "--no-cache") use_cache = false;
    else if (a == "--threads") threads = std::max(1, std::stoi(value()));
    else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      ep::fail(ep::Status::invalid_argument, "unknown argument '{}'\n{}", a, kUsage);
    }
  }
  if (tokenizer_path.empty()) ep::fail(ep::Status::invalid_argument, "--tokenizer PATH is required\n{}", kUsage);

  const auto t0 = Clock::now();
  const tk::Tokenizer tok = tk::Tokenizer::from_file(tokenizer_path, pattern);
  const double load_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!bench_path.empty()) {
    fmt::print("{} (loaded in {:.3f} s)\n", tok.describe(), load_s);
    return run_bench(tok, bench_path, seconds, threads, use_cache);
  }

  std::ios::sync_with_stdio(false);
  std::string line;
  size_t n = 0;
  tk::EncodeOptions options;
  options.add_special = add_special;
  std::string out;
  while (std::getline(std::cin, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) ep::fail(ep::Status::format, "stdin line {}: not a JSON object", n);
    json result;
    if (decode) {
      if (!j.contains("ids") || !j["ids"].is_array()) ep::fail(ep::Status::format, "stdin line {}: no \"ids\" array", n);
      std::vector<int32_t> ids;
      for (const json &v : j["ids"]) {
        if (!v.is_number_integer()) ep::fail(ep::Status::format, "stdin line {}: ids must be integers", n);
        ids.push_back(v.get<int32_t>());
      }
      result["text"] = tok.decode(ids, skip_special);
    } else {
      if (!j.contains("text") || !j["text"].is_string()) ep::fail(ep::Status::format, "stdin line {}: no \"text\" string", n);
      try {
        result["ids"] = tok.encode(j["text"].get<std::string>(), options);
      } catch (const ep::Error &e) {
        ep::fail(e.status(), "stdin line {}: {}", n, e.what());
      }
    }
    out = result.dump(-1, ' ', false, json::error_handler_t::strict);
    out.push_back('\n');
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  try {
    return run(argc, argv);
  } catch (const ep::Error &e) {
    std::fprintf(stderr, "ep-tokenize: %s: %s\n", ep::status_name(e.status()), e.what());
    return 1;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "ep-tokenize: %s\n", e.what());
    return 1;
  }
}
