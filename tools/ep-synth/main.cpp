// ep-synth: writes a seeded synthetic GGUF with real model shapes, DeepSeek-V4 (llama.cpp
// `deepseek4` names, keys, shapes and quant types) or Kimi-K3 (`kimi-k3`), with any layer count,
// streaming to disk, and reports the routing distribution its router produces (per-layer
// expert-frequency entropy and top-10% share).
//
//   ep-synth --out model.gguf [--preset flash|flash-ds4|tiny|small|k3|kimi-tiny] [--layers N | --disk-budget SIZE]
//            [--layout generic|ds4] [--experts mxfp4|iq2_xxs|q2_K|q4_K] [--down-experts TYPE] [--seed N] [--zipf S]
//            [--shards N] [--route-samples N] [--no-write] [--json FILE] [--release-dir DIR [--release-shards N]]
#include "backend/dequant.hpp"
#include "core/error.hpp"
#include "format/ggml_type.hpp"
#include "format/gguf.hpp"
#include "testkit/chat_vocab.hpp"
#include "testkit/deepseek_v4_gguf.hpp"
#include "testkit/kimi_gguf.hpp"
#include "testkit/official_checkpoint.hpp"
#include "testkit/store_pack.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using ep::testkit::DeepseekV4SyntheticSpec;
using ep::testkit::KimiSyntheticSpec;

constexpr const char *kUsage =
    "usage: ep-synth --out PATH [options]\n"
    "  --preset P             flash: DeepSeek-V4-Flash dimensions (hidden 4096, 256 experts x 2048, top-6,\n"
    "                         vocab 129280, q8_0 dense); flash-ds4: the same in the ds4 layout with iq2_xxs\n"
    "                         gate/up and q2_K down experts (a file antirez/ds4 loads, built for that layer\n"
    "                         count); tiny: a small runnable DeepSeek-V4 for tests;\n"
    "                         small: the smallest runnable DeepSeek-V4 with a chat tokenizer (hidden 128,\n"
    "                         8 experts x 64, top-2, vocab 262, f16 dense; K-quant experts make hidden and\n"
    "                         ff 256): the demo's and the bindings tests' model;\n"
    "                         k3: Kimi-K3 dimensions (hidden 7168, 896 latent experts of 3584 x 3072, top-16,\n"
    "                         2 shared, dense layer 0 with ff 33792, KDA layers with MLA every 4th and the\n"
    "                         last, vocab 163840, q8_0 dense); kimi-tiny: a small runnable Kimi-K3 for tests;\n"
    "                         flash-reduced, k3-reduced: their structure (windows, compress ratios, indexer\n"
    "                         top-512, top-k, AttnRes) at hidden 512 and vocab 4096 (tests/oracle/full_width.py).\n"
    "                         Default: flash\n"
    "  --layers N             transformer blocks (default: 4; kimi-tiny 6)\n"
    "  --disk-budget SIZE     instead of --layers: the most layers whose GGUF plus its Expert Pack (a second\n"
    "                         copy of the routed experts) fit in SIZE (e.g. 200G); prints the estimate\n"
    "  --layout L             DeepSeek-V4 dense tensor types: generic (every matrix in the preset's dense type,\n"
    "                         router and small parameters f32; default) or ds4 (what antirez/ds4 validates:\n"
    "                         f16 embedding, hyper-connection, router, compressor and indexer tensors, q8_0\n"
    "                         attention, shared expert and output, plus deepseek4.vocab_size, an empty\n"
    "                         tokenizer.ggml.merges and a ｜DSML｜ token; experts iq2_xxs/q2_K by default,\n"
    "                         iq2_xxs, q2_K or q4_K allowed). Any DeepSeek-V4 preset; flash-ds4 implies it\n"
    "  --experts TYPE         routed expert type (any ggml block type: mxfp4, iq2_xxs, q2_K, q3_K, q4_K, ...);\n"
    "                         default: mxfp4 (DeepSeek-V4), q2_K (Kimi, like the published Q2_K GGUF)\n"
    "  --down-experts TYPE    type of ffn_down_exps (default: --experts; Kimi without --experts: q3_K)\n"
    "  --seed N               default 1\n"
    "  --zipf S               shape expert popularity: per-layer router correction biases\n"
    "                         -S*0.25*ln(1+rank) (DeepSeek-V4: also Zipf(S)-weighted hash tables); 0 = uniform.\n"
    "                         Without --zipf: random biases (the library's default synthetic model)\n"
    "  --shards N             Kimi: write a split set of N files (-0000k-of-0000N.gguf; default 1)\n"
    "  --route-samples N      random hidden states per layer for the routing report (default 512, 0 = off)\n"
    "  --no-write             only print the size estimate (and the layer count on stdout)\n"
    "  --json FILE            write the size, write speed and routing report as JSON\n"
    "  --release-dir DIR      also write the model as its authors release it, from the GGUF's values: DeepSeek-V4\n"
    "                         (MXFP4 experts) as DeepSeek's safetensors (FP8 e4m3 dense with E8M0 block scales,\n"
    "                         FP4 experts with E8M0 scales), Kimi-K3 (MXFP4 experts) as Moonshot's (BF16 dense,\n"
    "                         compressed-tensors FP4 experts); config.json, shards and index in DIR. Its FP4\n"
    "                         experts are the GGUF's bytes re-laid; the dense weights are rounded to FP8 / BF16, so\n"
    "                         its logits differ from the GGUF's. Holds the checkpoint in memory\n"
    "  --release-shards N     shards of --release-dir (default: one per 4 GiB)\n";

