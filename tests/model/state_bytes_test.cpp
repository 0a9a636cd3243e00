// CausalLm::state_bytes, the number the engine's KV budget counts, against the backend memory a
// state really holds (LmState::state_bytes) on the CPU: equal after every token when tokens are
// appended one at a time, never below it whatever the chunks, and the same for a fork. DeepSeek-V4
// (window, compressors, CSA overlap and indexer, entries) and Kimi-K3 (KDA state, MLA f32 keys
// and values), on small synthetic files.
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

#include "backend/cpu_backend.hpp"
#include "model/causal_lm.hpp"
#include "testkit/deepseek_v4_gguf.hpp"
#include "testkit/kimi_gguf.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace {

std::vector<int32_t> some_tokens(int64_t n, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>((i * 37 + 11) % vocab);
  return t;
}

void check_model(const std::string &path, int64_t n) {
  ep::backend::CpuBackend cpu(2);
  const std::unique_ptr<ep::model::CausalLm> lm = ep::model::open_causal_lm(path, cpu);
  const std::vector<int32_t> tokens = some_tokens(n, lm->info().vocab);
  {
    INFO(path << ": one token at a time");
    std::unique_ptr<ep::model::LmState> s = lm->new_state();
    CHECK(s->state_bytes() == lm->state_bytes(0));
    for (int64_t i = 0; i < n; ++i) {
      lm->forward(&tokens[static_cast<size_t>(i)], 1, *s, ep::model::LogitRows::none);
      INFO("after " << i + 1 << " tokens");
      REQUIRE(s->state_bytes() == lm->state_bytes(i + 1));
    }
    // More tokens hold more memory: the rule is not a constant.
    CHECK(lm->state_bytes(n) > lm->state_bytes(1));
    const std::unique_ptr<ep::model::LmState> fork = s->clone();
    CHECK(fork->state_bytes() == s->state_bytes());
  }
  {
    INFO(path << ": chunks of 7, 13, 1, 19, ...");
    std::unique_ptr<ep::model::LmState> s = lm->new_state();
    const int64_t chunks[] = {7, 13, 1, 19};
    int64_t done = 0;
    for (size_t c = 0; done < n; ++c) {
      const int64_t k = std::min<int64_t>(chunks[c % 4], n - done);
      lm->forward(tokens.data() + done, k, *s, ep::model::LogitRows::none);
      done += k;
      INFO("after " << done << " tokens");
      CHECK(s->state_bytes() <= lm->state_bytes(done));
      // Only the pending rows of an unfinished compressor window may be missing.
      CHECK(s->state_bytes() * 2 >= lm->state_bytes(done));
    }
  }
}

}  // namespace

TEST_CASE("state_bytes: DeepSeek-V4's window, compressors and indexer", "[model][kv]") {
  ep::test::TempDir dir;
  ep::testkit::DeepseekV4SyntheticSpec spec;  // sliding, CSA 4, HCA 16, CSA 4; window 16
  const std::string path = dir / "ds4.gguf";
  ep::testkit::write_deepseek_v4_synthetic_gguf(spec, path);
  // 80 tokens: 20 entries per CSA compressor, past the first capacity of 16 rows.
  check_model(path, 80);
}

TEST_CASE("state_bytes: Kimi-K3's KDA state and MLA keys and values", "[model][kv]") {
  ep::test::TempDir dir;
  ep::testkit::KimiSyntheticSpec spec;
  const std::string path = ep::testkit::write_kimi_synthetic_gguf(spec, dir / "k3.gguf");
  // 40 tokens: the MLA rows pass 16 and 32.
  check_model(path, 40);
}
