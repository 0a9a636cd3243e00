#include "model/weight_catalog.hpp"

#include "backend/dequant.hpp"
#include "core/error.hpp"
#include "format/file_format.hpp"
#include "format/gguf.hpp"
#include "format/safetensors.hpp"
#include "model/kimi_config.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <cmath>
#include <cstring>
#include <optional>

namespace ep::model {

using format::GgmlType;

void WeightCatalog::add(const std::string &name, CatalogEntry entry) {
  if (entries_.count(name))
    fail(Status::format, "{}: tensor {} appears twice ({} and {})", source_, name, entries_[name].origin, entry.origin);
  entries_.emplace(name, std::move(entry));
}

const CatalogEntry *WeightCatalog::take(const std::string &name, std::vector<int64_t> ne) {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    missing_.push_back(name);
    return nullptr;
  }
  taken_[name] = true;
  std::array<int64_t, 4> want{1, 1, 1, 1};
  for (size_t i = 0; i < ne.size() && i < 4; ++i) want[i] = ne[i];
  if (want != it->second.ne) {
    const auto &h = it->second.ne;
    misshaped_.push_back(fmt::format("{} ({}): ne [{}, {}, {}, {}], expected [{}, {}, {}, {}]", name, it->second.origin, h[0], h[1],
                                     h[2], h[3], want[0], want[1], want[2], want[3]));
    return nullptr;
  }
  return &it->second;
}

size_t WeightCatalog::skip_prefix(const std::string &prefix) {
  size_t n = 0;
  for (auto it = entries_.lower_bound(prefix); it != entries_.end() && it->first.rfind(prefix, 0) == 0; ++it, ++n)
    taken_[it->first] = true;
  return n;
}

void WeightCatalog::finish() const {
  std::vector<std::string> unused;
  for (const auto &[name, e] : entries_)
    if (!taken_.count(name)) unused.push_back(fmt::format("{} ({})", name, e.origin));
  if (missing_.empty() && misshaped_.empty() && unused.empty() && unmapped_.empty()) return;
  auto join = [](const std::vector<std::string> &v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
    return s;
  };
  std::string msg = fmt::format("{}: the tensors do not match a {} model:", source_, model_);
  if (!missing_.empty()) msg += fmt::format(" missing [{}];", join(missing_));
  if (!misshaped_.empty()) msg += fmt::format(" mis-shaped [{}];", join(misshaped_));
  if (!unmapped_.empty()) msg += fmt::format(" unmapped [{}];", join(unmapped_));
  if (!unused.empty()) msg += fmt::format(" unexpected [{}];", join(unused));
  throw Error(misshaped_.empty() ? Status::format : Status::shape, msg);
}

WeightCatalog WeightCatalog::from_gguf(const std::string &path) {
  auto set = std::make_shared<format::GgufSet>(format::GgufSet::open(path));
  WeightCatalog cat;
  cat.source_ = path;
  cat.keep_alive_.push_back(set);
  for (const format::GgufFile &file : set->shards()) {
    for (const format::GgufTensorInfo &info : file.tensors()) {
      CatalogEntry e;
      e.type = info.type;
      for (int i = 0; i < 4; ++i) e.ne[static_cast<size_t>(i)] = static_cast<int64_t>(info.ne[static_cast<size_t>(i)]);
      e.origin = fmt::format("{}: {}", file.path(), info.name);
      const format::GgufFile *f = &file;
      const uint64_t off = info.file_offset, n = info.nbytes;
      e.read = [set, f, off, n] { return f->source().read_vector(off, static_cast<size_t>(n)); };
      if (info.n_dims == 3) {
        const uint64_t slab = format::ggml_row_bytes(info.type, info.ne[0], info.name) * info.ne[1];
        const int64_t n_exp = static_cast<int64_t>(info.ne[2]);
        const std::string name = info.name;
        e.read_expert = [set, f, off, slab, n_exp, name](int64_t x) {
          if (x < 0 || x >= n_exp) fail(Status::invalid_argument, "{}: expert {} outside 0..{}", name, x, n_exp - 1);
          return f->source().read_vector(off + slab * static_cast<uint64_t>(x), static_cast<size_t>(slab));
        };
      }
      cat.add(info.name, std::move(e));
    }
  }
  return cat;
}