struct Args {
  std::map<std::string, std::string> opt;
  bool has(const std::string &k) const { return opt.count(k) != 0; }
  std::string get(const std::string &k, const std::string &d) const { return has(k) ? opt.at(k) : d; }
};

ep::format::GgmlType type_arg(const std::string &name) {
  const auto info = ep::format::ggml_type_by_name(name);
  if (!info || !info->quantized) ep::fail(ep::Status::invalid_argument, "--experts: '{}' is not a ggml block type", name);
  return info->type;
}

DeepseekV4SyntheticSpec tiny_spec(int64_t layers) {
  DeepseekV4SyntheticSpec s;
  s.vocab = 512;
  s.hidden = 256;
  s.n_experts = 32;
  s.n_experts_used = 4;
  s.moe_ff = 256;  // a multiple of 256: K-quant experts work too
  s.n_hash_layers = std::min<int64_t>(1, layers);
  s.chat_tokenizer = true;
  s.compress_ratios.clear();
  for (int64_t il = 0; il < layers; ++il) s.compress_ratios.push_back(il == 0 ? 0 : (il % 2 == 1 ? 4 : 16));
  return s;
}

/// The library's smallest runnable DeepSeek-V4 (the spec's defaults) with the byte-level chat
/// tokenizer; experts of 256-element blocks (K-quants) need rows of 256, so hidden and ff grow.
DeepseekV4SyntheticSpec small_spec(int64_t layers, ep::format::GgmlType experts) {
  DeepseekV4SyntheticSpec s;
  s.vocab = ep::testkit::kSyntheticChatVocabMin;
  s.chat_tokenizer = true;
  s.n_hash_layers = std::min<int64_t>(1, layers);
  s.compress_ratios.clear();
  for (int64_t il = 0; il < layers; ++il) s.compress_ratios.push_back(il == 0 ? 0 : (il % 2 == 1 ? 4 : 16));
  if (ep::format::require_ggml_type(static_cast<uint32_t>(experts), "ep-synth").block_elems == 256) s.hidden = s.moe_ff = 256;
  return s;
}

uint64_t type_bytes(ep::format::GgmlType t, uint64_t elems) {
  const auto info = ep::format::require_ggml_type(static_cast<uint32_t>(t), "ep-synth");
  return elems / info.block_elems * info.block_bytes;
}

/// Routed expert bytes of one layer (gate + up + down of every expert).
uint64_t expert_layer_bytes(const DeepseekV4SyntheticSpec &s) {
  const auto D = static_cast<uint64_t>(s.hidden), F = static_cast<uint64_t>(s.moe_ff), E = static_cast<uint64_t>(s.n_experts);
  return E * (2 * type_bytes(s.expert_gate_up, D * F) + type_bytes(s.expert_down, F * D));
}

