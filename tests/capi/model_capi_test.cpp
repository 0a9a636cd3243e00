// The model C API (include/expertpack/model.h) on the DeepSeek-V4 goldens: ep_score against
// transformers, ep_generate against ep_score, cancellation, stop token, sampling determinism, a
// session's state bytes and draw counter, and the argument / struct-size checks.
#include "support/catch.hpp"

#include <expertpack/expertpack.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Fixture {
  std::string gguf = std::string(EP_TEST_DATA_DIR) + "/deepseek_v4/deepseek_v4_a.gguf";
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  ep_model *model = nullptr;
  Fixture() {
    const std::string base = std::string(EP_TEST_DATA_DIR) + "/deepseek_v4/deepseek_v4_a";
    const nlohmann::json meta = nlohmann::json::parse(slurp(base + ".json"));
    for (const auto &t : meta.at("tokens")) tokens.push_back(t.get<int32_t>());
    const std::string raw = slurp(base + ".logits.f32");
    logits.resize(raw.size() / 4);
    std::memcpy(logits.data(), raw.data(), raw.size());
    ep_model_options o;
    ep_model_options_init(&o);
    o.device = EP_DEVICE_CPU;  // the exact reference; the CUDA backend is tested in tests/cuda
    REQUIRE(ep_model_open(&model, gguf.c_str(), &o) == EP_OK);
  }
  ~Fixture() { ep_model_close(model); }
};

int32_t argmax(const float *row, size_t n) {
  size_t best = 0;
  for (size_t i = 1; i < n; ++i)
    if (row[i] > row[best]) best = i;
  return static_cast<int32_t>(best);
}

struct Collect {
  std::vector<int32_t> tokens;
  int stop_at = -1;
};
int collect(int32_t token, uint32_t index, void *payload) {
  auto *c = static_cast<Collect *>(payload);
  c->tokens.push_back(token);
  return c->stop_at >= 0 && static_cast<int>(index) == c->stop_at ? 1 : 0;
}

}  // namespace

TEST_CASE("model C API: info and teacher-forced scoring match the goldens", "[model][capi]") {
  Fixture f;
  ep_model_properties p;
  ep_model_properties_init(&p);
  REQUIRE(ep_model_info(&p, f.model) == EP_OK);
  CHECK(std::string(p.architecture) == "deepseek4");
  CHECK(p.vocab_size == 97);
  CHECK(p.num_layers == 4);
  CHECK(p.hidden_size == 96);
  CHECK(p.num_experts == 6);
  CHECK(p.experts_per_token == 2);
  CHECK(p.weight_bytes > 0);
  CHECK(p.device == EP_DEVICE_CPU);  // what the fixture asked for
  CHECK(p.device_index == -1);
  // a caller built against the first published struct (no device fields) gets those bytes untouched
  ep_model_properties v1;
  std::memset(&v1, 0xab, sizeof v1);
  v1.struct_size = offsetof(ep_model_properties, device);
  REQUIRE(ep_model_info(&v1, f.model) == EP_OK);
  CHECK(v1.experts_per_token == 2);
  uint32_t untouched = 0;  // the bytes, not the enum: 0xabababab is no ep_device_kind value
  std::memcpy(&untouched, reinterpret_cast<const unsigned char *>(&v1) + offsetof(ep_model_properties, device), 4);
  CHECK(untouched == 0xababababu);
  const size_t V = p.vocab_size, S = f.tokens.size();

  ep_session *s = nullptr;
  REQUIRE(ep_session_open(&s, f.model) == EP_OK);
  std::vector<float> full(S * V);
  REQUIRE(ep_score(s, f.tokens.data(), S, 0, nullptr, full.data()) == EP_OK);
  uint64_t len = 0;
  REQUIRE(ep_session_length(&len, s) == EP_OK);
  CHECK(len == S);
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(full[i]) - f.logits[i]));
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(f.logits[i])));
  }
  CHECK(max_diff <= 1e-4 * max_ref);

  // top-k mode: the k largest of the full rows, descending
  REQUIRE(ep_session_reset(s) == EP_OK);
  const uint32_t k = 5;
  std::vector<int32_t> ids(S * k);
  std::vector<float> top(S * k);
  REQUIRE(ep_score(s, f.tokens.data(), S, k, ids.data(), top.data()) == EP_OK);
  for (size_t t = 0; t < S; ++t) {
    const float *row = full.data() + t * V;
    CHECK(ids[t * k] == argmax(row, V));
    for (uint32_t j = 0; j < k; ++j) {
      CHECK(top[t * k + j] == row[ids[t * k + j]]);
      if (j) CHECK(top[t * k + j] <= top[t * k + j - 1]);
    }
  }
  ep_session_close(s);
}