std::string deepseek_v4_gguf_name(const std::string &in, int64_t *expert) {
  std::string n = in;
  if (n.rfind("model.", 0) == 0) n = n.substr(6);
  static const std::map<std::string, std::string> top = {
      {"embed_tokens.weight", "token_embd.weight"}, {"embed.weight", "token_embd.weight"},
      {"head.weight", "output.weight"},             {"lm_head.weight", "output.weight"},
      {"norm.weight", "output_norm.weight"},        {"hc_head.hc_fn", "output_hc_fn.weight"},
      {"hc_head_fn", "output_hc_fn.weight"},        {"hc_head.hc_base", "output_hc_base.weight"},
      {"hc_head_base", "output_hc_base.weight"},    {"hc_head.hc_scale", "output_hc_scale.weight"},
      {"hc_head_scale", "output_hc_scale.weight"},
  };
  if (auto it = top.find(n); it != top.end()) return it->second;
  if (n.rfind("layers.", 0) != 0) return "";
  size_t p = 7, q = n.find('.', p);
  if (q == std::string::npos || q == p) return "";
  const std::string layer = n.substr(p, q - p);
  for (char ch : layer)
    if (ch < '0' || ch > '9') return "";
  const std::string rest = n.substr(q + 1), b = "blk." + layer + ".";
  static const std::map<std::string, std::string> per_layer = {
      {"attn_norm.weight", "attn_norm.weight"},
      {"ffn_norm.weight", "ffn_norm.weight"},
      {"hc_attn_fn", "hc_attn_fn.weight"}, {"hc_attn_base", "hc_attn_base.weight"}, {"hc_attn_scale", "hc_attn_scale.weight"},
      {"hc_ffn_fn", "hc_ffn_fn.weight"}, {"hc_ffn_base", "hc_ffn_base.weight"}, {"hc_ffn_scale", "hc_ffn_scale.weight"},
      {"attn.attn_sink", "attn_sinks.weight"},
      {"attn.wq_a.weight", "attn_q_a.weight"},
      {"attn.q_norm.weight", "attn_q_a_norm.weight"},
      {"attn.wq_b.weight", "attn_q_b.weight"},
      {"attn.wkv.weight", "attn_kv.weight"},
      {"attn.kv_norm.weight", "attn_kv_a_norm.weight"},
      {"attn.norm.weight", "attn_kv_a_norm.weight"},
      {"attn.wo_a.weight", "attn_output_a.weight"},
      {"attn.wo_b.weight", "attn_output_b.weight"},
      {"attn.compressor.wkv.weight", "attn_compressor_kv.weight"},
      {"attn.compressor.wgate.weight", "attn_compressor_gate.weight"},
      {"attn.compressor.ape", "attn_compressor_ape.weight"},
      {"attn.compressor.norm.weight", "attn_compressor_norm.weight"},
      {"attn.indexer.weights_proj.weight", "indexer.proj.weight"},
      {"attn.indexer.wq_b.weight", "indexer.attn_q_b.weight"},
      {"attn.indexer.compressor.wkv.weight", "indexer_compressor_kv.weight"},
      {"attn.indexer.compressor.wgate.weight", "indexer_compressor_gate.weight"},
      {"attn.indexer.compressor.ape", "indexer_compressor_ape.weight"},
      {"attn.indexer.compressor.norm.weight", "indexer_compressor_norm.weight"},
      {"ffn.gate.weight", "ffn_gate_inp.weight"},
      {"ffn.gate.bias", "exp_probs_b.bias"},
      {"ffn.gate.e_score_correction_bias", "exp_probs_b.bias"},
      {"ffn.gate.tid2eid", "ffn_gate_tid2eid.weight"},
      {"ffn.shared_experts.w1.weight", "ffn_gate_shexp.weight"},
      {"ffn.shared_experts.w3.weight", "ffn_up_shexp.weight"},
      {"ffn.shared_experts.w2.weight", "ffn_down_shexp.weight"},
  };
  if (auto it = per_layer.find(rest); it != per_layer.end()) return b + it->second;
  // ffn.experts.E.w{1,2,3}.weight
  const std::string ex = "ffn.experts.";
  if (rest.rfind(ex, 0) == 0) {
    const size_t e0 = ex.size(), e1 = rest.find('.', e0);
    if (e1 == std::string::npos || e1 == e0) return "";
    const std::string id = rest.substr(e0, e1 - e0);
    for (char ch : id)
      if (ch < '0' || ch > '9') return "";
    const std::string w = rest.substr(e1 + 1);
    std::string stacked;
    if (w == "w1.weight") stacked = "ffn_gate_exps.weight";
    else if (w == "w3.weight") stacked = "ffn_up_exps.weight";
    else if (w == "w2.weight") stacked = "ffn_down_exps.weight";
    else return "";
    if (id.size() > 9) return "";
    if (expert) *expert = std::stoll(id);
    return b + stacked;
  }
  return "";
}