/// Rough dense bytes of one layer (q8_0-sized attention, hyper-connection and shared expert matrices).
uint64_t dense_layer_bytes(const DeepseekV4SyntheticSpec &s) {
  const double D = static_cast<double>(s.hidden), H = static_cast<double>(s.n_heads), hd = static_cast<double>(s.head_dim),
               R = static_cast<double>(s.q_lora_rank), G = static_cast<double>(s.o_groups), O = static_cast<double>(s.o_lora_rank),
               F = static_cast<double>(s.moe_ff), hc = static_cast<double>(s.hc_mult), IH = static_cast<double>(s.index_n_heads),
               I = static_cast<double>(s.index_head_dim);
  const double elems = 2 * hc * D * (2 + hc) * hc + D * R + R * H * hd + D * hd + H * hd * O + G * O * D + 4 * D * hd +
                       R * IH * I + 4 * D * I + 3 * D * F + D * static_cast<double>(s.n_experts) * 4.0 / 1.0625;
  return static_cast<uint64_t>(elems * 1.0625);
}

uint64_t estimate_file_bytes(const DeepseekV4SyntheticSpec &s) {
  const auto layers = static_cast<uint64_t>(s.compress_ratios.size());
  const double vd = static_cast<double>(s.vocab) * static_cast<double>(s.hidden);
  const bool ds4 = s.layout == ep::testkit::DeepseekV4SyntheticLayout::ds4;  // f16 embedding, q8_0 head
  const double dense_factor = s.dense == ep::format::GgmlType::f16 && !ds4 ? 2.0 : 1.0625;
  const uint64_t embed = static_cast<uint64_t>(vd * (ds4 ? 2.0 : dense_factor) + vd * dense_factor);
  return embed + layers * (expert_layer_bytes(s) + dense_layer_bytes(s));
}

struct LayerRouting {
  int64_t layer = 0;
  bool hash = false;
  double entropy_norm = 0;  ///< H(freq) / log(E): 1 = uniform
  double top10_share = 0;   ///< share of picks that go to the most popular 10% of experts
};

LayerRouting summarize(int64_t layer, bool hash, const std::vector<double> &count) {
  LayerRouting r;
  r.layer = layer;
  r.hash = hash;
  double total = 0;
  for (double c : count) total += c;
  if (total <= 0) return r;
  double h = 0;
  for (double c : count)
    if (c > 0) h -= c / total * std::log(c / total);
  r.entropy_norm = h / std::log(static_cast<double>(count.size()));
  std::vector<double> sorted = count;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  const size_t top = std::max<size_t>(1, (count.size() + 9) / 10);
  double s = 0;
  for (size_t i = 0; i < top; ++i) s += sorted[i];
  r.top10_share = s / total;
  return r;
}

/// @p n values of an f32 or f16 tensor, as f32.
std::vector<float> read_f32(const ep::format::GgufSet &f, const std::string &name, size_t n) {
  const auto t = f.find_tensor(name);
  const bool f16 = t && t->info->type == ep::format::GgmlType::f16;
  if (!t || t->info->nbytes != n * (f16 ? 2 : 4))
    ep::fail(ep::Status::format, "{}: tensor {} missing or not {} f32 / f16 values", f.first().path(), name, n);
  std::vector<float> v(n);
  if (f16) {
    std::vector<uint16_t> h(n);
    t->file->source().read(t->info->file_offset, h.data(), n * 2);
    ep::backend::dequantize_row(ep::format::GgmlType::f16, h.data(), v.data(), static_cast<int64_t>(n));
  } else {
    t->file->source().read(t->info->file_offset, v.data(), n * 4);
  }
  return v;
}

/// What the routing report needs of a model's router.
struct RouterShape {
  int64_t n_layers = 0;
  int64_t first_moe = 0;  ///< dense layers before it are skipped
  int64_t n_hash = 0;     ///< DeepSeek-V4: hash-routed layers (tid2eid tables) from first_moe on
  size_t D = 0, E = 0, K = 0, V = 0;
  uint64_t seed = 1;
  bool sigmoid = false;   ///< Kimi: sigmoid(x·w) + bias; DeepSeek-V4: sqrt(softplus(x·w)) + bias
};

