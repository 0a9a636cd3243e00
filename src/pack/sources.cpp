#include "pack/sources.hpp"

#include "core/error.hpp"
#include "format/checkpoint_tensors.hpp"
#include "format/file_format.hpp"
#include "format/gguf.hpp"
#include "format/safetensors.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <optional>
#include <set>
#include <sstream>

namespace ep::pack {
namespace fs = std::filesystem;
using format::GgmlType;
using format::Role;

uint64_t ExpertPlan::payload_bytes() const {
  uint64_t n = 0;
  for (const ExpertSlice &s : slices) n += s.nbytes;
  return n;
}

namespace {

bool ends_with(std::string_view s, std::string_view t) { return s.size() >= t.size() && s.substr(s.size() - t.size()) == t; }

std::optional<uint32_t> parse_uint(std::string_view s) {
  if (s.empty() || s.size() > 9) return std::nullopt;
  uint32_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint32_t>(c - '0');
  }
  return v;
}

SourceFile fingerprint(const std::string &path, uint64_t header_bytes) {
  SourceFile f;
  f.path = fs::absolute(path).lexically_normal().string();
  std::error_code ec;
  f.size = fs::file_size(path, ec);
  if (ec) fail(Status::io, "stat {}: {}", path, ec.message());
  format::FileSource probe(path);
  f.mtime_ns = probe.mtime_ns();
  f.header_bytes = header_bytes;
  return f;
}

// --- GGUF -----------------------------------------------------------------------------------

// "blk.N.ffn_{gate,up,down}_exps.weight" -> (N, role)
std::optional<std::pair<uint32_t, Role>> parse_gguf_expert_name(std::string_view name) {
  if (name.substr(0, 4) != "blk.") return std::nullopt;
  const size_t dot = name.find('.', 4);
  if (dot == std::string_view::npos) return std::nullopt;
  auto layer = parse_uint(name.substr(4, dot - 4));
  if (!layer) return std::nullopt;
  const std::string_view rest = name.substr(dot + 1);
  if (rest == "ffn_gate_exps.weight") return std::make_pair(*layer, Role::gate);
  if (rest == "ffn_up_exps.weight") return std::make_pair(*layer, Role::up);
  if (rest == "ffn_down_exps.weight") return std::make_pair(*layer, Role::down);
  return std::nullopt;
}

ExpertPlan plan_gguf(const std::vector<std::string> &paths) {
  std::vector<format::GgufSet> sets;
  std::set<std::string> covered;
  for (const std::string &p : paths) {
    const std::string abs = fs::absolute(p).lexically_normal().string();
    if (covered.count(abs)) continue;
    sets.push_back(format::GgufSet::open(abs));
    for (const auto &shard : sets.back().shards()) covered.insert(fs::absolute(shard.path()).lexically_normal().string());
  }
  ExpertPlan plan;
  plan.source_format = "gguf";
  const format::GgufSet &main = sets.front();
  if (const format::GgufValue *a = main.find("general.architecture"); a && a->type == format::GgufType::string)
    plan.arch = a->s;
  std::map<std::pair<uint32_t, Role>, std::pair<const format::GgufFile *, const format::GgufTensorInfo *>> found;
  std::map<std::string, uint32_t> file_ids;
  for (const auto &set : sets) {
    for (const auto &shard : set.shards()) {
      file_ids.emplace(shard.path(), static_cast<uint32_t>(plan.files.size()));
      plan.files.push_back(fingerprint(shard.path(), shard.data_offset()));
      for (const auto &t : shard.tensors()) {
        if (auto key = parse_gguf_expert_name(t.name)) {
          if (!found.emplace(*key, std::make_pair(&shard, &t)).second)
            fail(Status::format, "{}: tensor '{}' appears in more than one source", shard.path(), t.name);
        }
      }
    }
  }
  if (found.empty())
    fail(Status::not_found, "{}: no routed expert tensors (blk.N.ffn_{{gate,up,down}}_exps.weight) in the GGUF source",
         main.first().path());
  plan.first_layer = found.begin()->first.first;
  const uint32_t last_layer = found.rbegin()->first.first;
  plan.num_layers = last_layer - plan.first_layer + 1;
  const auto &g0 = *found.begin()->second.second;
  if (g0.n_dims != 3)
    fail(Status::shape, "{}: shape mismatch: '{}' has {} dims, expected 3 {{in, out, n_expert}}",
         found.begin()->second.first->path(), g0.name, g0.n_dims);
  plan.num_experts = static_cast<uint32_t>(g0.ne[2]);
  if (!plan.arch.empty()) {
    if (const format::GgufValue *ec = main.find(plan.arch + ".expert_count")) {
      if (ec->as_uint(plan.arch + ".expert_count") != plan.num_experts)
        fail(Status::shape, "{}: shape mismatch: {}.expert_count is {} but '{}' has {} experts", main.first().path(),
             plan.arch, ec->to_string(), g0.name, plan.num_experts);
    }
    if (const format::GgufValue *k = main.find(plan.arch + ".expert_used_count"))
      plan.top_k = static_cast<uint32_t>(k->as_uint(plan.arch + ".expert_used_count"));
  }
  plan.slices.reserve(static_cast<size_t>(plan.num_layers) * plan.num_experts * 3);
  for (uint32_t l = plan.first_layer; l <= last_layer; ++l) {
    const format::GgufTensorInfo *t[3];
    const format::GgufFile *f[3];
    for (uint32_t r = 0; r < 3; ++r) {
      auto it = found.find({l, static_cast<Role>(r)});
      if (it == found.end())
        fail(Status::not_found, "{}: tensor 'blk.{}.ffn_{}_exps.weight' is missing (experts span layers {}..{})",
             main.first().path(), l, format::role_name(static_cast<Role>(r)), plan.first_layer, last_layer);
      f[r] = it->second.first;
      t[r] = it->second.second;
      if (t[r]->n_dims != 3 || t[r]->ne[2] != plan.num_experts)
        fail(Status::shape, "{}: shape mismatch: '{}' is [{}, {}, {}, {}], expected 3 dims with {} experts", f[r]->path(),
             t[r]->name, t[r]->ne[0], t[r]->ne[1], t[r]->ne[2], t[r]->ne[3], plan.num_experts);
    }
    // gate/up {in, ff, X}; down {ff, in, X}
    if (t[0]->ne[0] != t[1]->ne[0] || t[0]->ne[1] != t[1]->ne[1] || t[2]->ne[0] != t[0]->ne[1] ||
        t[2]->ne[1] != t[0]->ne[0])
      fail(Status::shape, "{}: shape mismatch in layer {}: gate [{}, {}], up [{}, {}], down [{}, {}] (expected down = "
           "transposed gate)", f[0]->path(), l, t[0]->ne[0], t[0]->ne[1], t[1]->ne[0], t[1]->ne[1], t[2]->ne[0], t[2]->ne[1]);
    for (uint32_t e = 0; e < plan.num_experts; ++e) {
      for (uint32_t r = 0; r < 3; ++r) {
        ExpertSlice s;
        s.file = file_ids.at(f[r]->path());
        s.tensor = t[r]->name;
        s.nbytes = t[r]->nbytes / plan.num_experts;
        s.source_nbytes = s.nbytes;
        s.offset = t[r]->file_offset + static_cast<uint64_t>(e) * s.nbytes;
        s.type = t[r]->type;
        s.n_dims = 2;
        s.ne = {t[r]->ne[0], t[r]->ne[1], 1, 1};
        plan.slices.push_back(std::move(s));
      }
    }
  }
  return plan;
}

// --- safetensors ----------------------------------------------------------------------------

struct StExpertName {
  uint32_t layer;
  bool fused;            // gate_up_proj / down_proj stacked over experts
  uint32_t expert;       // per-expert names only
  int role;              // 0 gate, 1 up, 2 down; fused gate_up = 3
};

// "...layers.N.<...>experts.gate_up_proj" / "...experts.down_proj" (optionally ".weight"),
// "...layers.N.<...>experts.E.{gate_proj,up_proj,down_proj,w1,w3,w2}.weight"
std::optional<StExpertName> parse_st_expert_name(std::string_view name) {
  const size_t lp = name.find("layers.");
  if (lp == std::string_view::npos || (lp > 0 && name[lp - 1] != '.')) return std::nullopt;
  const size_t ldot = name.find('.', lp + 7);
  if (ldot == std::string_view::npos) return std::nullopt;
  auto layer = parse_uint(name.substr(lp + 7, ldot - lp - 7));
  if (!layer) return std::nullopt;
  const size_t xp = name.find(".experts.", ldot);
  if (xp == std::string_view::npos) return std::nullopt;
  std::string_view rest = name.substr(xp + 9);
  if (ends_with(rest, ".weight") && (rest.find('.') == rest.size() - 7)) {
    // fused with a .weight suffix
    const std::string_view base = rest.substr(0, rest.size() - 7);
    if (base == "gate_up_proj") return StExpertName{*layer, true, 0, 3};
    if (base == "down_proj") return StExpertName{*layer, true, 0, 2};
  }
  if (rest == "gate_up_proj") return StExpertName{*layer, true, 0, 3};
  if (rest == "down_proj") return StExpertName{*layer, true, 0, 2};
  const size_t edot = rest.find('.');
  if (edot == std::string_view::npos) return std::nullopt;
  auto expert = parse_uint(rest.substr(0, edot));
  if (!expert) return std::nullopt;
  const std::string_view tail = rest.substr(edot + 1);
  int role = -1;
  if (tail == "gate_proj.weight" || tail == "w1.weight") role = 0;
  if (tail == "up_proj.weight" || tail == "w3.weight") role = 1;
  if (tail == "down_proj.weight" || tail == "w2.weight") role = 2;
  if (role < 0) return std::nullopt;
  return StExpertName{*layer, false, *expert, role};
}

ExpertPlan plan_safetensors(const std::vector<std::string> &paths) {
  std::vector<format::SafetensorsSet> sets;
  for (const std::string &p : paths) sets.push_back(format::SafetensorsSet::open(p));
  ExpertPlan plan;
  plan.source_format = "safetensors";
  std::map<std::string, uint32_t> file_ids;
  // config.json beside the weights: model type, top-k and the FP8 block size.
  const fs::path config = fs::path(sets.front().files().front().path()).parent_path() / "config.json";
  format::CheckpointQuant quant;
  nlohmann::json cfg;
  if (fs::exists(config)) {
    std::ifstream in(config);
    std::stringstream ss;
    ss << in.rdbuf();
    cfg = nlohmann::json::parse(ss.str(), nullptr, false);
    if (cfg.is_object()) quant = format::CheckpointQuant::from_config_json(ss.str(), config.string());
  }
  using Found = format::StLogical;
  std::map<std::tuple<uint32_t, uint32_t, int>, Found> per_expert;  // (layer, expert, role)
  std::map<std::pair<uint32_t, int>, Found> fused;                  // (layer, 3 gate_up | 2 down)
  for (const auto &set : sets) {
    for (const auto &file : set.files()) {
      if (file_ids.count(file.path())) continue;
      file_ids.emplace(file.path(), static_cast<uint32_t>(plan.files.size()));
      plan.files.push_back(fingerprint(file.path(), file.header_bytes()));
    }
    // MTP layers and vision towers are not run, and their experts not packed
    const format::StResolved r = format::resolve_checkpoint_tensors(
        set, quant, {"mtp.", "model.mtp.", "vision_tower.", "language_model.vision_tower.", "mm_projector.", "multi_modal_projector."});
    for (const std::string &why : r.rejected)
      if (why.find(".experts.") != std::string::npos)
        fail(Status::unsupported, "unsupported dtype: a routed expert tensor cannot be packed: {}", why);
    for (const Found &t : r.tensors) {
      auto n = parse_st_expert_name(t.name);
      if (!n) continue;
      if (n->fused) fused[{n->layer, n->role}] = t;
      else per_expert[{n->layer, n->expert, n->role}] = t;
    }
  }
  if (fused.empty() && per_expert.empty())
    fail(Status::not_found, "{}: no routed expert tensors (mlp.experts.gate_up_proj/down_proj or "
         "experts.N.{{gate,up,down}}_proj.weight / w1,w2,w3) in the safetensors source", paths.front());
  if (!fused.empty() && !per_expert.empty())
    fail(Status::format, "{}: the checkpoint mixes fused and per-expert expert tensors", paths.front());
  auto type_of = [&](const Found &f) {
    if (f.encoding == format::StEncoding::fp8_block || f.type == GgmlType::i8 || f.type == GgmlType::i16 ||
        f.type == GgmlType::i32 || f.type == GgmlType::i64 || f.type == GgmlType::f64)
      fail(Status::unsupported, "unsupported dtype: {} cannot be a packed expert (the pack stores float, FP4 (as MXFP4) or "
           "ggml-quantized experts; FP8 experts are not packed)", f.origin);
    return f.type;
  };
  auto shape_error = [&](const Found &f, std::string_view expected) {
    std::string s;
    for (uint64_t d : f.shape) s += (s.empty() ? "" : ", ") + std::to_string(d);
    fail(Status::shape, "shape mismatch: {} is [{}], expected {}", f.origin, s, expected);
  };
  // One role of one expert: its payload bytes and where they come from.
  auto slice_of = [&](const Found &f, uint64_t ne0, uint64_t ne1) {
    ExpertSlice s;
    s.file = file_ids.at(f.file->path());
    s.tensor = f.data->name;
    s.offset = f.data->file_offset;
    s.type = type_of(f);
    s.ne = {ne0, ne1, 1, 1};
    if (f.encoding == format::StEncoding::fp4_e8m0) {
      s.layout = format::SourceLayout::fp4_e8m0;
      s.scale_file = file_ids.at(f.scale_file->path());
      s.nbytes = f.nbytes();
      s.source_nbytes = f.data->nbytes;
      s.scale_tensor = f.scale->name;
      s.scale_offset = f.scale->file_offset;
      s.scale_nbytes = f.scale->nbytes;
    } else {
      s.nbytes = f.data->nbytes;
      s.source_nbytes = s.nbytes;
    }
    return s;
  };
  if (!fused.empty()) {
    plan.first_layer = fused.begin()->first.first;
    const uint32_t last = fused.rbegin()->first.first;
    plan.num_layers = last - plan.first_layer + 1;
    for (uint32_t l = plan.first_layer; l <= last; ++l) {
      auto gu = fused.find({l, 3}), dn = fused.find({l, 2});
      if (gu == fused.end() || dn == fused.end())
        fail(Status::not_found, "{}: layer {} lacks mlp.experts.{} (experts span layers {}..{})", paths.front(), l,
             gu == fused.end() ? "gate_up_proj" : "down_proj", plan.first_layer, last);
      if (gu->second.encoding != format::StEncoding::plain || dn->second.encoding != format::StEncoding::plain)
        fail(Status::unsupported, "{}: fused expert tensors must be plain float tensors", gu->second.origin);
      const auto &gs = gu->second.shape, &ds = dn->second.shape;
      if (gs.size() != 3 || gs[1] % 2 != 0) shape_error(gu->second, "[E, 2F, D]");
      const uint64_t E = gs[0], F = gs[1] / 2, D = gs[2];
      if (ds.size() != 3 || ds[0] != E || ds[1] != D || ds[2] != F)
        shape_error(dn->second, fmt::format("[{}, {}, {}] (E, D, F from gate_up_proj)", E, D, F));
      if (l == plan.first_layer) plan.num_experts = static_cast<uint32_t>(E);
      if (E != plan.num_experts) shape_error(gu->second, fmt::format("{} experts like layer {}", plan.num_experts, plan.first_layer));
      const GgmlType gt = type_of(gu->second), dt = type_of(dn->second);
      const uint64_t es_g = format::st_dtype_size(gu->second.data->dtype), es_d = format::st_dtype_size(dn->second.data->dtype);
      for (uint32_t e = 0; e < E; ++e) {
        const uint64_t half = F * D * es_g;
        const uint64_t base = gu->second.data->file_offset + e * 2 * half;
        for (int r = 0; r < 2; ++r) {
          ExpertSlice s;
          s.file = file_ids.at(gu->second.file->path());
          s.tensor = gu->second.data->name;
          s.offset = base + static_cast<uint64_t>(r) * half;  // rows [0, F) are gate, [F, 2F) up
          s.nbytes = half;
          s.source_nbytes = half;
          s.type = gt;
          s.ne = {D, F, 1, 1};
          plan.slices.push_back(std::move(s));
        }
        ExpertSlice d;
        d.file = file_ids.at(dn->second.file->path());
        d.tensor = dn->second.data->name;
        d.nbytes = D * F * es_d;
        d.source_nbytes = d.nbytes;
        d.offset = dn->second.data->file_offset + e * d.nbytes;
        d.type = dt;
        d.ne = {F, D, 1, 1};
        plan.slices.push_back(std::move(d));
      }
    }
  } else {
    std::set<uint32_t> layers;
    std::map<uint32_t, uint32_t> experts_per_layer;
    for (const auto &[key, f] : per_expert) {
      layers.insert(std::get<0>(key));
      experts_per_layer[std::get<0>(key)] = std::max(experts_per_layer[std::get<0>(key)], std::get<1>(key) + 1);
    }
    plan.first_layer = *layers.begin();
    const uint32_t last = *layers.rbegin();
    plan.num_layers = last - plan.first_layer + 1;
    plan.num_experts = experts_per_layer[plan.first_layer];
    for (uint32_t l = plan.first_layer; l <= last; ++l) {
      for (uint32_t e = 0; e < plan.num_experts; ++e) {
        const Found *f[3];
        for (int r = 0; r < 3; ++r) {
          auto it = per_expert.find({l, e, r});
          if (it == per_expert.end())
            fail(Status::not_found, "{}: layer {} expert {} has no {} tensor ({} experts per layer, layers {}..{})",
                 paths.front(), l, e, format::role_name(static_cast<Role>(r)), plan.num_experts, plan.first_layer, last);
          f[r] = &it->second;
        }
        if (experts_per_layer[l] != plan.num_experts)
          fail(Status::shape, "{}: shape mismatch: layer {} has {} experts, layer {} has {}", paths.front(), l,
               experts_per_layer[l], plan.first_layer, plan.num_experts);
        const auto &gs = f[0]->shape;
        if (gs.size() != 2) shape_error(*f[0], "[F, D]");
        const uint64_t F = gs[0], D = gs[1];
        if (f[1]->shape != gs) shape_error(*f[1], fmt::format("[{}, {}] like the gate", F, D));
        if (f[2]->shape != std::vector<uint64_t>{D, F}) shape_error(*f[2], fmt::format("[{}, {}]", D, F));
        for (int r = 0; r < 3; ++r) plan.slices.push_back(r == 2 ? slice_of(*f[r], F, D) : slice_of(*f[r], D, F));
      }
    }
  }
  for (const auto &set : sets) {
    for (const auto &file : set.files()) {
      auto it = file.metadata().find("architecture");
      if (it != file.metadata().end() && plan.arch.empty()) plan.arch = it->second;
    }
  }
  if (cfg.is_object()) {
    const nlohmann::json &tc = cfg.contains("text_config") && cfg["text_config"].is_object() ? cfg["text_config"] : cfg;
    if (plan.arch.empty() && cfg.contains("model_type") && cfg["model_type"].is_string()) plan.arch = cfg["model_type"];
    for (const char *k : {"num_experts_per_tok", "num_experts_per_token"})
      if (tc.contains(k) && tc[k].is_number_unsigned()) plan.top_k = tc[k].get<uint32_t>();
  }
  return plan;
}

/// The GGUF files of a directory, recognised by their bytes, in name order (a split set's shards
/// sort in order; each shard then finds the others).
std::vector<std::string> gguf_files_in(const std::string &dir) {
  std::vector<std::string> files;
  for (const auto &e : fs::directory_iterator(dir)) {
    std::error_code ec;
    if (e.is_regular_file(ec) && format::probe_file_format(e.path().string()) == format::FileFormat::gguf)
      files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

ExpertPlan plan_sources(const std::vector<std::string> &sources) {
  if (sources.empty()) fail(Status::invalid_argument, "no source files given");
  std::vector<std::string> gguf, st;
  for (const std::string &s : sources) {
    using format::FileFormat;
    std::error_code ec;
    if (!fs::exists(s, ec)) fail(Status::not_found, "{}: source missing", s);
    switch (const FileFormat kind = format::detect_file_format(s)) {
      case FileFormat::gguf: gguf.push_back(s); break;
      case FileFormat::safetensors:
      case FileFormat::safetensors_index: st.push_back(s); break;
      case FileFormat::hf_config: st.push_back(format::checkpoint_dir_of(s, kind)); break;
      case FileFormat::checkpoint_dir:
      case FileFormat::directory: {
        // A directory of GGUF files (any names: split sets, Ollama blobs) or a safetensors checkpoint.
        const std::vector<std::string> files = gguf_files_in(s);
        if (files.empty()) st.push_back(s);
        gguf.insert(gguf.end(), files.begin(), files.end());
        break;
      }
      default:
        fail(Status::invalid_argument, "{}: a {}, not a model source (GGUF or safetensors)", s,
             format::file_format_name(kind));
    }
  }
  if (!gguf.empty() && !st.empty())
    fail(Status::unsupported, "{} and {}: a pack is built from GGUF or from safetensors sources, not both", gguf.front(),
         st.front());
  ExpertPlan plan = gguf.empty() ? plan_safetensors(st) : plan_gguf(gguf);
  const uint64_t want = static_cast<uint64_t>(plan.num_layers) * plan.num_experts * 3;
  if (plan.num_experts == 0 || plan.slices.size() != want)
    fail(Status::internal, "planned {} slices for {} layers x {} experts", plan.slices.size(), plan.num_layers,
         plan.num_experts);
  return plan;
}

}  // namespace ep::pack