namespace {

bool is_integer(GgmlType t) { return t == GgmlType::i8 || t == GgmlType::i16 || t == GgmlType::i32 || t == GgmlType::i64; }

std::array<int64_t, 4> ne_of(const std::vector<uint64_t> &shape) {
  std::array<int64_t, 4> ne{1, 1, 1, 1};
  for (size_t i = 0; i < shape.size() && i < 4; ++i) ne[i] = static_cast<int64_t>(shape[shape.size() - 1 - i]);
  return ne;
}

/// One catalog entry holding a logical checkpoint tensor as it is.
CatalogEntry entry_of(const std::shared_ptr<const format::SafetensorsSet> &set, const format::StLogical &l) {
  CatalogEntry e;
  e.type = l.type;
  e.ne = ne_of(l.shape);
  e.origin = l.origin;
  e.read = [set, l] { return l.read(); };
  return e;
}

/// An i64 / i32 table as i32 (tid2eid).
CatalogEntry int_entry_of(const std::shared_ptr<const format::SafetensorsSet> &set, const format::StLogical &l) {
  CatalogEntry e = entry_of(set, l);
  e.type = GgmlType::i32;
  const bool wide = l.type == GgmlType::i64;
  const std::string origin = l.origin;
  e.read = [set, l, wide, origin] {
    std::vector<uint8_t> raw = l.read();
    if (!wide) return raw;
    std::vector<uint8_t> out(raw.size() / 2);
    for (size_t i = 0; i < raw.size() / 8; ++i) {
      int64_t v;
      std::memcpy(&v, raw.data() + 8 * i, 8);
      if (v < INT32_MIN || v > INT32_MAX) fail(Status::corrupt, "{}: entry {} = {} does not fit int32", origin, i, v);
      const int32_t w = static_cast<int32_t>(v);
      std::memcpy(out.data() + 4 * i, &w, 4);
    }
    return out;
  };
  return e;
}

/// Per-expert 2-D tensors of one role stacked into [ne0, ne1, n_expert]; every expert must be
/// present and agree in type and shape (else nullopt, and @p problem says why).
std::optional<CatalogEntry> stack_experts(const std::shared_ptr<const format::SafetensorsSet> &set, const std::string &source,
                                          const std::string &gguf_name, const std::map<int64_t, format::StLogical> &parts,
                                          std::string *problem) {
  const int64_t n = parts.rbegin()->first + 1;
  const format::StLogical &first = parts.begin()->second;
  std::vector<format::StLogical> ordered;
  for (int64_t x = 0; x < n; ++x) {
    auto it = parts.find(x);
    if (it == parts.end()) {
      *problem = fmt::format("{}: {} has experts up to {} but expert {} is missing", source, gguf_name, n - 1, x);
      return std::nullopt;
    }
    if (it->second.type != first.type || it->second.shape != first.shape) {
      *problem = fmt::format("{}: expert {} of {} is type {} {}x{}, expert {} is type {} {}x{} ({})", source, x, gguf_name,
                             static_cast<uint32_t>(it->second.type), it->second.shape[0], it->second.shape[1], parts.begin()->first,
                             static_cast<uint32_t>(first.type), first.shape[0], first.shape[1], it->second.origin);
      return std::nullopt;
    }
    ordered.push_back(it->second);
  }
  CatalogEntry e;
  e.type = first.type;
  e.ne = {static_cast<int64_t>(first.shape[1]), static_cast<int64_t>(first.shape[0]), n, 1};
  e.origin = fmt::format("{}: {} experts of {}", source, n, first.origin);
  auto read_one = [set, ordered](int64_t x) {
    if (x < 0 || x >= static_cast<int64_t>(ordered.size()))
      fail(Status::invalid_argument, "expert {} outside 0..{}", x, ordered.size() - 1);
    return ordered[static_cast<size_t>(x)].read();
  };
  e.read_expert = read_one;
  e.read = [read_one, n] {
    std::vector<uint8_t> all;
    for (int64_t x = 0; x < n; ++x) {
      std::vector<uint8_t> one = read_one(x);
      all.insert(all.end(), one.begin(), one.end());
    }
    return all;
  };
  return e;
}

bool is_expert_type(GgmlType t) { return !is_integer(t) && t != GgmlType::f64; }

std::vector<float> values_f32(const format::StLogical &l) {
  uint64_t n = 1;
  for (uint64_t d : l.shape) n *= d;
  const std::vector<uint8_t> raw = l.read();
  std::vector<float> v(static_cast<size_t>(n));
  backend::dequantize_row(l.type, raw.data(), v.data(), static_cast<int64_t>(n));
  return v;
}

CatalogEntry f32_entry(std::vector<int64_t> ne, std::string origin, std::function<std::vector<float>()> values) {
  CatalogEntry e;
  e.type = GgmlType::f32;
  for (size_t i = 0; i < ne.size() && i < 4; ++i) e.ne[i] = ne[i];
  e.origin = std::move(origin);
  e.read = [values = std::move(values)] {
    const std::vector<float> v = values();
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  };
  return e;
}

}  // namespace

