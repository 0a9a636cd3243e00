// ep-bench compute: the compute speed of one model with every routed expert resident (no pack,
// no cache: ep_model_options::resident_experts), through the public C API, greedy, EOS ignored.
// Per repetition, in a fresh session: the prompt pass (ep_sessions_append of the whole prompt,
// then ep_session_sample, whose token id coming back means the pass finished), and the
// generation (ep_generate of --gen-tokens tokens from those logits, then one more
// ep_session_sample so that the last step has finished too). Reported: prefill and decode tok/s,
// best and median over the repetitions after the warm-up ones.
//
// Batched decode (--batch "1,2,4,8"): per batch size B, B fresh sessions get prompts of
// --prompt-tokens tokens (each its own slice of the text) in one ep_sessions_append, then
// --gen-tokens steps of one token each: one ep_sessions_sample draws every session's token
// (greedy; one sampling launch and one download for the step) and one ep_sessions_append runs the
// B tokens together, as the server's scheduler does (--batch-sample each: one ep_session_sample
// per session instead, as before the batched call, for a comparison in the same run). Reported per B: aggregate decode tok/s
// (B x tokens / time), the step time, and the ratio to B = 1.
//
// Against the hardware: the HBM device-to-device copy bandwidth measured in the same run
// (before the model is opened and after it is closed) and the bytes one decode token touches,
// from the GGUF's tensor sizes:
//
//   bytes/token = sum of every dense tensor of the layers that run, once
//               + one row of each lookup table (token_embd.weight and the hash layers'
//                 ffn_gate_tid2eid.weight: ne[0] values of their type)
//               + sum over MoE layers of (routed expert bytes of the layer) * top_k / n_experts
//
// (the routed experts are blk.N.ffn_{gate,up,down}_exps.weight, n_experts = their ne[2]; a model
// without output.weight reads token_embd.weight whole for its head). The HBM bound of a decode
// token is bytes/token / bandwidth; the report gives decode time per token over that bound.
//
// Against a peer: with --ds4-bench PATH, antirez/ds4's ds4-bench runs on the same file in the
// same run, after our model is closed, once per repetition: `ds4-bench -m FILE --cuda
// --prompt-file TEXT --ctx-start P --ctx-max P --gen-tokens G --csv CSV` (greedy, EOS skipped;
// with DS4_CUDA_COPY_MODEL=1 unless the environment sets it: all weights in VRAM, as ours are),
// on the text whose first P tokens are our prompt. ds4-bench slices its own tokenization of that
// text, so the prompts are the same tokens when the two tokenizers agree (they do on the
// byte-level synthetic vocabularies: one token per byte).
#include "bench_common.hpp"

#include "core/error.hpp"
#include "format/gguf.hpp"

#include "expertpack/expertpack.h"

