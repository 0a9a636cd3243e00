// ep-synth's ds4 layout and ep-bench compute, on the CPU: a tiny-width file in the ds4 layout
// carries the tensor types, metadata keys and tokenizer entries antirez/ds4 checks (ds4.c:
// weights_validate_layout, config_validate_model, vocab_load) and runs in our engine; ep-bench
// compute measures it on the CPU backend beside a stand-in ds4-bench (a script that checks its
// arguments and writes ds4-bench's CSV), reports the bytes a decode token touches by the stated
// formula, and fails clearly without a GPU or when the peer fails.
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

#include "expertpack/expertpack.h"
#include "format/gguf.hpp"

#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

using ep::format::GgmlType;
using ep::format::GgufType;

int run(const std::string &cmd) {
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::string slurp(const std::string &path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

nlohmann::json load(const std::string &path) {
  std::ifstream f(path);
  REQUIRE(f.good());
  return nlohmann::json::parse(f);
}

std::string synth_ds4(const ep::test::TempDir &dir, const std::string &name, const std::string &layout = "ds4") {
  const std::string gguf = dir / (name + ".gguf");
  REQUIRE(run(std::string(EP_SYNTH_EXE) + " --preset tiny --layout " + layout + " --layers 4 --route-samples 64 --out '" + gguf +
              "' >/dev/null 2>&1") == 0);
  return gguf;
}

GgmlType type_of(const ep::format::GgufSet &g, const std::string &name) {
  const auto t = g.find_tensor(name);
  INFO(name);
  REQUIRE(t.has_value());
  return t->info->type;
}

/// A stand-in for ds4-bench: checks the arguments ep-bench compute passes (ds4_bench.c's
/// options), logs them, and writes its CSV with fixed rates (or fails with @p fail_status).
std::string fake_ds4_bench(const ep::test::TempDir &dir, int fail_status = 0) {
  const std::string path = dir / (fail_status ? "ds4-bench-failing" : "ds4-bench");
  std::ofstream f(path);
  f << "#!/bin/sh\n"
       "echo \"$@\" >> '" << (dir / "ds4-args.log") << "'\n";
  if (fail_status) f << "echo 'ds4: required tensor is missing: token_embd.weight' >&2\nexit " << fail_status << "\n";
  f << "model= prompt= start= max= gen= csv= backend=\n"
       "while [ $# -gt 0 ]; do\n"
       "  case \"$1\" in\n"
       "    -m) model=$2; shift 2 ;;\n"
       "    --prompt-file) prompt=$2; shift 2 ;;\n"
       "    --ctx-start) start=$2; shift 2 ;;\n"
       "    --ctx-max) max=$2; shift 2 ;;\n"
       "    --gen-tokens) gen=$2; shift 2 ;;\n"
       "    --csv) csv=$2; shift 2 ;;\n"
       "    --cpu|--cuda) backend=$1; shift ;;\n"
       "    *) echo \"unknown option $1\" >&2; exit 2 ;;\n"
       "  esac\n"
       "done\n"
       "[ -f \"$model\" ] && [ -f \"$prompt\" ] && [ \"$backend\" = --cpu ] && [ \"$start\" = \"$max\" ] || exit 2\n"
       "[ \"$(wc -c < \"$prompt\")\" -ge \"$max\" ] || exit 2\n"
       "echo ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes > \"$csv\"\n"
       "echo \"$max,$max,100.00,$gen,50.00,4096\" >> \"$csv\"\n";
  f.close();
  ::chmod(path.c_str(), 0755);
  return path;
}

}  // namespace

TEST_CASE("ep-synth --layout ds4: ds4's tensor types, keys and tokenizer entries, at a tiny width") {
  ep::test::TempDir dir;
  const auto g = ep::format::GgufSet::open(synth_ds4(dir, "ds4"));
  // weights_validate_layout: f16 embedding, hyper-connection, compressor, indexer and router;
  // q8_0 attention, shared expert and output; f32 norms, sinks, hc base / scale; i32 hash tables.
  CHECK(type_of(g, "token_embd.weight") == GgmlType::f16);
  CHECK(type_of(g, "output.weight") == GgmlType::q8_0);
  CHECK(type_of(g, "output_hc_fn.weight") == GgmlType::f16);
  CHECK(type_of(g, "output_hc_base.weight") == GgmlType::f32);
  CHECK(type_of(g, "output_hc_scale.weight") == GgmlType::f32);
  CHECK(type_of(g, "output_norm.weight") == GgmlType::f32);
  for (int il = 0; il < 4; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    for (const char *n : {"hc_attn_fn", "hc_ffn_fn", "ffn_gate_inp"}) CHECK(type_of(g, b + n + ".weight") == GgmlType::f16);
    for (const char *n : {"hc_attn_scale", "hc_attn_base", "hc_ffn_scale", "hc_ffn_base", "attn_norm", "ffn_norm", "attn_q_a_norm",
                          "attn_kv_a_norm", "attn_sinks"})
      CHECK(type_of(g, b + n + ".weight") == GgmlType::f32);
    for (const char *n : {"attn_q_a", "attn_q_b", "attn_kv", "attn_output_a", "attn_output_b", "ffn_gate_shexp", "ffn_up_shexp",
                          "ffn_down_shexp"})
      CHECK(type_of(g, b + n + ".weight") == GgmlType::q8_0);
    CHECK(type_of(g, b + "ffn_gate_exps.weight") == GgmlType::iq2_xxs);
    CHECK(type_of(g, b + "ffn_up_exps.weight") == GgmlType::iq2_xxs);
    CHECK(type_of(g, b + "ffn_down_exps.weight") == GgmlType::q2_k);
    if (il == 0) CHECK(type_of(g, b + "ffn_gate_tid2eid.weight") == GgmlType::i32);
    else CHECK(type_of(g, b + "exp_probs_b.bias") == GgmlType::f32);
    if (g.find_tensor(b + "attn_compressor_kv.weight")) {
      for (const char *n : {"attn_compressor_kv", "attn_compressor_gate", "attn_compressor_ape"})
        CHECK(type_of(g, b + n + ".weight") == GgmlType::f16);
      CHECK(type_of(g, b + "attn_compressor_norm.weight") == GgmlType::f32);
    }
    if (g.find_tensor(b + "indexer.proj.weight")) {
      for (const char *n : {"indexer.proj", "indexer.attn_q_b", "indexer_compressor_kv", "indexer_compressor_gate", "indexer_compressor_ape"})
        CHECK(type_of(g, b + n + ".weight") == GgmlType::f16);
      CHECK(type_of(g, b + "indexer_compressor_norm.weight") == GgmlType::f32);
    }
  }
  // config_validate_model: the keys it requires, with the types it reads them as.
  auto key = [&](const std::string &k) -> const ep::format::GgufValue & {
    const auto *v = g.find(k);
    INFO(k);
    REQUIRE(v != nullptr);
    return *v;
  };
  for (const char *k : {"block_count", "embedding_length", "vocab_size", "attention.head_count", "attention.head_count_kv",
                        "attention.key_length", "attention.value_length", "rope.dimension_count", "attention.q_lora_rank",
                        "attention.output_lora_rank", "attention.output_group_count", "expert_count", "expert_used_count",
                        "expert_feed_forward_length", "expert_shared_count", "hash_layer_count", "attention.sliding_window",
                        "attention.indexer.head_count", "attention.indexer.key_length", "attention.indexer.top_k",
                        "hyper_connection.count", "hyper_connection.sinkhorn_iterations", "rope.scaling.original_context_length"}) {
    INFO(k);
    CHECK(key(std::string("deepseek4.") + k).type == GgufType::u32);
  }
  for (const char *k : {"rope.freq_base", "rope.scaling.factor", "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow",
                        "attention.compress_rope_freq_base", "expert_weights_scale", "attention.layer_norm_rms_epsilon",
                        "hyper_connection.epsilon"}) {
    INFO(k);
    CHECK(key(std::string("deepseek4.") + k).type == GgufType::f32);
  }
  CHECK(key("deepseek4.vocab_size").u == 512);
  CHECK(key("deepseek4.expert_weights_norm").type == GgufType::boolean);
  CHECK(key("deepseek4.attention.compress_ratios").elem_type == GgufType::i32);
  CHECK(key("deepseek4.attention.compress_ratios").array_size() == 4);
  CHECK(key("deepseek4.swiglu_clamp_exp").elem_type == GgufType::f32);
  // vocab_load: a token table and a merge table (empty here), the chat markers by text.
  const auto &tokens = key("tokenizer.ggml.tokens");
  REQUIRE(tokens.strings.size() == 512);
  CHECK(key("tokenizer.ggml.merges").elem_type == GgufType::string);
  CHECK(key("tokenizer.ggml.merges").array_size() == 0);
  for (const char *t : {"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜"}) {
    INFO(t);
    CHECK(std::find(tokens.strings.begin(), tokens.strings.end(), t) != tokens.strings.end());
  }
  // The generic layout of the same preset keeps the router in f32 and has none of ds4's extras.
  const auto generic = ep::format::GgufSet::open(synth_ds4(dir, "generic", "generic"));
  CHECK(type_of(generic, "blk.1.ffn_gate_inp.weight") == GgmlType::f32);
  CHECK(generic.find("deepseek4.vocab_size") == nullptr);
  // ds4 reads only IQ2_XXS / Q2_K / Q4_K experts: other types are refused up front.
  CHECK(run(std::string(EP_SYNTH_EXE) + " --preset tiny --layout ds4 --experts mxfp4 --out '" + (dir / "x.gguf") + "' 2>/dev/null") != 0);
  CHECK(run(std::string(EP_SYNTH_EXE) + " --preset tiny --layout llama --out '" + (dir / "x.gguf") + "' 2>/dev/null") != 0);
}

TEST_CASE("ep-synth --layout ds4: the file runs in our engine with every expert resident") {
  ep::test::TempDir dir;
  const std::string gguf = synth_ds4(dir, "m");
  ep_model_options o;
  ep_model_options_init(&o);
  o.device = EP_DEVICE_CPU;
  o.resident_experts = 1;
  ep_model *m = nullptr;
  REQUIRE(ep_model_open(&m, gguf.c_str(), &o) == EP_OK);
  ep_tokenizer *tok = nullptr;
  REQUIRE(ep_tokenizer_open_model(&tok, m) == EP_OK);
  int32_t ids[8];
  size_t n = 0;
  REQUIRE(ep_tokenize(ids, 8, &n, tok, "hi!", 3, 0) == EP_OK);
  CHECK(n == 3);  // byte-level, no merges: one token per byte, as in ds4's BPE
  for (size_t i = 0; i < n; ++i) CHECK(ids[i] == 2 + static_cast<unsigned char>("hi!"[i]));  // the byte tokens start at id 2
  int32_t dsml = -1;
  CHECK(ep_tokenizer_token_id(&dsml, tok, "｜DSML｜") == EP_OK);
  CHECK(dsml == 262);
  ep_session *s = nullptr;
  REQUIRE(ep_session_open(&s, m) == EP_OK);
  ep_generate_options g;
  ep_generate_options_init(&g);
  g.max_new_tokens = 2;
  ep_generate_stats st;
  ep_generate_stats_init(&st);
  const int32_t prompt[] = {1, 2, 3};
  CHECK(ep_generate(&st, s, prompt, 3, &g, nullptr, nullptr) == EP_OK);
  CHECK(st.generated_tokens == 2);
  ep_session_close(s);
  ep_tokenizer_close(tok);
  ep_model_close(m);
}

TEST_CASE("ep-bench compute: CPU backend beside a stand-in ds4-bench; bytes per decode token by the formula") {
  ep::test::TempDir dir;
  const std::string gguf = synth_ds4(dir, "m");
  const std::string ds4 = fake_ds4_bench(dir);
  const std::string report = dir / "c.json", csv = dir / "c.csv", work = dir / "work";
  const int prompt_tokens = 24, gen = 3;
  const std::string cmd = std::string(EP_BENCH_EXE) + " compute --model '" + gguf + "' --device cpu --prompt-tokens " +
                          std::to_string(prompt_tokens) + " --gen-tokens " + std::to_string(gen) +
                          " --reps 3 --warmup 1 --ds4-bench '" + ds4 + "' --ds4-reps 2 --work-dir '" + work + "' --json '" + report +
                          "' --csv '" + csv + "' >'" + (dir / "out.txt") + "' 2>'" + (dir / "err.txt") + "'";
  INFO(slurp(dir / "err.txt"));
  REQUIRE(run(cmd) == 0);
  const auto j = load(report);
  CHECK(j.at("architecture") == "deepseek4");
  CHECK(j.at("prompt_tokens") == prompt_tokens);
  CHECK(j.at("gen_tokens") == gen);
  CHECK(j.at("resident_experts") == true);
  CHECK(j.at("hbm").is_null());  // no HBM bound off the GPU
  const auto &ours = j.at("ours");
  REQUIRE(ours.at("prefill_tps").at("runs").size() == 3);
  REQUIRE(ours.at("decode_tps").at("runs").size() == 3);
  for (const char *k : {"prefill_tps", "decode_tps"}) {
    const auto &r = ours.at(k);
    CHECK(r.at("median").get<double>() > 0);
    CHECK(r.at("best").get<double>() >= r.at("median").get<double>());
  }
  CHECK(ours.at("decode_ms_per_token").at("median").get<double>() ==
        Approx(1e3 / ours.at("decode_tps").at("median").get<double>()));
  // The peer: its CSV rows parsed, ratios ours / ds4 of the medians against issue 30's targets.
  const auto &p = j.at("ds4");
  CHECK(p.at("reps") == 2);
  CHECK(p.at("prefill_tps").at("median").get<double>() == Approx(100.0));
  CHECK(p.at("decode_tps").at("median").get<double>() == Approx(50.0));
  const auto &t = j.at("targets");
  CHECK(t.at("decode_vs_ds4").at("ratio").get<double>() == Approx(ours.at("decode_tps").at("median").get<double>() / 50.0));
  CHECK(t.at("prefill_vs_ds4").at("ratio").get<double>() == Approx(ours.at("prefill_tps").at("median").get<double>() / 100.0));
  CHECK(t.at("decode_vs_ds4").at("target_min").get<double>() == Approx(1.2));
  CHECK(t.at("prefill_vs_ds4").at("target_min").get<double>() == Approx(1.0));
  CHECK_FALSE(t.contains("decode_vs_hbm_bound"));
  // ds4-bench got the same prompt length, the same generation length and the prompt text,
  // whose first tokens are our prompt (one token per byte here).
  const std::string args = slurp(dir / "ds4-args.log");
  CHECK(args.find("--ctx-start " + std::to_string(prompt_tokens) + " --ctx-max " + std::to_string(prompt_tokens) + " --gen-tokens " +
                  std::to_string(gen)) != std::string::npos);
  CHECK(args.find(" --cpu ") != std::string::npos);
  CHECK(std::count(args.begin(), args.end(), '\n') == 2);
  CHECK(slurp(work + "/prompt.txt").size() >= static_cast<size_t>(prompt_tokens));
  const std::string rows = slurp(csv);
  CHECK(rows.rfind("engine,run,prompt_tokens,prefill_tps,gen_tokens,gen_tps\n", 0) == 0);
  CHECK(std::count(rows.begin(), rows.end(), '\n') == 1 + 3 + 2);
  CHECK(rows.find("ds4,2,24,100.00,3,50.00") != std::string::npos);

  // Bytes per decode token: every dense tensor once, one row of token_embd and of the hash
  // layer's tid2eid table, top_k / n_experts of each layer's routed experts.
  const auto g = ep::format::GgufSet::open(gguf);
  uint64_t dense = 0, rows_bytes = 0, experts = 0;
  const uint64_t top_k = j.at("experts_per_token").get<uint64_t>(), n_exp = j.at("experts").get<uint64_t>();
  REQUIRE(n_exp == 32);
  REQUIRE(top_k == 4);
  for (const auto &f : g.shards())
    for (const auto &ti : f.tensors()) {
      const std::string &n = ti.name;
      if (n.find("_exps.weight") != std::string::npos) {
        CHECK(ti.ne[2] == n_exp);
        experts += ti.nbytes / n_exp * top_k;
      } else if (n == "token_embd.weight" || n.find("ffn_gate_tid2eid") != std::string::npos) {
        rows_bytes += ti.nbytes / ti.ne[1];
      } else {
        dense += ti.nbytes;
      }
    }
  const auto &b = j.at("decode_bytes_per_token");
  CHECK(b.at("dense").get<uint64_t>() == dense);
  CHECK(b.at("lookup_rows").get<uint64_t>() == rows_bytes);
  CHECK(b.at("routed_experts").get<uint64_t>() == experts);
  CHECK(b.at("routed_experts_all").get<uint64_t>() == experts * n_exp / top_k);
  CHECK(b.at("total").get<uint64_t>() == dense + rows_bytes + experts);
  CHECK(rows_bytes == 256 * 2 + 4 * 4);  // one f16 embedding row of 256, one i32 row of top-4 ids
}

TEST_CASE("ep-bench compute: a failing peer and a missing GPU fail with a message and an exit status") {
  ep::test::TempDir dir;
  const std::string gguf = synth_ds4(dir, "m");
  // The peer fails: ep-bench compute still writes its own numbers, exits 1, quotes ds4's log.
  const std::string report = dir / "c.json";
  const std::string cmd = std::string(EP_BENCH_EXE) + " compute --model '" + gguf + "' --device cpu --prompt-tokens 8 --gen-tokens 2" +
                          " --reps 1 --warmup 0 --ds4-bench '" + fake_ds4_bench(dir, 3) + "' --work-dir '" + (dir / "w") +
                          "' --json '" + report + "' >/dev/null 2>'" + (dir / "err.txt") + "'";
  CHECK(run(cmd) == 1);
  const std::string err = slurp(dir / "err.txt");
  CHECK(err.find("ds4-bench exited with status 3") != std::string::npos);
  CHECK(err.find("required tensor is missing") != std::string::npos);
  const auto j = load(report);
  CHECK(j.at("ds4").at("error").get<std::string>().find("status 3") != std::string::npos);
  CHECK(j.at("ours").at("decode_tps").at("runs").size() == 1);
  // Bad arguments.
  CHECK(run(std::string(EP_BENCH_EXE) + " compute 2>/dev/null") == 1);
  CHECK(run(std::string(EP_BENCH_EXE) + " compute --model '" + (dir / "none.gguf") + "' 2>/dev/null") == 1);
  CHECK(run(std::string(EP_BENCH_EXE) + " compute --model '" + gguf + "' --device tpu 2>/dev/null") == 1);
  CHECK(run(std::string(EP_BENCH_EXE) + " compute --model '" + gguf + "' --device cpu --ds4-bench '" + (dir / "nope") + "' 2>/dev/null") == 1);
  // On CUDA (the default) without a GPU: a message naming the cause, exit status 1, no crash.
  int32_t gpus = 0;
  REQUIRE(ep_cuda_device_count(&gpus) == EP_OK);
  if (gpus > 0) {
    WARN("a CUDA device is present: the no-GPU case is not exercised");
    return;
  }
  CHECK(run(std::string(EP_BENCH_EXE) + " compute --model '" + gguf + "' 2>'" + (dir / "gpu.txt") + "'") == 1);
  const std::string gpu = slurp(dir / "gpu.txt");
  CHECK(gpu.find("no CUDA device") != std::string::npos);
  CHECK(gpu.find("--device cpu") != std::string::npos);
}
