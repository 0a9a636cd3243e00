#include "model/weight_catalog.hpp"

#include "core/error.hpp"
#include "format/gguf.hpp"
#include "format/safetensors.hpp"

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
  std::string msg = fmt::format("{}: the tensors do not match a DeepSeek-V4 model:", source_);
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

std::optional<GgmlType> ggml_from_st(format::StDtype d) {
  switch (d) {
    case format::StDtype::f32: return GgmlType::f32;
    case format::StDtype::f16: return GgmlType::f16;
    case format::StDtype::bf16: return GgmlType::bf16;
    default: return std::nullopt;
  }
}

}  // namespace

WeightCatalog WeightCatalog::from_deepseek_v4_safetensors(const std::string &path) {
  auto set = std::make_shared<format::SafetensorsSet>(format::SafetensorsSet::open(path));
  WeightCatalog cat;
  cat.source_ = path;
  cat.keep_alive_.push_back(set);
  struct Part {
    const format::SafetensorsFile *file;
    const format::StTensorInfo *info;
  };
  std::map<std::string, std::map<int64_t, Part>> experts;
  for (const format::SafetensorsFile &file : set->files()) {
    for (const format::StTensorInfo &info : file.tensors()) {
      const std::string &name = info.name;
      if (name.rfind("mtp.", 0) == 0 || name.rfind("model.mtp.", 0) == 0) continue;  // MTP layer: not run
      int64_t expert = -1;
      const std::string g = deepseek_v4_gguf_name(name, &expert);
      const std::string origin = fmt::format("{}: {}", file.path(), name);
      if (g.empty()) {
        cat.add_unmapped(origin);
        continue;
      }
      if (info.shape.empty() || info.shape.size() > 3) {
        cat.add_unmapped(fmt::format("{} (rank {})", origin, info.shape.size()));
        continue;
      }
      const format::SafetensorsFile *f = &file;
      const format::StTensorInfo *ti = &info;
      if (expert >= 0) {
        if (!ggml_from_st(info.dtype) || info.shape.size() != 2) {
          cat.add_unmapped(fmt::format("{} (dtype {}, rank {}: experts must be 2-D F32/F16/BF16)", origin,
                                       format::st_dtype_name(info.dtype), info.shape.size()));
          continue;
        }
        if (!experts[g].emplace(expert, Part{f, ti}).second) fail(Status::format, "{}: expert {} appears twice", origin, expert);
        continue;
      }
      CatalogEntry e;
      e.origin = origin;
      for (size_t i = 0; i < info.shape.size(); ++i) e.ne[i] = static_cast<int64_t>(info.shape[info.shape.size() - 1 - i]);
      if (g.find("ffn_gate_tid2eid") != std::string::npos) {
        if (info.dtype != format::StDtype::i64 && info.dtype != format::StDtype::i32) {
          cat.add_unmapped(fmt::format("{} (dtype {}, expected I64/I32)", origin, format::st_dtype_name(info.dtype)));
          continue;
        }
        e.type = GgmlType::i32;
        const bool wide = info.dtype == format::StDtype::i64;
        e.read = [set, f, ti, wide, origin] {
          std::vector<uint8_t> raw = f->source().read_vector(ti->file_offset, static_cast<size_t>(ti->nbytes));
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
      } else {
        const auto t = ggml_from_st(info.dtype);
        if (!t) {
          cat.add_unmapped(fmt::format("{} (dtype {} is not supported; FP8/FP4-packed checkpoints are not yet)", origin,
                                       format::st_dtype_name(info.dtype)));
          continue;
        }
        e.type = *t;
        e.read = [set, f, ti] { return f->source().read_vector(ti->file_offset, static_cast<size_t>(ti->nbytes)); };
      }
      cat.add(g, std::move(e));
    }
  }
  for (auto &[g, parts] : experts) {
    const int64_t n = static_cast<int64_t>(parts.size());
    const Part first = parts.begin()->second;
    std::vector<Part> ordered;
    for (int64_t x = 0; x < n; ++x) {
      auto it = parts.find(x);
      if (it == parts.end()) fail(Status::format, "{}: {} has {} experts but expert {} is missing", path, g, n, x);
      if (it->second.info->dtype != first.info->dtype || it->second.info->shape != first.info->shape)
        fail(Status::format, "{}: expert {} of {} has dtype/shape {} {}x{}, expert 0 has {} {}x{}", path, x, g,
             format::st_dtype_name(it->second.info->dtype), it->second.info->shape[0], it->second.info->shape[1],
             format::st_dtype_name(first.info->dtype), first.info->shape[0], first.info->shape[1]);
      ordered.push_back(it->second);
    }
    CatalogEntry e;
    e.type = *ggml_from_st(first.info->dtype);
    e.ne = {static_cast<int64_t>(first.info->shape[1]), static_cast<int64_t>(first.info->shape[0]), n, 1};
    e.origin = fmt::format("{}: {} experts of {}", path, n, first.info->name);
    auto read_one = [set, ordered](int64_t x) {
      if (x < 0 || x >= static_cast<int64_t>(ordered.size()))
        fail(Status::invalid_argument, "expert {} outside 0..{}", x, ordered.size() - 1);
      const Part &p = ordered[static_cast<size_t>(x)];
      return p.file->source().read_vector(p.info->file_offset, static_cast<size_t>(p.info->nbytes));
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
    cat.add(g, std::move(e));
  }
  return cat;
}

}  // namespace ep::model