SafetensorsCheckpoint open_safetensors_checkpoint(const std::string &path, const std::string &model) {
  namespace fs = std::filesystem;
  using format::FileFormat;
  const FileFormat kind = format::detect_file_format(path);
  if (kind != FileFormat::safetensors && kind != FileFormat::safetensors_index && kind != FileFormat::hf_config &&
      kind != FileFormat::checkpoint_dir && kind != FileFormat::directory)
    fail(Status::format, "{}: a {}, not a {} GGUF or safetensors checkpoint", path, format::file_format_name(kind), model);
  const fs::path dir = format::checkpoint_dir_of(path, kind);
  SafetensorsCheckpoint c;
  c.config_path = (dir / "config.json").string();
  if (!fs::exists(c.config_path)) fail(Status::not_found, "{}: no config.json beside the safetensors checkpoint", dir.string());
  std::ifstream in(c.config_path, std::ios::binary);
  if (!in) fail(Status::not_found, "{}: cannot open", c.config_path);
  std::stringstream ss;
  ss << in.rdbuf();
  c.config_text = ss.str();
  c.quant = format::CheckpointQuant::from_config_json(c.config_text, c.config_path);
  c.weights = kind == FileFormat::hf_config ? dir.string() : path;  // the directory's index / model.safetensors
  return c;
}

float kimi_ssm_a_from_a_log(float a_log) noexcept { return static_cast<float>(-std::exp(static_cast<double>(a_log))); }

