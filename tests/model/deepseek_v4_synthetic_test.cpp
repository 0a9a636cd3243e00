// The project's own synthetic DeepSeek-V4 GGUF generator: runnable models of any shape and
// expert type load and run on the CPU backend, incremental decode equals full recompute, and the
// file is a pure function of the seed.
#include "support/catch.hpp"

#include "backend/cpu_backend.hpp"
#include "core/error.hpp"
#include "model/deepseek_v4.hpp"
#include "support/batched_forward.hpp"
#include "testkit/deepseek_v4_gguf.hpp"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace fs = std::filesystem;

namespace {

fs::path temp_file(const std::string &tag) {
  static int counter = 0;
  return fs::temp_directory_path() / ("ep_deepseek_v4_synth_" + tag + "_" + std::to_string(getpid()) + "_" + std::to_string(counter++) + ".gguf");
}

std::string slurp(const fs::path &p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void run_and_check(const ep::testkit::DeepseekV4SyntheticSpec &spec, int64_t n_tokens) {
  const fs::path path = temp_file("run");
  ep::testkit::write_deepseek_v4_synthetic_gguf(spec, path.string());
  ep::backend::CpuBackend cpu;
  auto model = ep::model::DeepseekV4Model::open(path.string(), cpu);
  const int64_t V = model->config().vocab;
  std::vector<int32_t> tokens;
  for (int64_t t = 0; t < n_tokens; ++t) tokens.push_back(static_cast<int32_t>((t * 37 + 11) % V));
  std::vector<float> full(static_cast<size_t>(n_tokens * V)), inc(full.size());
  auto st = model->new_state();
  model->forward(tokens.data(), n_tokens, st, full.data());
  double max_abs = 0, spread = 0;
  for (int64_t t = 0; t < n_tokens; ++t) {
    float lo = INFINITY, hi = -INFINITY;
    for (int64_t v = 0; v < V; ++v) {
      const float x = full[static_cast<size_t>(t * V + v)];
      REQUIRE(std::isfinite(x));
      lo = std::min(lo, x);
      hi = std::max(hi, x);
      max_abs = std::max(max_abs, static_cast<double>(std::fabs(x)));
    }
    spread = std::max(spread, static_cast<double>(hi - lo));
  }
  CHECK(spread > 1e-3);   // the logits depend on the vocabulary entry
  CHECK(max_abs < 1e3);   // sane magnitudes
  auto st2 = model->new_state();
  const int64_t split = n_tokens / 2 + 1;
  model->forward(tokens.data(), split, st2, inc.data());
  for (int64_t t = split; t < n_tokens; ++t) model->forward(tokens.data() + t, 1, st2, inc.data() + t * V);
  double diff = 0;
  for (size_t i = 0; i < full.size(); ++i) diff = std::max(diff, static_cast<double>(std::fabs(full[i] - inc[i])));
  CHECK(diff <= 1e-5 * max_abs);
  fs::remove(path);
}

}  // namespace

TEST_CASE("deepseek_v4 synthetic: the default tiny model runs", "[model][deepseek_v4][synthetic]") {
  ep::testkit::DeepseekV4SyntheticSpec spec;
  run_and_check(spec, 40);
}

TEST_CASE("deepseek_v4 synthetic: other expert types, hc_mult and ratios", "[model][deepseek_v4][synthetic]") {
  using ep::format::GgmlType;
  ep::testkit::DeepseekV4SyntheticSpec spec;
  spec.hidden = 256;
  spec.moe_ff = 256;
  spec.n_experts = 5;
  spec.hc_mult = 3;                       // llama.cpp only loads 4; the engine reads any
  spec.compress_ratios = {6, 0, 4, 6, 4}; // HCA ratio 6 (not 0/4/128), hash layer first
  spec.n_hash_layers = 2;
  spec.index_topk = 2;
  spec.sliding_window = 7;
  for (auto [gu, down] : {std::pair{GgmlType::q2_k, GgmlType::q4_k}, std::pair{GgmlType::iq2_xxs, GgmlType::q8_0},
                          std::pair{GgmlType::q3_k, GgmlType::q6_k}}) {
    spec.expert_gate_up = gu;
    spec.expert_down = down;
    spec.dense = GgmlType::q8_0;
    INFO("expert types " << static_cast<int>(gu) << "/" << static_cast<int>(down));
    run_and_check(spec, 31);
  }
}

TEST_CASE("deepseek_v4 synthetic: the file is a function of the seed", "[model][deepseek_v4][synthetic]") {
  ep::testkit::DeepseekV4SyntheticSpec spec;
  spec.compress_ratios = {0, 4};
  const fs::path a = temp_file("a"), b = temp_file("b"), c = temp_file("c");
  ep::testkit::write_deepseek_v4_synthetic_gguf(spec, a.string());
  ep::testkit::write_deepseek_v4_synthetic_gguf(spec, b.string());
  spec.seed = 2;
  ep::testkit::write_deepseek_v4_synthetic_gguf(spec, c.string());
  const std::string sa = slurp(a), sb = slurp(b), sc = slurp(c);
  CHECK(!sa.empty());
  CHECK(sa == sb);
  CHECK(sa.size() == sc.size());
  CHECK(sa != sc);
  for (const auto &p : {a, b, c}) fs::remove(p);
}

TEST_CASE("deepseek_v4 synthetic: Flash-shaped spec has the real dimensions", "[model][deepseek_v4][synthetic]") {
  const auto s = ep::testkit::DeepseekV4SyntheticSpec::flash_shaped(4);
  CHECK(s.hidden == 4096);
  CHECK(s.n_experts == 256);
  CHECK(s.head_dim == 512);
  CHECK(s.compress_ratios == std::vector<int32_t>{0, 0, 4, 128});
}

TEST_CASE("deepseek_v4 synthetic: a batched pass equals each sequence alone, bit for bit on the CPU",
          "[model][deepseek_v4][synthetic][batch]") {
  // Three sequences stepped together: prompts of 5, 23 and 1 tokens, then one token per pass.
  // Their positions cross the sliding window (16), close compressor windows (ratios 4 and 16) and
  // pass the indexer's threshold (ratio 4, top 4: from position 19) at different passes, so one
  // pass holds sequences that need the indexer beside ones that do not.
  ep::testkit::DeepseekV4SyntheticSpec spec;
  const fs::path path = temp_file("batch");
  ep::testkit::write_deepseek_v4_synthetic_gguf(spec, path.string());
  ep::backend::CpuBackend cpu;
  auto model = ep::model::DeepseekV4Model::open(path.string(), cpu);
  const int64_t V = model->config().vocab;
  const std::vector<int64_t> first = {5, 23, 1};
  constexpr int kPasses = 20;
  std::vector<std::vector<int32_t>> tokens(first.size());
  for (size_t s = 0; s < first.size(); ++s)
    for (int64_t t = 0; t < first[s] + kPasses - 1; ++t)
      tokens[s].push_back(static_cast<int32_t>((t * 37 + 11 + static_cast<int64_t>(s) * 101) % V));
  ep::test::check_batched_equals_alone(*model, tokens, first, kPasses);
  fs::remove(path);
}
