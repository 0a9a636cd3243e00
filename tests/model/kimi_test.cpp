// Kimi-Linear on the CPU backend against the transformers oracle (tests/oracle/kimi_linear.py):
// teacher-forced logits of two tiny seeded models (KDA + MLA layers, dense + MoE FFNs, with and
// without a low-rank query and the shared un-rotated key dims), prefill + decode and chunked
// prefill equal full recompute, and fail-closed loading (the Kimi ops: tests/backend/kimi_ops_test.cpp).
// The goldens live in tests/data/kimi_linear and are required.
#include "support/catch.hpp"

#include "backend/cpu_backend.hpp"
#include "core/error.hpp"
#include "format/gguf.hpp"
#include "model/kimi.hpp"
#include "support/batched_forward.hpp"
#include "support/kimi_golden.hpp"
#include "model/weight_catalog.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace kimitest;
using ep::model::KimiModel;
using ep::model::KimiState;

const char *const kConfigs[] = {"kimi_a", "kimi_b"};

}  // namespace

TEST_CASE("kimi_linear: the GGUF config is what the oracle ran", "[model][kimi_linear]") {
  for (const char *name : kConfigs) {
    const Golden g = load_golden(name);
    const json &c = g.meta.at("config");
    const ep::model::KimiConfig cfg = ep::model::KimiConfig::from_gguf(ep::format::GgufSet::open(g.gguf));
    INFO(name << ": " << cfg.summary());
    CHECK(cfg.vocab == c.at("vocab").get<int64_t>());
    CHECK(cfg.hidden == c.at("hidden").get<int64_t>());
    CHECK(cfg.n_layers == c.at("layers").get<int64_t>());
    CHECK(cfg.n_heads == c.at("heads").get<int64_t>());
    CHECK(cfg.q_lora_rank == (c.at("q_lora").is_null() ? 0 : c.at("q_lora").get<int64_t>()));
    CHECK(cfg.kv_lora_rank == c.at("kv_lora").get<int64_t>());
    CHECK(cfg.qk_nope_dim == c.at("qk_nope").get<int64_t>());
    CHECK(cfg.qk_rope_dim == c.at("qk_rope").get<int64_t>());
    CHECK(cfg.v_head_dim == c.at("v_head").get<int64_t>());
    CHECK(cfg.kda_heads == c.at("kda_heads").get<int64_t>());
    CHECK(cfg.kda_head_dim == c.at("kda_head_dim").get<int64_t>());
    CHECK(cfg.conv_kernel == c.at("conv").get<int64_t>());
    CHECK(cfg.n_dense_layers == c.at("n_dense").get<int64_t>());
    CHECK(cfg.n_experts == c.at("experts").get<int64_t>());
    CHECK(cfg.n_experts_used == c.at("top_k").get<int64_t>());
    CHECK(cfg.n_shared_experts == c.at("n_shared").get<int64_t>());
    CHECK(cfg.norm_topk == c.at("norm_topk").get<bool>());
    CHECK(cfg.routed_scale == c.at("routed_scale").get<float>());
    CHECK(cfg.rms_eps == c.at("rms_eps").get<float>());
    for (int64_t il = 0; il < cfg.n_layers; ++il) {
      const bool mla = c.at("layer_types")[static_cast<size_t>(il)].get<std::string>() == "full_attention";
      CHECK((cfg.mixer[static_cast<size_t>(il)] == ep::model::KimiMixer::mla) == mla);
    }
    // and what transformers saved as its config.json
    const json &hf = g.meta.at("hf_config_json");
    CHECK(hf.at("model_type").get<std::string>() == "kimi_linear");
    CHECK(hf.at("linear_num_heads").get<int64_t>() == cfg.kda_heads);
    CHECK(hf.at("linear_conv_kernel_dim").get<int64_t>() == cfg.conv_kernel);
    CHECK(hf.at("moe_renormalize").get<bool>() == cfg.norm_topk);
  }
}