WeightCatalog WeightCatalog::from_deepseek_v4_safetensors(const std::string &path, const format::CheckpointQuant &quant) {
  auto set = std::make_shared<const format::SafetensorsSet>(format::SafetensorsSet::open(path));
  WeightCatalog cat;
  cat.source_ = path;
  cat.keep_alive_.push_back(set);
  format::StResolved r = format::resolve_checkpoint_tensors(*set, quant, {"mtp.", "model.mtp."});  // MTP layer: not run
  for (std::string &why : r.rejected) cat.add_unmapped(std::move(why));
  std::map<std::string, std::map<int64_t, format::StLogical>> experts;
  for (const format::StLogical &l : r.tensors) {
    int64_t expert = -1;
    const std::string g = deepseek_v4_gguf_name(l.name, &expert);
    if (g.empty()) {
      cat.add_unmapped(l.origin);
      continue;
    }
    if (l.shape.empty() || l.shape.size() > 3) {
      cat.add_unmapped(fmt::format("{} (rank {})", l.origin, l.shape.size()));
      continue;
    }
    if (expert >= 0) {
      if (!is_expert_type(l.type) || l.shape.size() != 2) {
        cat.add_unmapped(fmt::format("{} (experts must be 2-D float or FP4 tensors)", l.origin));
        continue;
      }
      if (!experts[g].emplace(expert, l).second) fail(Status::format, "{}: expert {} appears twice", l.origin, expert);
      continue;
    }
    if (g.find("ffn_gate_tid2eid") != std::string::npos) {
      if (l.type != GgmlType::i64 && l.type != GgmlType::i32) {
        cat.add_unmapped(fmt::format("{} (expected I64/I32)", l.origin));
        continue;
      }
      cat.add(g, int_entry_of(set, l));
      continue;
    }
    if (is_integer(l.type) || l.type == GgmlType::f64) {
      cat.add_unmapped(fmt::format("{} (an integer or F64 tensor where floats are expected)", l.origin));
      continue;
    }
    cat.add(g, entry_of(set, l));
  }
  for (auto &[g, parts] : experts) {
    std::string problem;
    if (auto e = stack_experts(set, path, g, parts, &problem)) cat.add(g, std::move(*e));
    else cat.add_unmapped(problem);
  }
  return cat;
}

