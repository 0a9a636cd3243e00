// Kimi-Linear on the CPU backend against the transformers oracle (tests/oracle/kimi_linear.py):
// teacher-forced logits of two tiny seeded models (KDA + MLA layers, dense + MoE FFNs, with and
// without a low-rank query and the shared un-rotated key dims), prefill + decode and chunked
// prefill equal full recompute, the Kimi ops against direct formulas, and fail-closed loading.
// The goldens live in tests/data/kimi_linear and are required.
#include "support/catch.hpp"

#include "backend/cpu_backend.hpp"
#include "core/error.hpp"
#include "format/gguf.hpp"
#include "model/kimi_linear.hpp"
#include "model/kimi_ops.hpp"
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

namespace fs = std::filesystem;
using nlohmann::json;
using ep::model::KimiLinearModel;
using ep::model::KimiLinearState;

const char *const kConfigs[] = {"kimi_a", "kimi_b"};

std::string slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Golden {
  json meta;
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // [S][V]
  int64_t n_tokens = 0, vocab = 0;
  std::string gguf;
};

Golden load_golden(const std::string &name, const std::string &dir = "kimi_linear") {
  Golden g;
  const std::string base = std::string(EP_TEST_DATA_DIR) + "/" + dir + "/" + name;
  INFO("golden files " << base << ".{json,logits.f32,gguf} must exist (tests/oracle/kimi_linear.py / kimi_k3_ref.py write them)");
  REQUIRE(fs::exists(base + ".json"));
  REQUIRE(fs::exists(base + ".logits.f32"));
  REQUIRE(fs::exists(base + ".gguf"));
  g.meta = json::parse(slurp(base + ".json"));
  for (const auto &t : g.meta.at("tokens")) g.tokens.push_back(t.get<int32_t>());
  g.n_tokens = g.meta.at("logits_shape")[0].get<int64_t>();
  g.vocab = g.meta.at("logits_shape")[1].get<int64_t>();
  REQUIRE(static_cast<int64_t>(g.tokens.size()) == g.n_tokens);
  const std::string raw = slurp(base + ".logits.f32");
  REQUIRE(raw.size() == static_cast<size_t>(g.n_tokens * g.vocab * 4));
  g.logits.resize(static_cast<size_t>(g.n_tokens * g.vocab));
  std::memcpy(g.logits.data(), raw.data(), raw.size());
  g.gguf = base + ".gguf";
  return g;
}

struct Diff {
  double max_abs_diff = 0, max_abs_ref = 0;
  double rel() const { return max_abs_diff / max_abs_ref; }
};

Diff compare(const float *got, const float *ref, size_t n) {
  Diff d;
  for (size_t i = 0; i < n; ++i) {
    REQUIRE(std::isfinite(got[i]));
    d.max_abs_diff = std::max(d.max_abs_diff, std::fabs(static_cast<double>(got[i]) - ref[i]));
    d.max_abs_ref = std::max(d.max_abs_ref, std::fabs(static_cast<double>(ref[i])));
  }
  return d;
}

std::vector<float> run_full(KimiLinearModel &m, const std::vector<int32_t> &tokens) {
  KimiLinearState st = m.new_state();
  std::vector<float> logits(tokens.size() * static_cast<size_t>(m.config().vocab));
  m.forward(tokens.data(), static_cast<int64_t>(tokens.size()), st, logits.data());
  CHECK(st.n_past == static_cast<int64_t>(tokens.size()));
  return logits;
}

}  // namespace