/// The routing distribution of the written file: hash layers count their whole tid2eid table
/// (every token once); the other MoE layers route @p samples random RMS-normalised hidden states
/// through the file's router (score + correction bias, top-k) — the model's selection rule on
/// inputs without structure.
std::vector<LayerRouting> routing_report(const std::string &path, const RouterShape &s, uint32_t samples) {
  const auto f = ep::format::GgufSet::open(path);
  const size_t D = s.D, E = s.E, K = s.K, V = s.V;
  std::vector<LayerRouting> out;
  std::mt19937_64 rng(s.seed * 7919 + 17);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  for (int64_t il = s.first_moe; il < s.n_layers; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    std::vector<double> count(E, 0.0);
    const bool hash = il < s.first_moe + s.n_hash;
    if (hash) {
      const auto t = f.find_tensor(b + "ffn_gate_tid2eid.weight");
      if (!t) ep::fail(ep::Status::format, "{}: no {}ffn_gate_tid2eid.weight", path, b);
      std::vector<int32_t> ids(K * V);
      t->file->source().read(t->info->file_offset, ids.data(), ids.size() * 4);
      for (int32_t id : ids)
        if (id >= 0 && static_cast<size_t>(id) < E) count[static_cast<size_t>(id)] += 1;
    } else {
      const auto w = read_f32(f, b + "ffn_gate_inp.weight", D * E);
      const auto bias = read_f32(f, b + "exp_probs_b.bias", E);
      std::vector<float> x(D);
      std::vector<std::pair<float, size_t>> score(E);
      for (uint32_t n = 0; n < samples; ++n) {
        double ss = 0;
        for (auto &v : x) {
          v = gauss(rng);
          ss += static_cast<double>(v) * v;
        }
        const auto inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(D) + 1e-6));
        for (size_t e = 0; e < E; ++e) {
          const float *row = w.data() + e * D;
          float z = 0;
          for (size_t d = 0; d < D; ++d) z += row[d] * x[d];
          z *= inv;
          const float sc = s.sigmoid ? 1.0f / (1.0f + std::exp(-z)) : std::sqrt(z > 20 ? z : std::log1p(std::exp(z)));
          score[e] = {sc + bias[e], e};
        }
        std::partial_sort(score.begin(), score.begin() + static_cast<std::ptrdiff_t>(K), score.end(),
                          [](const auto &a, const auto &c) { return a.first > c.first || (a.first == c.first && a.second < c.second); });
        for (size_t k = 0; k < K; ++k) count[score[k].second] += 1;
      }
    }
    out.push_back(summarize(il, hash, count));
  }
  return out;
}

std::string type_name(ep::format::GgmlType t) {
  return std::string(ep::format::require_ggml_type(static_cast<uint32_t>(t), "").name);
}

/// One synthetic model to write, whichever family.
struct Plan {
  std::string family;          ///< "DeepSeek-V4" or "Kimi-K3"
  int64_t layers = 0;
  uint64_t file_bytes = 0;     ///< estimated GGUF bytes
  uint64_t pack_bytes = 0;     ///< routed expert bytes (the pack's payload)
  int64_t experts = 0, top_k = 0, expert_ff = 0;
  ep::format::GgmlType gate_up{}, down{};
  uint64_t seed = 1;
  double zipf = -1;
  RouterShape router;
  std::function<std::string(const std::string &, const std::function<void(uint64_t, uint64_t)> &)> write;
};

/// The fields both spec types name alike.
template <class Spec>
void set_common(Plan &p, const Spec &s) {
  p.experts = s.n_experts;
  p.top_k = s.n_experts_used;
  p.expert_ff = s.moe_ff;
  p.gate_up = s.expert_gate_up;
  p.down = s.expert_down;
  p.seed = s.seed;
  p.zipf = s.router_zipf;
}