std::string kimi_gguf_name(const std::string &in, const KimiConfig &c, int64_t *expert) {
  std::string n = in;
  if (n.rfind("language_model.", 0) == 0) n = n.substr(15);
  if (n == "lm_head.weight") return "output.weight";
  if (n.rfind("model.", 0) != 0) return "";
  n = n.substr(6);
  static const std::map<std::string, std::string> top = {
      {"embed_tokens.weight", "token_embd.weight"},
      {"norm.weight", "output_norm.weight"},
      {"output_attn_res_norm.weight", "output_res_score.weight#norm"},
      {"output_attn_res_proj.weight", "output_res_score.weight#proj"},
  };
  if (auto it = top.find(n); it != top.end()) return it->second;
  if (n.rfind("layers.", 0) != 0) return "";
  const size_t q = n.find('.', 7);
  if (q == std::string::npos || q == 7 || q > 7 + 6) return "";
  const std::string layer = n.substr(7, q - 7);
  for (char ch : layer)
    if (ch < '0' || ch > '9') return "";
  const int64_t il = std::stoll(layer);
  if (il >= c.n_layers) return "";
  const bool kda = c.mixer[static_cast<size_t>(il)] == KimiMixer::kda;
  const std::string rest = n.substr(q + 1), b = "blk." + layer + ".";
  static const std::map<std::string, std::string> per_layer = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attention_res_norm.weight", "attn_res_score.weight#norm"},
      {"self_attention_res_proj.weight", "attn_res_score.weight#proj"},
      {"mlp_res_norm.weight", "ffn_res_score.weight#norm"},
      {"mlp_res_proj.weight", "ffn_res_score.weight#proj"},
      // KDA
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.q_conv1d.weight", "ssm_conv1d_q.weight"},
      {"self_attn.k_conv1d.weight", "ssm_conv1d_k.weight"},
      {"self_attn.v_conv1d.weight", "ssm_conv1d_v.weight"},
      {"self_attn.f_a_proj.weight", "ssm_f_a.weight"},
      {"self_attn.f_b_proj.weight", "ssm_f_b.weight"},
      {"self_attn.dt_bias", "ssm_dt.bias"},
      {"self_attn.A_log", "ssm_a#A_log"},
      {"self_attn.b_proj.weight", "ssm_beta.weight"},
      {"self_attn.g_a_proj.weight", "ssm_g_a.weight"},
      {"self_attn.g_b_proj.weight", "ssm_g_b.weight"},
      {"self_attn.o_norm.weight", "ssm_norm.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      // MLA
      {"self_attn.q_a_proj.weight", "attn_q_a.weight"},
      {"self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight"},
      {"self_attn.q_b_proj.weight", "attn_q_b.weight"},
      {"self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight"},
      {"self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight"},
      {"self_attn.kv_b_proj.weight", "attn_kv_b.weight"},
  };
  if (rest == "self_attn.g_proj.weight") return b + (kda ? "ssm_g.weight" : "attn_gate.weight");
  if (auto it = per_layer.find(rest); it != per_layer.end()) return b + it->second;
  // FFN: transformers saves the dense layers under block_sparse_moe. too; Kimi-K3 under mlp.
  std::string f;
  if (rest.rfind("block_sparse_moe.", 0) == 0) f = rest.substr(17);
  else if (rest.rfind("mlp.", 0) == 0) f = rest.substr(4);
  else return "";
  static const std::map<std::string, std::string> dense = {
      {"gate_proj.weight", "ffn_gate.weight"}, {"up_proj.weight", "ffn_up.weight"}, {"down_proj.weight", "ffn_down.weight"}};
  static const std::map<std::string, std::string> moe = {
      {"gate.weight", "ffn_gate_inp.weight"},
      {"gate.e_score_correction_bias", "exp_probs_b.bias"},
      {"shared_experts.gate_proj.weight", "ffn_gate_shexp.weight"},
      {"shared_experts.up_proj.weight", "ffn_up_shexp.weight"},
      {"shared_experts.down_proj.weight", "ffn_down_shexp.weight"},
      {"routed_expert_down_proj.weight", "ffn_routed_down.weight"},
      {"routed_expert_up_proj.weight", "ffn_routed_up.weight"},
      {"routed_expert_norm.weight", "ffn_routed_norm.weight"},
  };
  if (!c.is_moe(il)) {
    auto it = dense.find(f);
    return it == dense.end() ? "" : b + it->second;
  }
  if (auto it = moe.find(f); it != moe.end()) return b + it->second;
  if (f.rfind("experts.", 0) != 0) return "";
  const size_t e1 = f.find('.', 8);
  if (e1 == std::string::npos || e1 == 8 || e1 > 8 + 9) return "";
  const std::string id = f.substr(8, e1 - 8);
  for (char ch : id)
    if (ch < '0' || ch > '9') return "";
  const std::string w = f.substr(e1 + 1);
  std::string stacked;
  if (w == "w1.weight") stacked = "ffn_gate_exps.weight";
  else if (w == "w3.weight") stacked = "ffn_up_exps.weight";
  else if (w == "w2.weight") stacked = "ffn_down_exps.weight";
  else return "";
  if (expert) *expert = std::stoll(id);
  return b + stacked;
}