TEST_CASE("kimi_linear: the GGUF config is what the oracle ran", "[model][kimi_linear]") {
  for (const char *name : kConfigs) {
    const Golden g = load_golden(name);
    const json &c = g.meta.at("config");
    const ep::model::KimiLinearConfig cfg = ep::model::KimiLinearConfig::from_gguf(ep::format::GgufSet::open(g.gguf));
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
    auto model = KimiLinearModel::open(g.gguf, cpu);
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
    auto model = KimiLinearModel::open(g.gguf, cpu);
    const int64_t S = g.n_tokens, V = g.vocab;
    const std::vector<float> full = run_full(*model, g.tokens);
    // prefill S-8, then one token at a time
    {
      KimiLinearState st = model->new_state();
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
      KimiLinearState st = model->new_state();
      std::vector<float> got(static_cast<size_t>(S * V));
      const int64_t cuts[] = {0, 1, 4, 11, 40, S};
      KimiLinearState fork;
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

TEST_CASE("kimi_linear: ops against direct formulas", "[model][kimi_linear]") {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  SECTION("short conv: split runs equal one run; left zero padding") {
    const int64_t C = 5, K = 4, n = 9;
    std::vector<float> x(static_cast<size_t>(n * C)), w(static_cast<size_t>(C * K));
    for (float &v : x) v = nd(rng);
    for (float &v : w) v = nd(rng);
    std::vector<float> st1(static_cast<size_t>((K - 1) * C), 0.0f), st2 = st1, y1(x.size()), y2(x.size());
    ep::model::kimi::short_conv_silu(x.data(), n, C, w.data(), K, st1.data(), y1.data());
    ep::model::kimi::short_conv_silu(x.data(), 2, C, w.data(), K, st2.data(), y2.data());
    ep::model::kimi::short_conv_silu(x.data() + 2 * C, n - 2, C, w.data(), K, st2.data(), y2.data() + 2 * C);
    for (size_t i = 0; i < y1.size(); ++i) CHECK(y1[i] == y2[i]);
    for (size_t i = 0; i < st1.size(); ++i) CHECK(st1[i] == st2[i]);
    // direct: t = 1, channel 2: w[2][2]·x[0][2] + w[2][3]·x[1][2]
    const float a = w[2 * K + 2] * x[2] + w[2 * K + 3] * x[C + 2];
    CHECK(std::fabs(y1[C + 2] - a / (1.0f + std::exp(-a))) <= 1e-6f);
  }
  SECTION("kda step from a zero state, then decay") {
    const int64_t dk = 3, dv = 2;
    std::vector<float> S(static_cast<size_t>(dk * dv), 0.0f);
    const float q[] = {0.5f, -1.0f, 2.0f}, k[] = {1.0f, 0.5f, -0.25f}, v[] = {2.0f, -3.0f}, g0[] = {-0.1f, -0.2f, -0.3f};
    float o[2];
    ep::model::kimi::kda_step(S.data(), q, k, v, g0, 0.5f, dk, dv, o);
    // S = β k vᵀ; o = Sᵀq = β (k·q) v
    const float kq = 0.5f * 1.0f + (-1.0f) * 0.5f + 2.0f * -0.25f;
    CHECK(std::fabs(o[0] - 0.5f * kq * 2.0f) <= 1e-6f);
    CHECK(std::fabs(o[1] - 0.5f * kq * -3.0f) <= 1e-6f);
    // second step with k = e0, β = 1: S_0 ← e^g0 S_0, then row 0 replaced by v (delta rule)
    const float e0[] = {1.0f, 0.0f, 0.0f}, v2[] = {7.0f, 8.0f}, qe0[] = {1.0f, 0.0f, 0.0f};
    std::vector<float> expect = S;
    for (int64_t i = 0; i < dk; ++i)
      for (int64_t j = 0; j < dv; ++j) expect[static_cast<size_t>(i * dv + j)] *= std::exp(g0[i]);
    expect[0] = 7.0f;
    expect[1] = 8.0f;
    ep::model::kimi::kda_step(S.data(), qe0, e0, v2, g0, 1.0f, dk, dv, o);
    for (size_t i = 0; i < S.size(); ++i) CHECK(std::fabs(S[i] - expect[i]) <= 1e-5f);
    CHECK(std::fabs(o[0] - 7.0f) <= 1e-5f);
    CHECK(std::fabs(o[1] - 8.0f) <= 1e-5f);
  }
  SECTION("l2 norm, softplus, gated norm") {
    float x[] = {3.0f, 4.0f};
    ep::model::kimi::l2_normalize(x, 2, 0.0f);
    CHECK(std::fabs(x[0] - 0.6f) <= 1e-6f);
    CHECK(std::fabs(x[1] - 0.8f) <= 1e-6f);
    CHECK(ep::model::kimi::softplus20(25.0f) == 25.0f);
    CHECK(std::fabs(ep::model::kimi::softplus20(0.0f) - std::log(2.0f)) <= 1e-7f);
    const float xs[] = {1.0f, -1.0f}, w[] = {2.0f, 3.0f}, gate[] = {0.0f, 100.0f};
    float y[2];
    ep::model::kimi::gated_rms_norm(xs, w, gate, 2, 0.0f, y);
    CHECK(std::fabs(y[0] - 1.0f) <= 1e-6f);   // 2 · 1 · σ(0)
    CHECK(std::fabs(y[1] + 3.0f) <= 1e-6f);   // 3 · −1 · σ(100)
  }
  SECTION("causal attention: the first query sees only the first key") {
    const float q[] = {1.0f, 0.0f, 0.0f, 1.0f}, keys[] = {1.0f, 0.0f, 0.0f, 1.0f}, values[] = {5.0f, -2.0f};
    float out[2];
    ep::model::kimi::causal_attention(q, 2, 0, 1, 2, 1, keys, values, 1.0f, out);
    CHECK(out[0] == 5.0f);
    const float p1 = 1.0f / (1.0f + std::exp(1.0f));  // softmax([0, 1])[0]
    CHECK(std::fabs(out[1] - (p1 * 5.0f + (1.0f - p1) * -2.0f)) <= 1e-6f);
  }
}

TEST_CASE("kimi_linear: loading is fail-closed", "[model][kimi_linear]") {
  ep::backend::CpuBackend cpu;
  const Golden a = load_golden("kimi_a");
  const Golden b = load_golden("kimi_b");
  // another model's tensors: every mismatch is reported, nothing runs
  {
    ep::model::WeightCatalog cat = ep::model::WeightCatalog::from_gguf(b.gguf);
    const ep::model::KimiLinearConfig ca = ep::model::KimiLinearConfig::from_gguf(ep::format::GgufSet::open(a.gguf));
    try {
      KimiLinearModel m(ca, cat, cpu);
      FAIL("loading kimi_b's tensors with kimi_a's config succeeded");
    } catch (const ep::Error &e) {
      CHECK((e.status() == ep::Status::format || e.status() == ep::Status::shape));
    }
  }
  // impossible configs are refused
  {
    ep::model::KimiLinearConfig c = ep::model::KimiLinearConfig::from_gguf(ep::format::GgufSet::open(a.gguf));
    c.n_experts_used = c.n_experts + 1;
    CHECK_THROWS_AS(c.validate("test"), ep::Error);
    c = ep::model::KimiLinearConfig::from_gguf(ep::format::GgufSet::open(a.gguf));
    c.kda_gate_lower_bound = 5.0f;
    CHECK_THROWS_AS(c.validate("test"), ep::Error);
  }
  // a K3 file's tensors under a Kimi-Linear config (K3 flags off): the extra tensors are reported
  {
    const Golden k3 = load_golden("k3_a", "kimi_k3");
    ep::model::WeightCatalog cat = ep::model::WeightCatalog::from_gguf(k3.gguf);
    ep::model::KimiLinearConfig c = ep::model::KimiLinearConfig::from_gguf(ep::format::GgufSet::open(k3.gguf));
    c.attn_res_block_size = 0;
    c.mla_output_gate = false;
    try {
      KimiLinearModel m(c, cat, cpu);
      FAIL("a K3 file loaded without its AttnRes / MLA gate tensors being used");
    } catch (const ep::Error &e) {
      CHECK(e.status() == ep::Status::format);
      CHECK(std::string(e.what()).find("attn_res_score") != std::string::npos);
    }
  }
  // a state of another model is refused
  {
    auto ma = KimiLinearModel::open(a.gguf, cpu);
    auto mb = KimiLinearModel::open(b.gguf, cpu);
    KimiLinearState st = mb->new_state();
    const int32_t tok = 1;
    CHECK_THROWS_AS(ma->forward(&tok, 1, st, nullptr), ep::Error);
  }
}

TEST_CASE("kimi_k3: the reference's config, logits, decode", "[model][kimi_k3]") {
  ep::backend::CpuBackend cpu;
  const Golden g = load_golden("k3_a", "kimi_k3");
  const json &c = g.meta.at("config");
  const ep::model::KimiLinearConfig cfg = ep::model::KimiLinearConfig::from_gguf(ep::format::GgufSet::open(g.gguf));
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
  auto model = KimiLinearModel::open(g.gguf, cpu);
  const std::vector<float> full = run_full(*model, g.tokens);
  const Diff d = compare(full.data(), g.logits.data(), full.size());
  std::printf("kimi_k3 k3_a GGUF vs kimi_k3_ref.py: max|dlogit| %.3g, max|logit| %.4g, ratio %.3g (limit 1e-4)\n", d.max_abs_diff,
              d.max_abs_ref, d.rel());
  CHECK(d.max_abs_ref > 1.0);
  CHECK(d.rel() <= 1e-4);
  // prefill + decode and uneven chunks equal the full pass
  const int64_t S = g.n_tokens, V = g.vocab;
  KimiLinearState st = model->new_state();
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
  const ep::model::KimiLinearConfig base = ep::model::KimiLinearConfig::from_gguf(ep::format::GgufSet::open(g.gguf));
  struct Variant {
    const char *what;
    void (*edit)(ep::model::KimiLinearConfig &);
  };
  const Variant variants[] = {
      {"SiLU instead of SiTU", [](ep::model::KimiLinearConfig &c) { c.situ = false; }},
      {"SiTU up branch untransformed", [](ep::model::KimiLinearConfig &c) { c.situ_linear_beta = 0.0f; }},
      {"softplus decay instead of the lower-bounded one", [](ep::model::KimiLinearConfig &c) { c.kda_gate_lower_bound = 0.0f; }},
      {"AttnRes block 3 instead of 2", [](ep::model::KimiLinearConfig &c) { c.attn_res_block_size = 3; }},
  };
  for (const Variant &v : variants) {
    ep::model::KimiLinearConfig c = base;
    v.edit(c);
    ep::model::WeightCatalog cat = ep::model::WeightCatalog::from_gguf(g.gguf);
    KimiLinearModel m(c, cat, cpu);
    const std::vector<float> got = run_full(m, g.tokens);
    const Diff d = compare(got.data(), g.logits.data(), got.size());
    std::printf("kimi_k3 variant '%s': ratio %.3g\n", v.what, d.rel());
    INFO(v.what);
    CHECK(d.rel() > 1e-2);
  }
}