TEST_CASE("kimi_linear: GGUF logits match transformers", "[model][kimi_linear]") {
  ep::backend::CpuBackend cpu;
  for (const char *name : kConfigs) {
    const Golden g = load_golden(name);
    auto model = KimiModel::open(g.gguf, cpu);
    const std::vector<float> got = run_full(*model, g.tokens);
    REQUIRE(got.size() == g.logits.size());
    const Diff d = compare(got.data(), g.logits.data(), got.size());
    std::printf("kimi_linear %s GGUF: max|dlogit| %.3g, max|logit| %.4g, ratio %.3g (limit 1e-4)\n", name, d.max_abs_diff,
                d.max_abs_ref, d.rel());
    INFO(name << ": max |dlogit| " << d.max_abs_diff << " of max |logit| " << d.max_abs_ref);
    CHECK(d.max_abs_ref > 1.0);  // the golden is not degenerate
    CHECK(d.rel() <= 1e-4);
  }
}

TEST_CASE("kimi_linear: prefill + decode and chunked prefill equal full recompute", "[model][kimi_linear]") {
  ep::backend::CpuBackend cpu;
  for (const char *name : kConfigs) {
    const Golden g = load_golden(name);
    auto model = KimiModel::open(g.gguf, cpu);
    const int64_t S = g.n_tokens, V = g.vocab;
    const std::vector<float> full = run_full(*model, g.tokens);
    // prefill S-8, then one token at a time
    {
      KimiState st = model->new_state();
      std::vector<float> got(static_cast<size_t>(S * V));
      const int64_t P = S - 8;
      model->forward(g.tokens.data(), P, st, got.data());
      for (int64_t t = P; t < S; ++t) model->forward(g.tokens.data() + t, 1, st, got.data() + t * V);
      CHECK(st.n_past == S);
      const Diff d = compare(got.data(), full.data(), got.size());
      std::printf("kimi_linear %s prefill %lld + decode %d: max|dlogit| vs full %.3g\n", name, static_cast<long long>(P), 8,
                  d.max_abs_diff);
      CHECK(d.max_abs_diff <= 1e-5 * d.max_abs_ref);
      // decode against the golden too
      const Diff dg = compare(got.data() + P * V, g.logits.data() + P * V, static_cast<size_t>(8 * V));
      CHECK(dg.max_abs_diff <= 1e-4 * compare(full.data(), g.logits.data(), full.size()).max_abs_ref);
    }
    // uneven chunks, and a state forked mid-way (copy) that continues differently
    {
      KimiState st = model->new_state();
      std::vector<float> got(static_cast<size_t>(S * V));
      const int64_t cuts[] = {0, 1, 4, 11, 40, S};
      KimiState fork;
      for (size_t i = 0; i + 1 < std::size(cuts); ++i) {
        model->forward(g.tokens.data() + cuts[i], cuts[i + 1] - cuts[i], st, got.data() + cuts[i] * V);
        if (cuts[i + 1] == 11) fork = st;
      }
      const Diff d = compare(got.data(), full.data(), got.size());
      CHECK(d.max_abs_diff <= 1e-5 * d.max_abs_ref);
      // the fork sees a different token at 11, then the original suffix: its logits at 11 must
      // differ from the original ones, proving the state carries the history
      std::vector<int32_t> alt(g.tokens.begin() + 11, g.tokens.end());
      alt[0] = (alt[0] + 1) % static_cast<int32_t>(V);
      std::vector<float> fl(alt.size() * static_cast<size_t>(V));
      model->forward(alt.data(), static_cast<int64_t>(alt.size()), fork, fl.data());
      CHECK(fork.n_past == S);
      const Diff df = compare(fl.data() + (S - 12) * V, full.data() + (S - 1) * V, static_cast<size_t>(V));
      CHECK(df.max_abs_diff > 1e-4);
    }
  }
}