WeightCatalog WeightCatalog::from_kimi_safetensors(const std::string &path, const KimiConfig &c, const format::CheckpointQuant &quant) {
  auto set = std::make_shared<const format::SafetensorsSet>(format::SafetensorsSet::open(path));
  WeightCatalog cat;
  cat.source_ = path;
  cat.model_ = "Kimi";
  cat.keep_alive_.push_back(set);
  // text only: the vision tower and its projector are not run
  format::StResolved r = format::resolve_checkpoint_tensors(
      *set, quant, {"vision_tower.", "mm_projector.", "multi_modal_projector.", "language_model.vision_tower."});
  for (std::string &why : r.rejected) cat.add_unmapped(std::move(why));
  std::map<std::string, std::map<int64_t, format::StLogical>> experts;
  std::map<std::string, std::pair<std::optional<format::StLogical>, std::optional<format::StLogical>>> res_pairs;
  for (const format::StLogical &l : r.tensors) {
    int64_t expert = -1;
    const std::string g = kimi_gguf_name(l.name, c, &expert);
    if (g.empty()) {
      cat.add_unmapped(l.origin);
      continue;
    }
    if (is_integer(l.type) || l.type == GgmlType::f64) {
      cat.add_unmapped(fmt::format("{} (an integer or F64 tensor where floats are expected)", l.origin));
      continue;
    }
    if (expert >= 0) {
      if (l.shape.size() != 2) {
        cat.add_unmapped(fmt::format("{} (experts must be 2-D)", l.origin));
        continue;
      }
      if (!experts[g].emplace(expert, l).second) fail(Status::format, "{}: expert {} appears twice", l.origin, expert);
      continue;
    }
    const size_t hash = g.find('#');
    if (hash == std::string::npos) {
      cat.add(g, entry_of(set, l));
      continue;
    }
    const std::string base = g.substr(0, hash), tag = g.substr(hash + 1);
    if (tag == "A_log") {
      // ssm_a = −exp(A_log) per head; Kimi-K3 pads A_log past its heads (the padding is unused)
      uint64_t numel = 1;
      for (uint64_t d : l.shape) numel *= d;
      if (numel < static_cast<uint64_t>(c.kda_heads)) {
        cat.add(base, entry_of(set, l));  // take() reports the shape
        continue;
      }
      const int64_t H = c.kda_heads;
      cat.add(base, f32_entry({H}, l.origin + " (ssm_a = -exp(A_log))", [set, l, H] {
                std::vector<float> v = values_f32(l);
                v.resize(static_cast<size_t>(H));
                for (float &x : v) x = kimi_ssm_a_from_a_log(x);
                return v;
              }));
      continue;
    }
    auto &pr = res_pairs[base];
    (tag == "norm" ? pr.first : pr.second) = l;
  }
  for (auto &[g, pr] : res_pairs) {
    const format::StLogical &one = pr.first ? *pr.first : *pr.second;
    if (!pr.first || !pr.second) {
      cat.add_unmapped(fmt::format("{} (an AttnRes {} without its {})", one.origin, pr.first ? "norm" : "proj", pr.first ? "proj" : "norm"));
      continue;
    }
    const format::StLogical norm = *pr.first, proj = *pr.second;
    uint64_t nn = 1, np = 1;
    for (uint64_t d : norm.shape) nn *= d;
    for (uint64_t d : proj.shape) np *= d;
    if (nn != np) {
      cat.add_unmapped(fmt::format("{} and {} (the AttnRes norm and proj differ in size)", norm.origin, proj.origin));
      continue;
    }
    // the score vector is only ever used as norm ⊙ proj (llama.cpp folds it the same way)
    cat.add(g, f32_entry({static_cast<int64_t>(nn)}, norm.origin + " * " + proj.origin, [set, norm, proj] {
              std::vector<float> a = values_f32(norm);
              const std::vector<float> b = values_f32(proj);
              for (size_t i = 0; i < a.size(); ++i) a[i] *= b[i];
              return a;
            }));
  }
  for (auto &[g, parts] : experts) {
    std::string problem;
    if (auto e = stack_experts(set, path, g, parts, &problem)) cat.add(g, std::move(*e));
    else cat.add_unmapped(problem);
  }
  return cat;
}

}  // namespace ep::model