Plan deepseek_v4_plan(const Args &a, const std::string &preset, int64_t layers) {
  const std::string layout = a.get("layout", preset == "flash-ds4" ? "ds4" : "generic");
  if (layout != "generic" && layout != "ds4") ep::fail(ep::Status::invalid_argument, "--layout: generic or ds4, not '{}'", layout);
  if (preset == "flash-ds4" && layout != "ds4") ep::fail(ep::Status::invalid_argument, "--preset flash-ds4 is the ds4 layout");
  const bool ds4 = layout == "ds4";
  // ds4 reads IQ2_XXS / Q2_K / Q4_K routed experts; its published file has IQ2_XXS gate/up, Q2_K down.
  const std::string gate_up_name = a.get("experts", ds4 ? "iq2_xxs" : "mxfp4");
  const std::string down_name = a.get("down-experts", a.has("experts") ? gate_up_name : ds4 ? "q2_K" : "mxfp4");
  const ep::format::GgmlType experts = type_arg(gate_up_name);
  DeepseekV4SyntheticSpec s = preset == "flash" || preset == "flash-ds4" ? DeepseekV4SyntheticSpec::flash_shaped(layers)
                              : preset == "flash-reduced"                 ? DeepseekV4SyntheticSpec::flash_reduced(layers)
                              : preset == "small"                         ? small_spec(layers, experts)
                                                                          : tiny_spec(layers);
  if (preset == "flash" || preset == "flash-ds4" || preset == "flash-reduced") s.chat_tokenizer = true;
  if (ds4) {
    s.layout = ep::testkit::DeepseekV4SyntheticLayout::ds4;
    s.chat_tokenizer = true;
    for (const std::string &t : {gate_up_name, down_name}) {
      const ep::format::GgmlType ty = type_arg(t);
      if (ty != ep::format::GgmlType::iq2_xxs && ty != ep::format::GgmlType::q2_k && ty != ep::format::GgmlType::q4_k)
        ep::fail(ep::Status::invalid_argument, "--layout ds4: ds4 reads routed experts of iq2_xxs, q2_K or q4_K, not '{}'", t);
    }
  }
  s.seed = std::stoull(a.get("seed", "1"));
  s.expert_gate_up = experts;
  s.expert_down = type_arg(down_name);
  if (a.has("zipf")) s.router_zipf = std::stod(a.get("zipf", "0"));
  if (a.has("shards")) ep::fail(ep::Status::invalid_argument, "--shards: only the Kimi presets write split sets");
  Plan p;
  p.family = "DeepSeek-V4";
  p.layers = layers;
  p.file_bytes = estimate_file_bytes(s);
  p.pack_bytes = static_cast<uint64_t>(layers) * expert_layer_bytes(s);
  set_common(p, s);
  p.router = {layers, 0, s.n_hash_layers, static_cast<size_t>(s.hidden), static_cast<size_t>(s.n_experts),
              static_cast<size_t>(s.n_experts_used), static_cast<size_t>(s.vocab), s.seed, false};
  p.write = [s](const std::string &out, const std::function<void(uint64_t, uint64_t)> &progress) {
    ep::testkit::write_deepseek_v4_synthetic_gguf(s, out, progress);
    return out;
  };
  return p;
}

Plan kimi_plan(const Args &a, const std::string &preset, int64_t layers) {
  KimiSyntheticSpec s = preset == "k3"           ? KimiSyntheticSpec::k3_shaped(layers)
                        : preset == "k3-reduced" ? KimiSyntheticSpec::k3_reduced(layers)
                                                 : KimiSyntheticSpec::tiny(layers);
  s.seed = std::stoull(a.get("seed", "1"));
  if (a.has("experts")) {
    s.expert_gate_up = type_arg(a.get("experts", ""));
    s.expert_down = s.expert_gate_up;
  }
  if (a.has("down-experts")) s.expert_down = type_arg(a.get("down-experts", ""));
  if (a.has("zipf")) s.router_zipf = std::stod(a.get("zipf", "0"));
  s.shards = static_cast<uint32_t>(std::stoul(a.get("shards", "1")));
  Plan p;
  p.family = "Kimi-K3";
  p.layers = layers;
  p.file_bytes = ep::testkit::kimi_synthetic_tensor_bytes(s);
  p.pack_bytes = static_cast<uint64_t>(layers - s.n_dense_layers) * ep::testkit::kimi_synthetic_expert_layer_bytes(s);
  set_common(p, s);
  p.router = {layers, s.n_dense_layers, 0, static_cast<size_t>(s.hidden), static_cast<size_t>(s.n_experts),
              static_cast<size_t>(s.n_experts_used), static_cast<size_t>(s.vocab), s.seed, true};
  p.write = [s](const std::string &out, const std::function<void(uint64_t, uint64_t)> &progress) {
    return ep::testkit::write_kimi_synthetic_gguf(s, out, progress);
  };
  return p;
}