TEST_CASE("kimi_linear: loading is fail-closed", "[model][kimi_linear]") {
  ep::backend::CpuBackend cpu;
  const Golden a = load_golden("kimi_a");
  const Golden b = load_golden("kimi_b");
  // another model's tensors: every mismatch is reported, nothing runs
  {
    ep::model::WeightCatalog cat = ep::model::WeightCatalog::from_gguf(b.gguf);
    const ep::model::KimiConfig ca = ep::model::KimiConfig::from_gguf(ep::format::GgufSet::open(a.gguf));
    try {
      KimiModel m(ca, cat, cpu);
      FAIL("loading kimi_b's tensors with kimi_a's config succeeded");
    } catch (const ep::Error &e) {
      CHECK((e.status() == ep::Status::format || e.status() == ep::Status::shape));
    }
  }
  // impossible configs are refused
  {
    ep::model::KimiConfig c = ep::model::KimiConfig::from_gguf(ep::format::GgufSet::open(a.gguf));
    c.n_experts_used = c.n_experts + 1;
    CHECK_THROWS_AS(c.validate("test"), ep::Error);
    c = ep::model::KimiConfig::from_gguf(ep::format::GgufSet::open(a.gguf));
    c.kda_gate_lower_bound = 5.0f;
    CHECK_THROWS_AS(c.validate("test"), ep::Error);
  }
  // a K3 file's tensors under a Kimi-Linear config (K3 flags off): the extra tensors are reported
  {
    const Golden k3 = load_golden("k3_a", "kimi_k3");
    ep::model::WeightCatalog cat = ep::model::WeightCatalog::from_gguf(k3.gguf);
    ep::model::KimiConfig c = ep::model::KimiConfig::from_gguf(ep::format::GgufSet::open(k3.gguf));
    c.attn_res_block_size = 0;
    c.mla_output_gate = false;
    try {
      KimiModel m(c, cat, cpu);
      FAIL("a K3 file loaded without its AttnRes / MLA gate tensors being used");
    } catch (const ep::Error &e) {
      CHECK(e.status() == ep::Status::format);
      CHECK(std::string(e.what()).find("attn_res_score") != std::string::npos);
    }
  }
  // a state of another model is refused
  {
    auto ma = KimiModel::open(a.gguf, cpu);
    auto mb = KimiModel::open(b.gguf, cpu);
    KimiState st = mb->new_state();
    const int32_t tok = 1;
    CHECK_THROWS_AS(ma->forward(&tok, 1, st, nullptr), ep::Error);
  }
}

TEST_CASE("kimi_k3: the reference's config, logits, decode", "[model][kimi_k3]") {
  ep::backend::CpuBackend cpu;
  const Golden g = load_golden("k3_a", "kimi_k3");
  const json &c = g.meta.at("config");
  const ep::model::KimiConfig cfg = ep::model::KimiConfig::from_gguf(ep::format::GgufSet::open(g.gguf));
  INFO(cfg.summary());
  CHECK(cfg.arch == "kimi-k3");
  CHECK(cfg.situ);
  CHECK(cfg.situ_beta == c.at("situ_beta").get<float>());
  CHECK(cfg.situ_linear_beta == c.at("situ_linear_beta").get<float>());
  CHECK(cfg.attn_res_block_size == c.at("attn_res_block").get<int64_t>());
  CHECK(cfg.expert_latent_dim == c.at("latent").get<int64_t>());
  CHECK(cfg.kda_gate_lower_bound == c.at("gate_lower_bound").get<float>());
  CHECK(cfg.mla_output_gate);
  CHECK(cfg.kda_full_rank_gate);
  CHECK(cfg.n_layers == c.at("layers").get<int64_t>());
  auto model = KimiModel::open(g.gguf, cpu);
  const std::vector<float> full = run_full(*model, g.tokens);
  const Diff d = compare(full.data(), g.logits.data(), full.size());
  std::printf("kimi_k3 k3_a GGUF vs kimi_k3_ref.py: max|dlogit| %.3g, max|logit| %.4g, ratio %.3g (limit 1e-4)\n", d.max_abs_diff,
              d.max_abs_ref, d.rel());
  CHECK(d.max_abs_ref > 1.0);
  CHECK(d.rel() <= 1e-4);
  // prefill + decode and uneven chunks equal the full pass
  const int64_t S = g.n_tokens, V = g.vocab;
  KimiState st = model->new_state();
  std::vector<float> got(static_cast<size_t>(S * V));
  const int64_t cuts[] = {0, 3, 17, S - 5, S - 4, S - 3, S - 2, S - 1, S};
  for (size_t i = 0; i + 1 < std::size(cuts); ++i)
    model->forward(g.tokens.data() + cuts[i], cuts[i + 1] - cuts[i], st, got.data() + cuts[i] * V);
  const Diff dd = compare(got.data(), full.data(), got.size());
  CHECK(dd.max_abs_diff <= 1e-5 * dd.max_abs_ref);
}

