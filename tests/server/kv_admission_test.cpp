// The server's admission by memory (examples/server/kv_admission.cpp) without a server, on a
// small synthetic DeepSeek-V4 whose file states a context length of 64: the max_tokens a
// request that gives none gets (what remains of the context, bounded by --max-tokens and by the
// KV budget, for every answer), the 400s for a request that never fits, with the field they
// name, and the prefix cache's kept states within the KV budget (session_cache.cpp).
#include "support/catch.hpp"
#include "support/context_model.hpp"
#include "support/temp_dir.hpp"

#include "kv_admission.hpp"
#include "request.hpp"
#include "session_cache.hpp"

#include <expertpack/expertpack.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

using ep_server::ApiError;
using ep_server::JobRequest;
using ep_server::KvAdmission;
using ep_server::PrefixCache;
using ep_server::SessionPtr;

namespace {

constexpr uint64_t kContext = 64;

struct Model {
  ep_model *m = nullptr;
  Model(const std::string &path, uint64_t kv_budget_bytes) {
    ep_model_options o;
    ep_model_options_init(&o);
    o.device = EP_DEVICE_CPU;
    o.resident_experts = 1;
    o.cpu_threads = 2;
    o.kv_budget_bytes = kv_budget_bytes;
    const ep_status st = ep_model_open(&m, path.c_str(), &o);
    INFO(ep_last_error());
    REQUIRE(st == EP_OK);
  }
  ~Model() { ep_model_close(m); }
  uint64_t state(uint64_t tokens) const {
    uint64_t b = 0;
    REQUIRE(ep_model_state_bytes(&b, m, tokens) == EP_OK);
    return b;
  }
};

JobRequest request(size_t prompt, uint32_t max_tokens, uint32_t n = 1) {
  JobRequest r;
  r.prompt.assign(prompt, 7);
  r.max_tokens = max_tokens;
  r.n = n;
  return r;
}

/// The ApiError admit() throws for @p r (status 0 when it throws none).
ApiError refusal(const KvAdmission &kv, JobRequest r, uint32_t cap = 0) {
  try {
    kv.admit(r, "prompt", cap);
  } catch (const ApiError &e) {
    return e;
  }
  return ApiError{0, "", "", ""};
}

}  // namespace

TEST_CASE("admission: without max_tokens a request gets what remains of the context", "[server][kv]") {
  ep::test::TempDir dir;
  const std::string path = ep::test::write_context_model(dir, static_cast<int64_t>(kContext));
  const Model model(path, 0);  // automatic: a quarter of the RAM, far more than a session of 64 tokens
  const KvAdmission kv(model.m);
  REQUIRE(kv.context_length() == kContext);
  REQUIRE(model.state(kContext) * 8 < kv.budget_bytes());

  CHECK(kv.default_max_tokens(request(60, 0), 0) == 4);
  CHECK(kv.default_max_tokens(request(1, 0), 0) == kContext - 1);
  CHECK(kv.default_max_tokens(request(60, 0), 3) == 3);  // --max-tokens caps it
  CHECK(kv.default_max_tokens(request(64, 0), 0) == 0);  // nothing remains
  CHECK(kv.default_max_tokens(request(60, 0, 8), 0) == 4);

  // A long prompt without max_tokens is admitted with the rest of the context.
  JobRequest r = request(50, 0);
  kv.admit(r, "messages", 0);
  CHECK(r.max_tokens == 14);
  // Given, max_tokens stays as it is.
  JobRequest given = request(50, 5);
  kv.admit(given, "messages", 0);
  CHECK(given.max_tokens == 5);

  // Past the context: the field that is too long is named.
  const ApiError asked = refusal(kv, request(50, 15));
  CHECK(asked.status == 400);
  CHECK(asked.code == "context_length_exceeded");
  CHECK(asked.param == "max_tokens");
  CHECK(asked.message.find("maximum context length is 64 tokens. However, you requested 65 tokens (50 in the prompt, 15 in the "
                           "completion)") != std::string::npos);
  CHECK(refusal(kv, request(65, 1)).param == "prompt");
  // A prompt that fills the context, without max_tokens: the prompt is what is too long.
  const ApiError full = refusal(kv, request(64, 0));
  CHECK(full.status == 400);
  CHECK(full.param == "prompt");
}