int run(const Args &a) {
  const std::string preset = a.get("preset", "flash");
  const bool kimi = preset == "k3" || preset == "k3-reduced" || preset == "kimi-tiny";
  if (!kimi && preset != "flash" && preset != "flash-ds4" && preset != "flash-reduced" && preset != "tiny" && preset != "small")
    ep::fail(ep::Status::invalid_argument,
             "--preset: flash, flash-ds4, flash-reduced, tiny, small, k3, k3-reduced or kimi-tiny, not '{}'", preset);
  if (kimi && a.has("layout")) ep::fail(ep::Status::invalid_argument, "--layout: only the DeepSeek-V4 presets have one");
  if (a.has("zipf") && !(std::stod(a.get("zipf", "0")) >= 0)) ep::fail(ep::Status::invalid_argument, "--zipf must be >= 0");
  auto make = [&](int64_t layers) { return kimi ? kimi_plan(a, preset, layers) : deepseek_v4_plan(a, preset, layers); };
  int64_t layers = std::stoll(a.get("layers", preset == "kimi-tiny" ? "6" : "4"));
  if (a.has("disk-budget")) {
    const uint64_t budget = ep::testkit::parse_size(a.get("disk-budget", "0"));
    layers = 0;
    for (int64_t n = 1; n <= 4096; ++n) {
      const Plan p = make(n);
      if (p.file_bytes + p.pack_bytes > budget) break;
      layers = n;
    }
    if (layers < 1) ep::fail(ep::Status::invalid_argument, "--disk-budget {}: not even one layer (and its pack) fits", a.get("disk-budget", ""));
  }
  if (layers < 1) ep::fail(ep::Status::invalid_argument, "--layers must be >= 1");
  const Plan plan = make(layers);
  std::fprintf(stderr, "ep-synth: %s %s-shaped, %lld layers, %lld experts x %lld (%s/%s), top-%lld, ~%.2f GiB GGUF + ~%.2f GiB pack\n",
               plan.family.c_str(), preset.c_str(), static_cast<long long>(layers), static_cast<long long>(plan.experts),
               static_cast<long long>(plan.expert_ff), type_name(plan.gate_up).c_str(), type_name(plan.down).c_str(),
               static_cast<long long>(plan.top_k), static_cast<double>(plan.file_bytes) / (1ull << 30),
               static_cast<double>(plan.pack_bytes) / (1ull << 30));
  if (a.has("release-dir") && (plan.gate_up != ep::format::GgmlType::mxfp4 || plan.down != ep::format::GgmlType::mxfp4))
    ep::fail(ep::Status::invalid_argument, "--release-dir: the releases store FP4 experts, so the GGUF needs MXFP4 ones "
             "(--experts mxfp4), not {}/{}", type_name(plan.gate_up), type_name(plan.down));
  if (a.has("no-write")) {
    std::printf("%lld\n", static_cast<long long>(layers));
    return 0;
  }
  if (!a.has("out")) ep::fail(ep::Status::invalid_argument, "--out PATH is required");
  const std::string out = a.get("out", "");

  const auto t0 = Clock::now();
  auto last = t0;
  uint64_t total_bytes = 0;
  const std::string first = plan.write(out, [&](uint64_t done, uint64_t total) {
    total_bytes = total;
    const auto now = Clock::now();
    if (now - last < std::chrono::seconds(2) && done < total) return;
    last = now;
    const double s = std::chrono::duration<double>(now - t0).count();
    std::fprintf(stderr, "ep-synth: %.2f / %.2f GiB (%.0f%%), %.0f MB/s\n", static_cast<double>(done) / (1ull << 30),
                 static_cast<double>(total) / (1ull << 30), total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0,
                 s > 0 ? static_cast<double>(done) / s / 1e6 : 0.0);
  });
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const double mbps = secs > 0 ? static_cast<double>(total_bytes) / secs / 1e6 : 0;
  std::printf("wrote %s: %.3f GiB in %.1f s, %.0f MB/s (including fsync-free page-cache writeback)\n", first.c_str(),
              static_cast<double>(total_bytes) / (1ull << 30), secs, mbps);

  nlohmann::ordered_json j;
  j["path"] = first;
  j["family"] = plan.family;
  j["preset"] = preset;
  if (!kimi) j["layout"] = a.get("layout", preset == "flash-ds4" ? "ds4" : "generic");
  j["layers"] = layers;
  j["experts"] = plan.experts;
  j["experts_per_token"] = plan.top_k;
  j["expert_type"] = type_name(plan.gate_up);
  j["expert_down_type"] = type_name(plan.down);
  j["seed"] = plan.seed;
  if (plan.zipf >= 0) j["zipf"] = plan.zipf;
  else j["zipf"] = nullptr;
  j["file_bytes"] = total_bytes;
  j["expert_bytes"] = plan.pack_bytes;
  j["write_seconds"] = secs;
  j["write_mbps"] = mbps;

  const auto samples = static_cast<uint32_t>(std::stoul(a.get("route-samples", "512")));
  if (samples > 0 && plan.router.first_moe < layers) {
    const auto rep = routing_report(first, plan.router, samples);
    double he = 0, ht = 0;
    std::printf("routing (hash layers: whole tid2eid table; others: %u random hidden states through the router)\n", samples);
    std::printf("layer  kind    entropy/max  top-10%% share\n");
    auto arr = nlohmann::ordered_json::array();
    for (const auto &r : rep) {
      std::printf("%5lld  %-6s  %11.4f  %13.4f\n", static_cast<long long>(r.layer), r.hash ? "hash" : "router", r.entropy_norm, r.top10_share);
      he += r.entropy_norm;
      ht += r.top10_share;
      arr.push_back({{"layer", r.layer}, {"kind", r.hash ? "hash" : "router"}, {"entropy_norm", r.entropy_norm}, {"top10_share", r.top10_share}});
    }
    const auto n = static_cast<double>(rep.size());
    std::printf("mean   all     %11.4f  %13.4f   (uniform: 1.0000 and %.4f)\n", he / n, ht / n,
                static_cast<double>(std::max<int64_t>(1, (plan.experts + 9) / 10)) / static_cast<double>(plan.experts));
    j["route_samples"] = samples;
    j["routing"] = arr;
    j["mean_entropy_norm"] = he / n;
    j["mean_top10_share"] = ht / n;
  }
  if (a.has("release-dir")) {
    const std::string dir = a.get("release-dir", "");
    ep::testkit::OfficialCheckpointOptions opt;
    opt.shards = a.has("release-shards") ? static_cast<uint32_t>(std::stoul(a.get("release-shards", "1")))
                                         : static_cast<uint32_t>(std::max<uint64_t>(1, total_bytes / (4ull << 30)));
    opt.seed = plan.seed;
    const auto r0 = Clock::now();
    if (kimi) ep::testkit::write_kimi_checkpoint(first, ep::testkit::KimiCheckpointLayout::k3_official, dir, "", opt);
    else ep::testkit::write_deepseek_v4_official(first, dir, "", opt);
    std::printf("wrote %s: the release layout in %u shard(s), %.1f s\n", dir.c_str(), opt.shards,
                std::chrono::duration<double>(Clock::now() - r0).count());
    j["release_dir"] = dir;
    j["release_shards"] = opt.shards;
  }
  if (a.has("json")) {
    std::ofstream f(a.get("json", ""));
    if (!f) ep::fail(ep::Status::io, "cannot write {}", a.get("json", ""));
    f << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s == "--help" || s == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (s.rfind("--", 0) != 0) {
      std::fprintf(stderr, "ep-synth: unexpected argument '%s'\n%s", s.c_str(), kUsage);
      return 2;
    }
    s = s.substr(2);
    if (s == "no-write") {
      a.opt[s] = "1";
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "ep-synth: --%s needs a value\n", s.c_str());
      return 2;
    }
    a.opt[s] = argv[++i];
  }
  try {
    return run(a);
  } catch (const ep::Error &e) {
    std::fprintf(stderr, "ep-synth: %s: %s\n", ep::status_name(e.status()), e.what());
    return 1;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "ep-synth: %s\n", e.what());
    return 1;
  }
}