TEST_CASE("kimi_k3: every switchable K3 feature changes the logits", "[model][kimi_k3]") {
  // The golden would not catch a feature that is silently ignored: each variant must move the
  // logits well away from the reference.
  ep::backend::CpuBackend cpu;
  const Golden g = load_golden("k3_a", "kimi_k3");
  const ep::model::KimiConfig base = ep::model::KimiConfig::from_gguf(ep::format::GgufSet::open(g.gguf));
  struct Variant {
    const char *what;
    void (*edit)(ep::model::KimiConfig &);
  };
  const Variant variants[] = {
      {"SiLU instead of SiTU", [](ep::model::KimiConfig &c) { c.situ = false; }},
      {"SiTU up branch untransformed", [](ep::model::KimiConfig &c) { c.situ_linear_beta = 0.0f; }},
      {"softplus decay instead of the lower-bounded one", [](ep::model::KimiConfig &c) { c.kda_gate_lower_bound = 0.0f; }},
      {"AttnRes block 3 instead of 2", [](ep::model::KimiConfig &c) { c.attn_res_block_size = 3; }},
  };
  for (const Variant &v : variants) {
    ep::model::KimiConfig c = base;
    v.edit(c);
    ep::model::WeightCatalog cat = ep::model::WeightCatalog::from_gguf(g.gguf);
    KimiModel m(c, cat, cpu);
    const std::vector<float> got = run_full(m, g.tokens);
    const Diff d = compare(got.data(), g.logits.data(), got.size());
    std::printf("kimi_k3 variant '%s': ratio %.3g\n", v.what, d.rel());
    INFO(v.what);
    CHECK(d.rel() > 1e-2);
  }
}

TEST_CASE("kimi: a batched pass equals each sequence alone, bit for bit on the CPU", "[model][kimi_linear][kimi_k3][batch]") {
  // Three sequences stepped together (prompts of 5, 23 and 1 tokens, then one token per pass) on
  // each golden model: KDA and MLA layers; K3's output gate and AttnRes.
  ep::backend::CpuBackend cpu;
  const std::pair<const char *, const char *> models[] = {{"kimi_a", "kimi_linear"}, {"kimi_b", "kimi_linear"}, {"k3_a", "kimi_k3"}};
  for (const auto &[name, dir] : models) {
    INFO(name);
    const Golden g = load_golden(name, dir);
    auto model = KimiModel::open(g.gguf, cpu);
    const std::vector<int64_t> first = {5, 23, 1};
    constexpr int kPasses = 12;
    std::vector<std::vector<int32_t>> tokens(first.size());
    for (size_t s = 0; s < first.size(); ++s)
      for (int64_t t = 0; t < first[s] + kPasses - 1; ++t)
        tokens[s].push_back(g.tokens[static_cast<size_t>((t + 7 * static_cast<int64_t>(s)) % g.n_tokens)]);
    ep::test::check_batched_equals_alone(*model, tokens, first, kPasses);
  }
}