TEST_CASE("model C API: generation follows the model's own scores", "[model][capi]") {
  Fixture f;
  const size_t V = 97, n_prompt = 20;
  ep_session *s = nullptr;
  REQUIRE(ep_session_open(&s, f.model) == EP_OK);
  ep_generate_options o;
  ep_generate_options_init(&o);
  o.max_new_tokens = 8;
  ep_generate_stats st;
  ep_generate_stats_init(&st);
  Collect c;
  ep_store_stats before, after;
  ep_store_stats_init(&before);
  ep_store_stats_init(&after);
  REQUIRE(ep_model_store_stats(&before, f.model) == EP_OK);
  REQUIRE(ep_generate(&st, s, f.tokens.data(), n_prompt, &o, collect, &c) == EP_OK);
  REQUIRE(ep_model_store_stats(&after, f.model) == EP_OK);
  REQUIRE(c.tokens.size() == 8);
  CHECK(st.prompt_tokens == n_prompt);
  CHECK(st.generated_tokens == 8);
  // the experts read from the pack, split at the first token: a cold cache reads during the
  // prompt; the two parts add up to what the store counted over the call
  CHECK(st.prefill_expert_bytes > 0);
  CHECK(st.prefill_expert_bytes + st.decode_expert_bytes == after.pack_read_bytes - before.pack_read_bytes);
  uint64_t len = 0;
  REQUIRE(ep_session_length(&len, s) == EP_OK);
  CHECK(len == n_prompt + 8);
  // greedy: each token is the first maximum of the logits that precede it
  std::vector<int32_t> seq(f.tokens.begin(), f.tokens.begin() + n_prompt);
  seq.insert(seq.end(), c.tokens.begin(), c.tokens.end() - 1);
  ep_session *t = nullptr;
  REQUIRE(ep_session_open(&t, f.model) == EP_OK);
  std::vector<float> rows(seq.size() * V);
  REQUIRE(ep_score(t, seq.data(), seq.size(), 0, nullptr, rows.data()) == EP_OK);
  for (size_t j = 0; j < c.tokens.size(); ++j) CHECK(c.tokens[j] == argmax(rows.data() + (n_prompt - 1 + j) * V, V));

  // continuing the session with an empty prompt generates what the longer prompt would
  Collect more;
  o.max_new_tokens = 2;
  REQUIRE(ep_generate(nullptr, s, nullptr, 0, &o, collect, &more) == EP_OK);
  CHECK(more.tokens.size() == 2);

  // cancellation after the third token
  REQUIRE(ep_session_reset(s) == EP_OK);
  Collect stop;
  stop.stop_at = 2;
  o.max_new_tokens = 8;
  CHECK(ep_generate(&st, s, f.tokens.data(), n_prompt, &o, collect, &stop) == EP_ERR_CANCELLED);
  CHECK(stop.tokens.size() == 3);
  CHECK(st.generated_tokens == 3);
  REQUIRE(ep_session_length(&len, s) == EP_OK);
  CHECK(len == n_prompt + 3);

  // stop token
  REQUIRE(ep_session_reset(s) == EP_OK);
  Collect one;
  o.stop_token = c.tokens[0];
  REQUIRE(ep_generate(&st, s, f.tokens.data(), n_prompt, &o, collect, &one) == EP_OK);
  CHECK(one.tokens.size() == 1);

  // seeded sampling is deterministic
  std::vector<int32_t> runs[2];
  for (auto &r : runs) {
    REQUIRE(ep_session_reset(s) == EP_OK);
    Collect cc;
    ep_generate_options so;
    ep_generate_options_init(&so);
    so.max_new_tokens = 6;
    so.temperature = 0.9f;
    so.seed = 7;
    REQUIRE(ep_generate(nullptr, s, f.tokens.data(), n_prompt, &so, collect, &cc) == EP_OK);
    r = cc.tokens;
  }
  CHECK(runs[0] == runs[1]);
  ep_session_close(t);
  ep_session_close(s);
}