TEST_CASE("admission: without max_tokens a request gets what the KV budget holds of its answers", "[server][kv]") {
  ep::test::TempDir dir;
  const std::string path = ep::test::write_context_model(dir, static_cast<int64_t>(kContext));
  // The last length within the context where one more token grows the state (the compressors'
  // entries and pending rows grow in steps), and what a session holds just below and at it.
  uint64_t grow = 0, below = 0, at = 0, at10 = 0;
  {
    const Model probe(path, 0);
    for (uint64_t l = 2; l < kContext; ++l)
      if (probe.state(l) > probe.state(l - 1)) grow = l;
    below = probe.state(grow - 1);
    at = probe.state(grow);
    at10 = probe.state(10);
  }
  REQUIRE(grow > 11);
  // Room for two sessions one token short of it, not for two at it.
  const Model model(path, 2 * below + (at - below));
  const KvAdmission kv(model.m);
  // Two answers of a 10-token prompt: grow − 10 tokens make sessions of grow − 1 (the last
  // sampled token is never appended); one more would make them grow.
  const uint32_t most = static_cast<uint32_t>(grow - 10);
  CHECK(kv.default_max_tokens(request(10, 0, 2), 0) == most);
  JobRequest r = request(10, 0, 2);
  kv.admit(r, "prompt", 0);
  CHECK(r.max_tokens == most);
  CHECK(kv.request_bytes(r) == 2 * below);
  // One answer may have more (its state stops growing below the context): the context bounds it.
  CHECK(kv.default_max_tokens(request(10, 0, 1), 0) == kContext - 10);
  // Asked for, one token more for two answers outgrows the budget: 400 naming max_tokens.
  const ApiError asked = refusal(kv, request(10, most + 1, 2));
  CHECK(asked.status == 400);
  CHECK(asked.param == "max_tokens");
  CHECK(asked.message.find("KV budget") != std::string::npos);
  CHECK(asked.message.find("in each of 2 answers") != std::string::npos);

  // A budget with room for one session of 10 tokens only: eight answers of a 10-token prompt
  // never fit, and without max_tokens the prompt is named.
  const Model tight(path, at10 + at10 / 2);
  const KvAdmission small(tight.m);
  CHECK(small.default_max_tokens(request(10, 0, 8), 0) == 0);
  const ApiError none = refusal(small, request(10, 0, 8));
  CHECK(none.status == 400);
  CHECK(none.param == "prompt");
}

TEST_CASE("admission: a prefix state is kept only in KV budget no running request needs", "[server][kv]") {
  ep::test::TempDir dir;
  const std::string path = ep::test::write_context_model(dir, static_cast<int64_t>(kContext));
  const Model model(path, 0);
  const KvAdmission kv(model.m);
  // Two sessions holding the 8 and 16 tokens of one prompt (blocks of 8).
  std::vector<int32_t> prompt(16);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37 + 11) % 256);
  const auto session_of = [&](size_t tokens) {
    ep_session *s = nullptr;
    REQUIRE(ep_session_open(&s, model.m) == EP_OK);
    const int32_t *t = prompt.data();
    REQUIRE(ep_sessions_append(&s, &t, &tokens, 1) == EP_OK);
    return SessionPtr(s);
  };
  const SessionPtr eight = session_of(8), sixteen = session_of(16);
  const uint64_t kv8 = kv.session_bytes(8), kv16 = kv.session_bytes(16);
  const auto in_use = [&] {
    uint64_t b = 0;
    REQUIRE(ep_model_kv_in_use(&b, model.m) == EP_OK);
    return b;
  };
  const uint64_t running = in_use();
  const std::span<const int32_t> first8(prompt.data(), 8), all16(prompt.data(), 16);

  PrefixCache cache(8, uint64_t{1} << 30);
  // No room beside the running requests: not kept, and nothing is forked.
  cache.offer(first8, eight.get(), kv8, kv8 - 1);
  CHECK(cache.stats().entries == 0);
  CHECK(cache.stats().kv_full == 1);
  CHECK(in_use() == running);
  // Room: kept, and the copy counts against the KV budget as a session of its length.
  cache.offer(first8, eight.get(), kv8, kv8);
  REQUIRE(cache.stats().entries == 1);
  CHECK(in_use() == running + kv8);
  // The longer state with room for neither beside the first: the first (least recently used)
  // makes room when what it gives back is enough, else both stay as they are.
  cache.offer(all16, sixteen.get(), kv16, kv16 - kv8 - 1);
  CHECK(cache.stats().kv_full == 2);
  CHECK(cache.stats().entries == 1);
  cache.offer(all16, sixteen.get(), kv16, kv16 - kv8);
  CHECK(cache.stats().entries == 1);
  CHECK(cache.stats().evictions == 1);
  CHECK(in_use() == running + kv16);
  CHECK(cache.fork_longest_prefix(prompt).length == 16);
  // Admission drops kept states for a request: their bytes go back to the budget.
  CHECK(cache.evict_oldest());
  CHECK(in_use() == running);
  CHECK_FALSE(cache.evict_oldest());
  CHECK(cache.stats().entries == 0);
}
