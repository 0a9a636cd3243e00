#include "testkit/checkpoint.hpp"

#include "core/error.hpp"
#include "format/gguf_writer.hpp"
#include "format/safetensors.hpp"

#include <cstring>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <nlohmann/json.hpp>

namespace ep::testkit {
using format::GgmlType;
using format::GgufType;
using format::GgufValue;

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

void synthetic_bytes(uint64_t seed, uint64_t stream, uint64_t offset, std::span<uint8_t> out) {
  const uint64_t key = splitmix64(seed * 0x100000001B3ull ^ splitmix64(stream));
  size_t i = 0;
  uint64_t word = offset / 8;
  size_t skip = static_cast<size_t>(offset % 8);
  while (i < out.size()) {
    const uint64_t v = splitmix64(key ^ word);
    uint8_t b[8];
    std::memcpy(b, &v, 8);
    const size_t n = std::min<size_t>(8 - skip, out.size() - i);
    std::memcpy(out.data() + i, b + skip, n);
    i += n;
    skip = 0;
    ++word;
  }
}

std::vector<std::string> write_synthetic_gguf(const SyntheticSpec &spec, const std::string &path,
                                              const std::function<void(uint64_t, uint64_t)> &progress) {
  format::GgufWriter w;
  w.set_alignment(spec.alignment);
  const std::string a = spec.arch;
  w.add("general.architecture", GgufValue::make_string(a));
  w.add("general.name", GgufValue::make_string("synthetic " + a));
  w.add("general.file_type", GgufValue::make_u32(38));
  w.add(a + ".block_count", GgufValue::make_u32(spec.num_layers));
  w.add(a + ".embedding_length", GgufValue::make_u32(static_cast<uint32_t>(spec.n_embd)));
  w.add(a + ".expert_count", GgufValue::make_u32(spec.num_experts));
  w.add(a + ".expert_used_count", GgufValue::make_u32(spec.top_k));
  w.add(a + ".expert_feed_forward_length", GgufValue::make_u32(static_cast<uint32_t>(spec.n_ff)));
  if (spec.small_extras) {
    // One key of every GGUF value type, and nested arrays, so readers are exercised.
    w.add(a + ".expert_weights_scale", GgufValue::make_f32(1.5f));
    w.add(a + ".expert_weights_norm", GgufValue::make_bool(true));
    w.add(a + ".leading_dense_block_count", GgufValue::make_u32(spec.first_moe_layer));
    std::vector<GgufValue> ratios;
    for (uint32_t l = 0; l < spec.num_layers; ++l) ratios.push_back(GgufValue::make_i32(l < 2 ? 0 : (l % 2 ? 128 : 4)));
    w.add(a + ".attention.compress_ratios", GgufValue::make_array(GgufType::i32, ratios));
    w.add("synthetic.u8", GgufValue::make_u8(200));
    w.add("synthetic.i8", GgufValue::make_i8(-5));
    w.add("synthetic.u16", GgufValue::make_u16(65000));
    w.add("synthetic.i16", GgufValue::make_i16(-30000));
    w.add("synthetic.i64", GgufValue::make_i64(-(1ll << 40)));
    w.add("synthetic.u64", GgufValue::make_u64(1ull << 50));
    w.add("synthetic.f64", GgufValue::make_f64(0.125));
    w.add("synthetic.seed", GgufValue::make_u64(spec.seed));
    w.add("tokenizer.ggml.tokens",
          GgufValue::make_array(GgufType::string, {GgufValue::make_string("<s>"), GgufValue::make_string("</s>"),
                                                   GgufValue::make_string("hello")}));
    w.add("synthetic.nested",
          GgufValue::make_array(GgufType::array,
                                {GgufValue::make_array(GgufType::u16, {GgufValue::make_u16(1), GgufValue::make_u16(2)}),
                                 GgufValue::make_array(GgufType::f32, {GgufValue::make_f32(0.5f)})}));
  }
  if (spec.small_extras) w.add_tensor("token_embd.weight", GgmlType::f32, {spec.n_embd, 8});
  for (uint32_t l = 0; l < spec.num_layers; ++l) {
    const std::string b = fmt::format("blk.{}.", l);
    if (spec.small_extras) w.add_tensor(b + "attn_norm.weight", GgmlType::f32, {spec.n_embd});
    if (l < spec.first_moe_layer) {
      w.add_tensor(b + "ffn_gate.weight", GgmlType::f32, {spec.n_embd, 8});
      w.add_tensor(b + "ffn_up.weight", GgmlType::f32, {spec.n_embd, 8});
      w.add_tensor(b + "ffn_down.weight", GgmlType::f32, {8, spec.n_embd});
      continue;
    }
    if (spec.small_extras) w.add_tensor(b + "ffn_gate_inp.weight", GgmlType::f32, {spec.n_embd, spec.num_experts});
    w.add_tensor(b + "ffn_gate_exps.weight", spec.expert_type, {spec.n_embd, spec.n_ff, spec.num_experts});
    w.add_tensor(b + "ffn_up_exps.weight", spec.expert_type, {spec.n_embd, spec.n_ff, spec.num_experts});
    w.add_tensor(b + "ffn_down_exps.weight", spec.down_type, {spec.n_ff, spec.n_embd, spec.num_experts});
  }
  if (spec.small_extras) w.add_tensor("output_norm.weight", GgmlType::f32, {spec.n_embd});
  auto fill = [&](size_t tensor, uint64_t offset, std::span<uint8_t> out) {
    synthetic_bytes(spec.seed, tensor, offset, out);
  };
  return w.write(path, spec.n_shards, fill, progress);
}

std::string write_synthetic_safetensors(const SyntheticSpec &spec, const std::string &dir, StLayout layout) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  using format::StDtype;
  using format::StWriteTensor;
  std::vector<StWriteTensor> tensors;
  const uint64_t D = spec.n_embd, F = spec.n_ff, E = spec.num_experts;
  tensors.push_back({"model.embed_tokens.weight", StDtype::bf16, {8, D}});
  for (uint32_t l = 0; l < spec.num_layers; ++l) {
    const std::string b = fmt::format("model.layers.{}.", l);
    tensors.push_back({b + "input_layernorm.weight", StDtype::bf16, {D}});
    if (l < spec.first_moe_layer) {
      tensors.push_back({b + "mlp.gate_proj.weight", StDtype::bf16, {8, D}});
      continue;
    }
    switch (layout) {
      case StLayout::fused:
        tensors.push_back({b + "mlp.experts.gate_up_proj", StDtype::bf16, {E, 2 * F, D}});
        tensors.push_back({b + "mlp.experts.down_proj", StDtype::bf16, {E, D, F}});
        break;
      case StLayout::per_expert:
        for (uint64_t e = 0; e < E; ++e) {
          tensors.push_back({fmt::format("{}mlp.experts.{}.gate_proj.weight", b, e), StDtype::bf16, {F, D}});
          tensors.push_back({fmt::format("{}mlp.experts.{}.up_proj.weight", b, e), StDtype::bf16, {F, D}});
          tensors.push_back({fmt::format("{}mlp.experts.{}.down_proj.weight", b, e), StDtype::bf16, {D, F}});
        }
        break;
      case StLayout::per_expert_w123:
        for (uint64_t e = 0; e < E; ++e) {
          tensors.push_back({fmt::format("{}block_sparse_moe.experts.{}.w1.weight", b, e), StDtype::bf16, {F, D}});
          tensors.push_back({fmt::format("{}block_sparse_moe.experts.{}.w2.weight", b, e), StDtype::bf16, {D, F}});
          tensors.push_back({fmt::format("{}block_sparse_moe.experts.{}.w3.weight", b, e), StDtype::bf16, {F, D}});
        }
        break;
    }
  }
  tensors.push_back({"model.layers.0.mlp.gate.e_score_correction_bias", StDtype::f32, {E}});
  const uint32_t n_shards = std::max<uint32_t>(1, std::min<uint32_t>(spec.n_shards, static_cast<uint32_t>(tensors.size())));
  // Contiguous groups of tensors per shard; stream ids are global tensor indices.
  std::vector<size_t> first(n_shards + 1);
  for (uint32_t s = 0; s <= n_shards; ++s) first[s] = tensors.size() * s / n_shards;
  nlohmann::json weight_map = nlohmann::json::object();
  std::string single;
  for (uint32_t s = 0; s < n_shards; ++s) {
    const std::string name =
        n_shards == 1 ? "model.safetensors" : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, n_shards);
    std::vector<StWriteTensor> part(tensors.begin() + static_cast<std::ptrdiff_t>(first[s]),
                                    tensors.begin() + static_cast<std::ptrdiff_t>(first[s + 1]));
    const size_t base = first[s];
    format::write_safetensors((fs::path(dir) / name).string(), part,
                              [&](size_t t, uint64_t off, std::span<uint8_t> out) {
                                synthetic_bytes(spec.seed, base + t, off, out);
                              },
                              {{"format", "pt"}, {"architecture", spec.arch}});
    for (const auto &t : part) weight_map[t.name] = name;
    single = (fs::path(dir) / name).string();
  }
  if (n_shards == 1) return single;
  const std::string index = (fs::path(dir) / "model.safetensors.index.json").string();
  std::ofstream(index) << nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump(2);
  return index;
}

}  // namespace ep::testkit