#ifdef EP_HAVE_CUDA
#include "cuda_util.hpp"
#include "gpu/device.hpp"
#endif

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace ep::bench {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

// Issue 30's targets.
constexpr double kDecodeTargetVsDs4 = 1.2;   // ours / ds4, decode tok/s
constexpr double kPrefillTargetVsDs4 = 1.0;  // ours / ds4, prefill tok/s
constexpr double kDecodeTargetVsHbm = 3.0;   // decode time per token / HBM bound, at most

constexpr const char *kBytesFormula =
    "dense tensors once + one row of token_embd and of each ffn_gate_tid2eid + "
    "sum over MoE layers of routed expert bytes * top_k / n_experts";

void check(ep_status st, const char *what) {
  if (st != EP_OK) fail(static_cast<Status>(st), "{}: {}", what, ep_last_error());
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct TokenBytes {
  uint64_t dense = 0;        ///< every tensor but the routed experts and the lookup tables, once
  uint64_t lookup_rows = 0;  ///< one row of token_embd and of each ffn_gate_tid2eid table
  uint64_t experts = 0;      ///< per MoE layer, its routed expert bytes * top_k / n_experts
  uint64_t expert_total = 0; ///< all routed expert bytes of the layers that run
  uint64_t total() const { return dense + lookup_rows + experts; }
};

/// The layer index of "blk.N.rest" and its rest, or nullopt.
std::optional<std::pair<uint64_t, std::string_view>> block_of(std::string_view name) {
  if (!name.starts_with("blk.")) return std::nullopt;
  const size_t dot = name.find('.', 4);
  if (dot == std::string_view::npos || dot == 4) return std::nullopt;
  uint64_t il = 0;
  for (char c : name.substr(4, dot - 4)) {
    if (c < '0' || c > '9') return std::nullopt;
    il = il * 10 + static_cast<uint64_t>(c - '0');
  }
  return std::make_pair(il, name.substr(dot + 1));
}

/// Bytes one decode token touches (see the file comment), from the tensor table of @p path; the
/// blocks from @p num_layers on (MTP layers) do not run and are left out.
TokenBytes decode_token_bytes(const std::string &path, uint32_t num_layers, uint32_t top_k) {
  const auto set = format::GgufSet::open(path);
  TokenBytes b;
  bool tied_head = !set.find_tensor("output.weight").has_value();
  for (const format::GgufFile &f : set.shards())
    for (const format::GgufTensorInfo &t : f.tensors()) {
      const std::string_view n = t.name;
      const auto blk = block_of(n);
      if (blk && blk->first >= num_layers) continue;
      const std::string_view rest = blk ? blk->second : n;
      if (blk && (rest == "ffn_gate_exps.weight" || rest == "ffn_up_exps.weight" || rest == "ffn_down_exps.weight")) {
        const uint64_t experts = std::max<uint64_t>(1, t.ne[2]);
        b.expert_total += t.nbytes;
        b.experts += t.nbytes / experts * std::min<uint64_t>(top_k, experts);
      } else if ((n == "token_embd.weight" && !tied_head) || (blk && rest == "ffn_gate_tid2eid.weight")) {
        b.lookup_rows += t.nbytes / std::max<uint64_t>(1, t.ne[1]);
      } else {
        b.dense += t.nbytes;
      }
    }
  return b;
}

struct Series {
  std::vector<double> values;
  double best() const { return values.empty() ? 0 : *std::max_element(values.begin(), values.end()); }
  double median() const {
    if (values.empty()) return 0;
    std::vector<double> v = values;
    std::sort(v.begin(), v.end());
    const size_t m = v.size() / 2;
    return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
  }
  Json json() const { return Json{{"best", best()}, {"median", median()}, {"runs", values}}; }
};

struct Handles {
  ep_model *model = nullptr;
  ep_tokenizer *tok = nullptr;
  Handles() = default;
  Handles(const Handles &) = delete;
  Handles &operator=(const Handles &) = delete;
  ~Handles() { close(); }
  void close() {
    ep_tokenizer_close(tok);
    ep_model_close(model);
    tok = nullptr;
    model = nullptr;
  }
};

struct Session {
  ep_session *s = nullptr;
  explicit Session(ep_model *m) { check(ep_session_open(&s, m), "open a session"); }
  ~Session() { ep_session_close(s); }
  Session(const Session &) = delete;
  Session &operator=(const Session &) = delete;
};

struct Timing {
  double prefill_seconds = 0, decode_seconds = 0;
  uint32_t generated = 0;
};

/// One prompt pass and @p gen generated tokens in a fresh session (see the file comment).
Timing run_once(ep_model *model, const std::vector<int32_t> &prompt, uint32_t gen) {
  Session s(model);
  ep_generate_options g;
  ep_generate_options_init(&g);
  g.temperature = 0;
  g.max_new_tokens = gen;
  g.stop_token = -1;
  Timing t;
  int32_t tok = 0;
  const int32_t *ids = prompt.data();
  const size_t n = prompt.size();
  const auto t0 = Clock::now();
  check(ep_sessions_append(&s.s, &ids, &n, 1), "prompt pass");
  check(ep_session_sample(&tok, s.s, &g), "sample after the prompt");
  t.prefill_seconds = seconds_since(t0);
  ep_generate_stats st;
  ep_generate_stats_init(&st);
  const auto t1 = Clock::now();
  check(ep_generate(&st, s.s, nullptr, 0, &g, nullptr, nullptr), "generate");
  check(ep_session_sample(&tok, s.s, &g), "sample after the last step");
  t.decode_seconds = seconds_since(t1);
  t.generated = st.generated_tokens;
  if (t.generated != gen) fail(Status::internal, "generated {} tokens, asked for {}", t.generated, gen);
  return t;
}

/// @p b sessions stepped together (see the file comment): the decode time of @p gen steps.
double run_batch_once(ep_model *model, const std::vector<std::vector<int32_t>> &prompts, uint32_t gen, bool sample_each) {
  const size_t b = prompts.size();
  std::vector<std::unique_ptr<Session>> owned;
  std::vector<ep_session *> ss;
  for (size_t i = 0; i < b; ++i) {
    owned.push_back(std::make_unique<Session>(model));
    ss.push_back(owned.back()->s);
  }
  ep_generate_options g;
  ep_generate_options_init(&g);
  g.temperature = 0;
  std::vector<const int32_t *> ptrs;
  std::vector<size_t> counts;
  for (const auto &p : prompts) {
    ptrs.push_back(p.data());
    counts.push_back(p.size());
  }
  check(ep_sessions_append(ss.data(), ptrs.data(), counts.data(), b), "batched prompt pass");
  std::vector<int32_t> next(b);
  const std::vector<const ep_generate_options *> opts(b, &g);
  auto sample = [&](const char *what) {
    if (!sample_each) return check(ep_sessions_sample(next.data(), nullptr, ss.data(), opts.data(), nullptr, b), what);
    for (size_t i = 0; i < b; ++i) check(ep_session_sample(&next[i], ss[i], &g), what);
  };
  sample("sample after the prompt");
  const std::vector<size_t> ones(b, 1);
  const auto t0 = Clock::now();
  for (uint32_t step = 0; step < gen; ++step) {
    for (size_t i = 0; i < b; ++i) ptrs[i] = &next[i];
    check(ep_sessions_append(ss.data(), ptrs.data(), ones.data(), b), "batched decode step");
    sample("sample");
  }
  return seconds_since(t0);
}

/// Deterministic plain ASCII text of about @p bytes bytes (words and sentences).
std::string make_text(size_t bytes) {
  static const char *const words[] = {"the",   "model", "routes", "each",    "token", "to",    "a",      "few",
                                      "experts", "whose", "weights", "stay",   "in",    "memory", "while", "layers",
                                      "attend", "over", "compressed", "keys", "and",   "values", "of",    "earlier",
                                      "positions", "with", "sliding", "windows", "mixing", "streams", "through", "time"};
  constexpr size_t n_words = sizeof(words) / sizeof(words[0]);
  std::string out;
  uint64_t x = 0x9e3779b97f4a7c15ull;
  size_t in_sentence = 0;
  while (out.size() < bytes) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    std::string w = words[(x >> 33) % n_words];
    if (in_sentence == 0) w[0] = static_cast<char>(w[0] - 'a' + 'A');
    out += w;
    if (++in_sentence >= 8 + (x >> 60)) {
      out += ". ";
      in_sentence = 0;
    } else {
      out += ' ';
    }
  }
  return out;
}

std::string read_text_file(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(Status::not_found, "{}: cannot open the prompt file", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_text_file(const std::string &path, const std::string &text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  if (!f) fail(Status::io, "{}: cannot write", path);
}

std::vector<int32_t> tokenize(const ep_tokenizer *tok, const std::string &text) {
  size_t count = 0;
  check(ep_tokenize(nullptr, 0, &count, tok, text.data(), text.size(), 0), "tokenize the prompt");
  std::vector<int32_t> ids(count);
  check(ep_tokenize(ids.data(), ids.size(), &count, tok, text.data(), text.size(), 0), "tokenize the prompt");
  return ids;
}

/// At least @p count token ids: make_text() of growing length through the model's tokenizer (the
/// text, when @p text is given, goes there), or without a tokenizer a deterministic sequence over
/// the vocabulary.
std::vector<int32_t> synthetic_tokens(const ep_tokenizer *tok, uint32_t vocab, size_t count, std::string *text = nullptr) {
  std::vector<int32_t> ids;
  if (!tok) {
    for (uint64_t i = 0; i < count; ++i) ids.push_back(static_cast<int32_t>((i * 7919 + 11) % std::max<uint32_t>(1, vocab)));
    return ids;
  }
  std::string t;
  for (size_t bytes = count * 8; ids.size() < count && bytes < (size_t{1} << 28); bytes *= 2) {
    t = make_text(bytes);
    ids = tokenize(tok, t);
  }
  if (ids.size() < count) fail(Status::internal, "the generated text gives {} tokens, {} are needed", ids.size(), count);
  if (text) *text = std::move(t);
  return ids;
}

std::string shell_quote(const std::string &s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

/// The last @p max_lines lines of a file (for error messages).
std::string tail_of(const std::string &path, size_t max_lines) {
  std::ifstream f(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(f, l);) lines.push_back(l);
  std::string out;
  for (size_t i = lines.size() > max_lines ? lines.size() - max_lines : 0; i < lines.size(); ++i) out += "  " + lines[i] + "\n";
  return out;
}

struct PeerRow {
  int ctx_tokens = 0, prefill_tokens = 0, gen_tokens = 0;
  double prefill_tps = 0, gen_tps = 0;
};

/// ds4-bench's CSV (`ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes`):
/// the row of frontier @p ctx.
PeerRow parse_ds4_csv(const std::string &path, int ctx) {
  std::ifstream f(path);
  if (!f) fail(Status::not_found, "{}: ds4-bench wrote no CSV", path);
  std::string line;
  if (!std::getline(f, line) || line.rfind("ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps", 0) != 0)
    fail(Status::format, "{}: expected ds4-bench's header 'ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,...', found '{}'",
         path, line);
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    std::vector<std::string> cells;
    std::stringstream in(line);
    for (std::string c; std::getline(in, c, ',');) cells.push_back(c);
    if (cells.size() < 5) fail(Status::format, "{}: row '{}' has {} cells, expected at least 5", path, line, cells.size());
    try {
      PeerRow r;
      r.ctx_tokens = std::stoi(cells[0]);
      r.prefill_tokens = std::stoi(cells[1]);
      r.prefill_tps = std::stod(cells[2]);
      r.gen_tokens = std::stoi(cells[3]);
      r.gen_tps = std::stod(cells[4]);
      if (r.ctx_tokens == ctx) return r;
    } catch (const std::exception &) {
      fail(Status::format, "{}: row '{}' is not numbers", path, line);
    }
  }
  fail(Status::format, "{}: no row for ctx_tokens {}", path, ctx);
}

struct PeerResult {
  Series prefill_tps, gen_tps;
  std::string error;  ///< empty when every run worked
  std::vector<std::string> commands;
};

PeerResult run_ds4(const std::string &exe, const std::string &model, const std::string &text_path, const std::string &work_dir,
                   bool cuda, int prompt_tokens, uint32_t gen, int reps, const std::string &extra_args, int timeout_s) {
  PeerResult out;
  const bool set_copy = std::getenv("DS4_CUDA_COPY_MODEL") == nullptr;
  for (int r = 0; r < reps; ++r) {
    const std::string csv = fmt::format("{}/ds4-run{}.csv", work_dir, r), log = fmt::format("{}/ds4-run{}.log", work_dir, r);
    std::error_code ec;
    std::filesystem::remove(csv, ec);
    const std::string cmd = fmt::format(
        "{}{}{} -m {} {} --prompt-file {} --ctx-start {} --ctx-max {} --gen-tokens {} --csv {}{}",
        cuda && set_copy ? "DS4_CUDA_COPY_MODEL=1 " : "", timeout_s > 0 ? fmt::format("timeout -k 10 {} ", timeout_s) : "",
        shell_quote(exe), shell_quote(model), cuda ? "--cuda" : "--cpu", shell_quote(text_path), prompt_tokens, prompt_tokens, gen,
        shell_quote(csv), extra_args.empty() ? "" : " " + extra_args);
    out.commands.push_back(cmd);
    std::fprintf(stderr, "ep-bench compute: ds4 run %d/%d: %s\n", r + 1, reps, cmd.c_str());
    int rc = -1;
    run_command(cmd + " >" + shell_quote(log) + " 2>&1", rc);
    if (rc != 0) {
      out.error = rc == 124 && timeout_s > 0 ? fmt::format("ds4-bench ran past --ds4-timeout {} s (log {}):\n{}", timeout_s, log, tail_of(log, 12))
                                             : fmt::format("ds4-bench exited with status {} (log {}):\n{}", rc, log, tail_of(log, 12));
      return out;
    }
    try {
      const PeerRow row = parse_ds4_csv(csv, prompt_tokens);
      if (row.gen_tokens != static_cast<int>(gen) || row.prefill_tokens != prompt_tokens)
        fail(Status::format, "{}: ds4-bench ran {} prompt and {} generated tokens, expected {} and {}", csv, row.prefill_tokens,
             row.gen_tokens, prompt_tokens, gen);
      out.prefill_tps.values.push_back(row.prefill_tps);
      out.gen_tps.values.push_back(row.gen_tps);
      std::fprintf(stderr, "ep-bench compute: ds4 run %d/%d: prefill %.1f tok/s, decode %.2f tok/s\n", r + 1, reps, row.prefill_tps,
                   row.gen_tps);
    } catch (const Error &e) {
      out.error = e.what();
      return out;
    }
  }
  return out;
}

#ifdef EP_HAVE_CUDA
double measure_hbm_gbps() {
  EP_CUDA_CHECK(cudaSetDevice(0));
  cudaStream_t stream = nullptr;
  EP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  double g = 0;
  try {
    g = hbm_copy_gbps(stream);
  } catch (...) {
    cudaStreamDestroy(stream);
    throw;
  }
  cudaStreamDestroy(stream);
  return g;
}
#endif

std::string met(bool ok) { return ok ? "met" : "not met"; }

}  // namespace

int cmd_compute(const Args &args) {
  const std::string model_path = args.get("model", "");
  if (model_path.empty()) fail(Status::invalid_argument, "--model PATH is required (a GGUF)");
  const std::string device = args.get("device", "cuda");
  if (device != "cuda" && device != "cpu") fail(Status::invalid_argument, "--device: cuda or cpu, not '{}'", device);
  const bool cuda = device == "cuda";
  const int prompt_tokens = static_cast<int>(args.number("prompt-tokens", 512));
  const auto gen = static_cast<uint32_t>(args.number("gen-tokens", 128));
  const int reps = static_cast<int>(args.number("reps", 3));
  const int warmup = static_cast<int>(args.number("warmup", 1));
  std::vector<uint32_t> batches;
  {
    const std::string list = args.get("batch", "");
    for (size_t at = 0; at < list.size();) {
      const size_t comma = std::min(list.find(',', at), list.size());
      const std::string item = list.substr(at, comma - at);
      char *end = nullptr;
      const unsigned long v = std::strtoul(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || v < 1 || v > 256)
        fail(Status::invalid_argument, "--batch: '{}' is not a batch size from 1 to 256 (a comma-separated list, e.g. 1,2,4,8)", item);
      batches.push_back(static_cast<uint32_t>(v));
      at = comma + 1;
    }
  }
  const std::string batch_sample = args.get("batch-sample", "batched");
  if (batch_sample != "batched" && batch_sample != "each")
    fail(Status::invalid_argument, "--batch-sample: '{}' (expected batched: one ep_sessions_sample per step, or each: one "
         "ep_session_sample per session)", batch_sample);
  const bool sample_each = batch_sample == "each";
  const std::string ds4_exe = args.get("ds4-bench", "");
  const int ds4_reps = static_cast<int>(args.number("ds4-reps", reps));
  if (prompt_tokens < 1 || gen < 1 || reps < 1 || warmup < 0 || ds4_reps < 1)
    fail(Status::invalid_argument, "--prompt-tokens, --gen-tokens, --reps and --ds4-reps must be >= 1, --warmup >= 0");
  if (!std::filesystem::is_regular_file(model_path)) fail(Status::not_found, "{}: no such model file", model_path);
  if (!ds4_exe.empty() && ::access(ds4_exe.c_str(), X_OK) != 0)
    fail(Status::not_found, "--ds4-bench {}: not an executable file", ds4_exe);

  std::string device_name = "CPU (reference backend)";
  if (cuda) {
    int32_t n = 0;
    check(ep_cuda_device_count(&n), "count CUDA devices");
    if (n == 0)
      fail(Status::no_device,
           "no CUDA device ({}); ep-bench compute measures on a GPU (--device cpu runs the same steps on the CPU backend, "
           "without the HBM bound: a check of the tool, not a measurement)",
           ep_last_error());
  }
  double hbm_before = 0, hbm_after = 0;
#ifdef EP_HAVE_CUDA
  if (cuda) {
    device_name = gpu::describe_device(0);
    hbm_before = measure_hbm_gbps();
    std::fprintf(stderr, "ep-bench compute: %s; HBM device-to-device copy %.0f GB/s\n", device_name.c_str(), hbm_before);
  }
#endif

  // Work files: the prompt text (for ds4-bench too) and ds4-bench's CSVs and logs.
  std::string work_dir = args.get("work-dir", "");
  bool remove_work_dir = false;
  if (work_dir.empty()) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ep-bench-compute-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) fail(Status::io, "{}: cannot create a work directory", tmpl);
    work_dir = tmpl;
    remove_work_dir = true;
  } else {
    std::filesystem::create_directories(work_dir);
  }

  ep_model_options mopt;
  ep_model_options_init(&mopt);
  mopt.device = cuda ? EP_DEVICE_CUDA : EP_DEVICE_CPU;
  mopt.resident_experts = 1;
  Handles h;
  const auto t_open = Clock::now();
  check(ep_model_open(&h.model, model_path.c_str(), &mopt), "open the model");
  const double open_seconds = seconds_since(t_open);
  ep_model_properties props;
  ep_model_properties_init(&props);
  check(ep_model_info(&props, h.model), "model info");
  std::fprintf(stderr, "ep-bench compute: %s: %s, %u layers, %u experts (top-%u), every expert resident, opened in %.1f s\n",
               model_path.c_str(), props.architecture, props.num_layers, props.num_experts, props.experts_per_token, open_seconds);

  // The prompt: the first prompt_tokens tokens of a text (the same text goes to ds4-bench).
  std::string text = args.options.count("prompt-file") ? read_text_file(args.get("prompt-file", "")) : std::string();
  std::vector<int32_t> prompt;
  const bool has_tokenizer = ep_tokenizer_open_model(&h.tok, h.model) == EP_OK;
  if (has_tokenizer && !text.empty()) {
    prompt = tokenize(h.tok, text);
    if (prompt.size() < static_cast<size_t>(prompt_tokens))
      fail(Status::invalid_argument, "the prompt text is {} tokens, --prompt-tokens asks for {}", prompt.size(), prompt_tokens);
  } else {
    if (!has_tokenizer && !ds4_exe.empty())
      fail(Status::invalid_argument, "{}: the model has no tokenizer, and ds4-bench needs a text prompt", model_path);
    prompt = synthetic_tokens(has_tokenizer ? h.tok : nullptr, props.vocab_size, static_cast<size_t>(prompt_tokens), &text);
  }
  prompt.resize(static_cast<size_t>(prompt_tokens));
  const std::string text_path = work_dir + "/prompt.txt";
  if (has_tokenizer) write_text_file(text_path, text);

  const TokenBytes bytes = decode_token_bytes(model_path, props.num_layers, props.experts_per_token);

  for (int i = 0; i < warmup; ++i) run_once(h.model, prompt, std::min<uint32_t>(gen, 16));
  Series prefill_tps, decode_tps;
  for (int r = 0; r < reps; ++r) {
    const Timing t = run_once(h.model, prompt, gen);
    prefill_tps.values.push_back(prompt_tokens / t.prefill_seconds);
    decode_tps.values.push_back(gen / t.decode_seconds);
    std::fprintf(stderr, "ep-bench compute: run %d/%d: prefill %.1f tok/s, decode %.2f tok/s\n", r + 1, reps, prefill_tps.values.back(),
                 decode_tps.values.back());
  }
  // Batched decode: each session's prompt is its own slice of a longer token sequence.
  std::vector<Series> batch_tps(batches.size());
  if (!batches.empty()) {
    const uint32_t most = *std::max_element(batches.begin(), batches.end());
    const std::vector<int32_t> pool =
        synthetic_tokens(has_tokenizer ? h.tok : nullptr, props.vocab_size, static_cast<size_t>(prompt_tokens) * most);
    for (size_t bi = 0; bi < batches.size(); ++bi) {
      std::vector<std::vector<int32_t>> prompts;
      for (uint32_t i = 0; i < batches[bi]; ++i)
        prompts.emplace_back(pool.begin() + static_cast<std::ptrdiff_t>(i) * prompt_tokens,
                             pool.begin() + static_cast<std::ptrdiff_t>(i + 1) * prompt_tokens);
      for (int w = 0; w < warmup; ++w) run_batch_once(h.model, prompts, std::min<uint32_t>(gen, 16), sample_each);
      for (int r = 0; r < reps; ++r) {
        const double sec = run_batch_once(h.model, prompts, gen, sample_each);
        batch_tps[bi].values.push_back(static_cast<double>(batches[bi]) * gen / sec);
        std::fprintf(stderr, "ep-bench compute: batch %u run %d/%d: %.1f tok/s aggregate\n", batches[bi], r + 1, reps,
                     batch_tps[bi].values.back());
      }
    }
  }
  h.close();

#ifdef EP_HAVE_CUDA
  if (cuda) hbm_after = measure_hbm_gbps();
#endif
  const double hbm = cuda ? 0.5 * (hbm_before + hbm_after) : 0;
  const double bound_ms = hbm > 0 ? static_cast<double>(bytes.total()) / (hbm * 1e9) * 1e3 : 0;
  const double decode_ms_median = 1e3 / decode_tps.median();
  const double over_bound = bound_ms > 0 ? decode_ms_median / bound_ms : 0;

  PeerResult peer;
  const bool with_peer = !ds4_exe.empty();
  if (with_peer)
    peer = run_ds4(ds4_exe, model_path, text_path, work_dir, cuda, prompt_tokens, gen, ds4_reps, args.get("ds4-args", ""),
                   static_cast<int>(args.number("ds4-timeout", 300)));
  const bool peer_ok = with_peer && peer.error.empty();
  const double decode_ratio = peer_ok ? decode_tps.median() / peer.gen_tps.median() : 0;
  const double prefill_ratio = peer_ok ? prefill_tps.median() / peer.prefill_tps.median() : 0;

  Json j;
  j["bench"] = "compute";
  j["date_utc"] = fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", fmt::gmtime(std::time(nullptr)));
  j["library_version"] = ep_version_string();
  j["model"] = model_path;
  j["architecture"] = props.architecture;
  j["layers"] = props.num_layers;
  j["experts"] = props.num_experts;
  j["experts_per_token"] = props.experts_per_token;
  j["device"] = device;
  j["device_name"] = device_name;
  j["resident_experts"] = true;
  j["prompt_tokens"] = prompt_tokens;
  j["gen_tokens"] = gen;
  j["warmup_runs"] = warmup;
  j["reps"] = reps;
  j["open_seconds"] = open_seconds;
  j["ours"] = {{"prefill_tps", prefill_tps.json()}, {"decode_tps", decode_tps.json()}, 
               {"decode_ms_per_token", {{"best", 1e3 / decode_tps.best()}, {"median", decode_ms_median}}}};
  if (!batches.empty()) {
    Json rows = Json::array();
    for (size_t bi = 0; bi < batches.size(); ++bi)
      rows.push_back({{"sessions", batches[bi]}, {"aggregate_decode_tps", batch_tps[bi].json()},
                      {"step_ms_median", 1e3 * batches[bi] / batch_tps[bi].median()}});
    j["batched_decode"] = rows;
    j["batch_sample"] = batch_sample;
  }
  j["decode_bytes_per_token"] = {{"total", bytes.total()},
                                 {"dense", bytes.dense},
                                 {"lookup_rows", bytes.lookup_rows},
                                 {"routed_experts", bytes.experts},
                                 {"routed_experts_all", bytes.expert_total},
                                 {"formula", kBytesFormula}};
  if (cuda) {
    j["hbm"] = {{"copy_gbps", hbm}, {"before_gbps", hbm_before}, {"after_gbps", hbm_after}, {"bound_ms_per_token", bound_ms},
                {"decode_over_bound", over_bound}};
  } else {
    j["hbm"] = nullptr;
  }
  if (with_peer) {
    Json p;
    p["engine"] = "ds4";
    p["ds4_bench"] = ds4_exe;
    p["reps"] = ds4_reps;
    p["commands"] = peer.commands;
    if (peer_ok) {
      p["prefill_tps"] = peer.prefill_tps.json();
      p["decode_tps"] = peer.gen_tps.json();
    } else {
      p["error"] = peer.error;
    }
    j["ds4"] = p;
  } else {
    j["ds4"] = nullptr;
  }
  Json targets;
  if (peer_ok) {
    targets["decode_vs_ds4"] = {{"ratio", decode_ratio}, {"target_min", kDecodeTargetVsDs4}, {"met", decode_ratio >= kDecodeTargetVsDs4}};
    targets["prefill_vs_ds4"] = {{"ratio", prefill_ratio}, {"target_min", kPrefillTargetVsDs4}, {"met", prefill_ratio >= kPrefillTargetVsDs4}};
  }
  if (bound_ms > 0)
    targets["decode_vs_hbm_bound"] = {{"ratio", over_bound}, {"target_max", kDecodeTargetVsHbm}, {"met", over_bound <= kDecodeTargetVsHbm}};
  targets["statistic"] = "median of the repetitions";
  j["targets"] = targets;

  if (args.options.count("json")) {
    std::ofstream f(args.get("json", ""));
    f << j.dump(2) << "\n";
    if (!f) fail(Status::io, "{}: cannot write the JSON report", args.get("json", ""));
  }
  if (args.options.count("csv")) {
    std::ofstream f(args.get("csv", ""));
    f << "engine,run,prompt_tokens,prefill_tps,gen_tokens,gen_tps\n";
    for (size_t i = 0; i < prefill_tps.values.size(); ++i)
      f << fmt::format("libexpertpack,{},{},{:.2f},{},{:.2f}\n", i + 1, prompt_tokens, prefill_tps.values[i], gen, decode_tps.values[i]);
    for (size_t i = 0; i < peer.prefill_tps.values.size(); ++i)
      f << fmt::format("ds4,{},{},{:.2f},{},{:.2f}\n", i + 1, prompt_tokens, peer.prefill_tps.values[i], gen, peer.gen_tps.values[i]);
    if (!f) fail(Status::io, "{}: cannot write the CSV", args.get("csv", ""));
  }

  std::printf("model %s: %s, %u layers, %u experts, top-%u, every expert resident\n", model_path.c_str(), props.architecture,
              props.num_layers, props.num_experts, props.experts_per_token);
  std::printf("device %s; prompt %d tokens, %u generated (greedy, EOS ignored); %d runs after %d warm-up%s\n", device_name.c_str(),
              prompt_tokens, gen, reps, warmup, with_peer ? fmt::format("; ds4: {} runs", ds4_reps).c_str() : "");
  std::printf("%-16s %12s %12s %12s %12s %16s %10s\n", "", "ours best", "ours median", "ds4 best", "ds4 median", "ours/ds4 (med)",
              "target");
  auto row = [&](const char *name, const Series &ours, const Series &theirs, double ratio, double target) {
    if (peer_ok)
      std::printf("%-16s %12.2f %12.2f %12.2f %12.2f %16.3f %9s  %s\n", name, ours.best(), ours.median(), theirs.best(), theirs.median(),
                  ratio, fmt::format(">= {:.1f}", target).c_str(), met(ratio >= target).c_str());
    else
      std::printf("%-16s %12.2f %12.2f %12s %12s %16s %10s\n", name, ours.best(), ours.median(), "-", "-", "-", "-");
  };
  row("prefill tok/s", prefill_tps, peer.prefill_tps, prefill_ratio, kPrefillTargetVsDs4);
  row("decode tok/s", decode_tps, peer.gen_tps, decode_ratio, kDecodeTargetVsDs4);
  std::printf("bytes per decode token: %.1f MB = dense %.1f MB + lookup rows %.3f MB + routed experts %.1f MB (top-%u of %u of %.1f MB)\n",
              static_cast<double>(bytes.total()) / 1e6, static_cast<double>(bytes.dense) / 1e6,
              static_cast<double>(bytes.lookup_rows) / 1e6, static_cast<double>(bytes.experts) / 1e6, props.experts_per_token,
              props.num_experts, static_cast<double>(bytes.expert_total) / 1e6);
  if (bound_ms > 0)
    std::printf("HBM copy %.0f GB/s (%.0f before, %.0f after): bound %.4f ms/token; decode %.4f ms/token (median) = %.2fx the bound "
                "(target <= %.0fx): %s\n",
                hbm, hbm_before, hbm_after, bound_ms, decode_ms_median, over_bound, kDecodeTargetVsHbm, met(over_bound <= kDecodeTargetVsHbm).c_str());
  else
    std::printf("no HBM bound on the %s backend: decode %.4f ms/token (median)\n", device.c_str(), decode_ms_median);

  if (!batches.empty()) {
    std::printf("batched decode (sessions stepped together, %u tokens each after a %d-token prompt; %d runs; %s):\n", gen,
                prompt_tokens, reps, sample_each ? "one ep_session_sample per session" : "one ep_sessions_sample per step");
    std::printf("%10s %22s %16s %18s\n", "sessions", "aggregate tok/s (med)", "step ms (med)", "x one session");
    const double one = batches.front() == 1 ? batch_tps.front().median() : 0;
    for (size_t bi = 0; bi < batches.size(); ++bi) {
      const double med = batch_tps[bi].median();
      std::printf("%10u %22.1f %16.3f %18s\n", batches[bi], med, 1e3 * batches[bi] / med, one > 0 ? fmt::format("{:.2f}", med / one).c_str() : "-");
    }
  }
  if (with_peer && !peer_ok) {
    std::fprintf(stderr, "ep-bench compute: ds4 failed: %s\nwork files kept in %s\n", peer.error.c_str(), work_dir.c_str());
    return 1;
  }
  if (remove_work_dir) {
    std::error_code ec;
    std::filesystem::remove_all(work_dir, ec);
  }
  return 0;
}

}  // namespace ep::bench