TEST_CASE("model C API: a session's state bytes and its sampler's draw counter", "[model][capi]") {
  Fixture f;
  const size_t V = 97, n_prompt = 20;
  ep_session *s = nullptr;
  REQUIRE(ep_session_open(&s, f.model) == EP_OK);
  uint64_t empty = 0;
  REQUIRE(ep_session_state_bytes(&empty, s) == EP_OK);
  CHECK(empty >= V * sizeof(float));  // the last logits at least
  const int32_t *tokens = f.tokens.data();
  size_t count = n_prompt;
  REQUIRE(ep_sessions_append(&s, &tokens, &count, 1) == EP_OK);
  uint64_t full = 0;
  REQUIRE(ep_session_state_bytes(&full, s) == EP_OK);
  CHECK(full > empty);  // the compressed KV's entries grew
  // A fork holds as many bytes.
  ep_session *copy = nullptr;
  REQUIRE(ep_session_fork(&copy, s) == EP_OK);
  uint64_t copied = 0;
  REQUIRE(ep_session_state_bytes(&copied, copy) == EP_OK);
  CHECK(copied == full);

  // Seeded draws from the same logits: a fork taken after them continues the sequence, and with
  // its counter set to 0 repeats it from the start.
  ep_generate_options o;
  ep_generate_options_init(&o);
  o.temperature = 1.5f;
  o.seed = 11;
  std::vector<int32_t> first(8), continued(8), again(8);
  for (int32_t &t : first) REQUIRE(ep_session_sample(&t, s, &o) == EP_OK);
  ep_session *later = nullptr;
  REQUIRE(ep_session_fork(&later, s) == EP_OK);
  for (int32_t &t : continued) REQUIRE(ep_session_sample(&t, later, &o) == EP_OK);
  REQUIRE(ep_session_set_draw_count(later, 0) == EP_OK);
  for (int32_t &t : again) REQUIRE(ep_session_sample(&t, later, &o) == EP_OK);
  CHECK(again == first);
  CHECK(continued != first);  // the counter, not the logits alone, decides a draw

  CHECK(ep_session_state_bytes(nullptr, s) == EP_ERR_INVALID_ARGUMENT);
  CHECK(ep_session_state_bytes(&full, nullptr) == EP_ERR_INVALID_ARGUMENT);
  CHECK(ep_session_set_draw_count(nullptr, 0) == EP_ERR_INVALID_ARGUMENT);
  ep_session_close(later);
  ep_session_close(copy);
  ep_session_close(s);
}

TEST_CASE("model C API: argument and struct-size checks", "[model][capi]") {
  const std::string gguf = std::string(EP_TEST_DATA_DIR) + "/deepseek_v4/deepseek_v4_b.gguf";
  ep_model *m = reinterpret_cast<ep_model *>(1);
  CHECK(ep_model_open(&m, nullptr, nullptr) == EP_ERR_INVALID_ARGUMENT);
  CHECK(m == nullptr);
  CHECK(ep_model_open(nullptr, gguf.c_str(), nullptr) == EP_ERR_INVALID_ARGUMENT);
  CHECK(ep_model_open(&m, "/nonexistent/model.gguf", nullptr) == EP_ERR_NOT_FOUND);
  ep_model_options o;
  ep_model_options_init(&o);
  o.struct_size = 4;
  CHECK(ep_model_open(&m, gguf.c_str(), &o) == EP_ERR_STRUCT_SIZE);
  ep_model_options_init(&o);
  o.device = EP_DEVICE_CUDA;
  int32_t n_gpus = 0;
  REQUIRE(ep_cuda_device_count(&n_gpus) == EP_OK);
  if (n_gpus == 0) {
    CHECK(ep_model_open(&m, gguf.c_str(), &o) == EP_ERR_NO_DEVICE);
    CHECK(std::string(ep_last_error()).find("CUDA") != std::string::npos);
  } else {
    REQUIRE(ep_model_open(&m, gguf.c_str(), &o) == EP_OK);
    ep_model_close(m);
    o.device_index = n_gpus;  // one past the last
    CHECK(ep_model_open(&m, gguf.c_str(), &o) == EP_ERR_NO_DEVICE);
  }
  ep_model_options_init(&o);
  o.device = static_cast<ep_device_kind>(7);
  CHECK(ep_model_open(&m, gguf.c_str(), &o) == EP_ERR_INVALID_ARGUMENT);
  ep_model_options_init(&o);
  o.direct_io = 3;
  CHECK(ep_model_open(&m, gguf.c_str(), &o) == EP_ERR_INVALID_ARGUMENT);
  // every value is checked once, in ep_model_open, and named by its C field
  ep_model_options_init(&o);
  o.cpu_threads = 5000;
  CHECK(ep_model_open(&m, gguf.c_str(), &o) == EP_ERR_INVALID_ARGUMENT);
  CHECK(std::string(ep_last_error()) == "ep_model_open: cpu_threads 5000 (expected 0 .. 4096)");
  ep_model_options_init(&o);
  o.overlap_reads = 2;
  CHECK(ep_model_open(&m, gguf.c_str(), &o) == EP_ERR_INVALID_ARGUMENT);
  CHECK(std::string(ep_last_error()) == "ep_model_open: overlap_reads 2 (expected 0 or 1)");
  // the defaults model.h documents
  ep_model_options_init(&o);
  CHECK(o.device == EP_DEVICE_AUTO);
  CHECK(o.device_index == 0);
  CHECK(o.cache_budget_bytes == 0u);
  CHECK(o.direct_io == -1);
  CHECK(o.pack_dir == nullptr);
  CHECK(o.pack_build == 1);
  CHECK(o.resident_experts == 0);
  CHECK(o.cpu_threads == 0);
  CHECK(o.host_cache_bytes == 0u);
  CHECK(o.overlap_reads == 1);
  CHECK(o.prefetch == 0);
  CHECK(o.cache_policy == nullptr);
  CHECK(o.no_pack == 0);
  ep_model_close(nullptr);
  ep_session_close(nullptr);

  ep_model_options_init(&o);
  o.device = EP_DEVICE_CPU;
  REQUIRE(ep_model_open(&m, gguf.c_str(), &o) == EP_OK);
  ep_session *s = nullptr;
  REQUIRE(ep_session_open(&s, m) == EP_OK);
  const int32_t bad[2] = {1, 83};
  float out[2 * 83];
  int32_t ids[4];
  CHECK(ep_score(s, bad, 2, 0, nullptr, out) == EP_ERR_INVALID_ARGUMENT);
  CHECK(std::string(ep_last_error()).find("83") != std::string::npos);
  const int32_t good[2] = {1, 2};
  CHECK(ep_score(s, good, 0, 0, nullptr, out) == EP_ERR_INVALID_ARGUMENT);
  CHECK(ep_score(s, good, 2, 84, ids, out) == EP_ERR_INVALID_ARGUMENT);
  CHECK(ep_score(s, good, 2, 2, nullptr, out) == EP_ERR_INVALID_ARGUMENT);
  CHECK(ep_generate(nullptr, s, nullptr, 0, nullptr, nullptr, nullptr) == EP_ERR_INVALID_ARGUMENT);
  ep_generate_options g;
  ep_generate_options_init(&g);
  g.struct_size = 1;
  CHECK(ep_generate(nullptr, s, good, 2, &g, nullptr, nullptr) == EP_ERR_STRUCT_SIZE);
  ep_model_properties p;
  ep_model_properties_init(&p);
  p.struct_size = 0;
  CHECK(ep_model_info(&p, m) == EP_ERR_STRUCT_SIZE);
  CHECK(ep_score(s, good, 2, 2, ids, out) == EP_OK);
  ep_session_close(s);
  ep_model_close(m);
}
