#include "format/checkpoint_tensors.hpp"

#include "core/error.hpp"
#include "format/microscale.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

namespace ep::format {

std::optional<GgmlType> ggml_type_of(StDtype d) noexcept {
  switch (d) {
    case StDtype::f32: return GgmlType::f32;
    case StDtype::f16: return GgmlType::f16;
    case StDtype::bf16: return GgmlType::bf16;
    case StDtype::f64: return GgmlType::f64;
    case StDtype::i8: return GgmlType::i8;
    case StDtype::i16: return GgmlType::i16;
    case StDtype::i32: return GgmlType::i32;
    case StDtype::i64: return GgmlType::i64;
    default: return std::nullopt;
  }
}

CheckpointQuant CheckpointQuant::from_config_json(const std::string &text, const std::string &source) {
  CheckpointQuant q;
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) fail(Status::format, "{}: not a JSON object", source);
  const nlohmann::json *qc = nullptr;
  if (j.contains("quantization_config") && j["quantization_config"].is_object()) qc = &j["quantization_config"];
  else if (j.contains("text_config") && j["text_config"].is_object() && j["text_config"].contains("quantization_config") &&
           j["text_config"]["quantization_config"].is_object())
    qc = &j["text_config"]["quantization_config"];
  if (!qc) return q;
  if (qc->contains("fmt") && (*qc)["fmt"] != "e4m3")
    fail(Status::unsupported, "{}: quantization_config.fmt is {}, only e4m3 FP8 is read", source, (*qc)["fmt"].dump());
  if (qc->contains("scale_fmt") && (*qc)["scale_fmt"] != "ue8m0")
    fail(Status::unsupported, "{}: quantization_config.scale_fmt is {}, only ue8m0 block scales are read", source,
         (*qc)["scale_fmt"].dump());
  if (qc->contains("weight_block_size")) {
    const nlohmann::json &b = (*qc)["weight_block_size"];
    if (!b.is_array() || b.size() != 2 || !b[0].is_number_unsigned() || !b[1].is_number_unsigned() || b[0] == 0 || b[1] == 0)
      fail(Status::format, "{}: quantization_config.weight_block_size is {}, expected [rows, columns]", source, b.dump());
    q.fp8_block_rows = b[0].get<uint64_t>();
    q.fp8_block_cols = b[1].get<uint64_t>();
  }
  return q;
}

namespace {

std::string shape_str(const std::vector<uint64_t> &s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

bool ends_with(const std::string &s, const std::string &t) { return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0; }

std::string where(const SafetensorsFile &f, const StTensorInfo &t) {
  return fmt::format("{}: tensor '{}' ({} {} at offset {})", f.path(), t.name, st_dtype_name(t.dtype), shape_str(t.shape), t.file_offset);
}

}  // namespace

std::string fp4_scale_tensor_name(const std::string &n) {
  if (ends_with(n, ".weight_packed")) return n.substr(0, n.size() - 14) + ".weight_scale";
  if (ends_with(n, ".weight")) return n.substr(0, n.size() - 7) + ".scale";
  return "";
}

namespace {

/// The shard that the checkpoint index beside @p shard lists for tensor @p name, as a path; ""
/// when there is no index or it does not list the tensor.
std::string indexed_shard_of(const std::string &shard, const std::string &name) {
  namespace fs = std::filesystem;
  const fs::path index = fs::path(shard).parent_path() / "model.safetensors.index.json";
  std::error_code ec;
  if (!fs::is_regular_file(index, ec)) return "";
  std::ifstream in(index, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const auto map = SafetensorsSet::parse_index(ss.str(), index.string());
  const auto it = map.find(name);
  return it == map.end() ? std::string() : (index.parent_path() / it->second).string();
}

}  // namespace

std::optional<Fp4ScaleLocation> find_fp4_scale(std::vector<const SafetensorsFile *> &files, size_t own, const std::string &data_name,
                                               const OpenShard &open_shard) {
  const std::string name = fp4_scale_tensor_name(data_name);
  if (name.empty() || own >= files.size()) return std::nullopt;
  if (const StTensorInfo *t = files[own]->find(name)) return Fp4ScaleLocation{own, t};
  for (size_t f = 0; f < files.size(); ++f)
    if (f != own)
      if (const StTensorInfo *t = files[f]->find(name)) return Fp4ScaleLocation{f, t};
  const std::string shard = indexed_shard_of(files[own]->path(), name);
  if (shard.empty() || std::any_of(files.begin(), files.end(), [&](const SafetensorsFile *f) { return f->path() == shard; }))
    return std::nullopt;
  files.push_back(open_shard(shard));
  if (const StTensorInfo *t = files.back()->find(name)) return Fp4ScaleLocation{files.size() - 1, t};
  return std::nullopt;
}

uint64_t StLogical::nbytes() const {
  if (encoding == StEncoding::fp4_e8m0) return mxfp4_bytes(shape[0], shape[1]);
  if (encoding == StEncoding::fp8_block) return shape[0] * shape[1] * (type == GgmlType::bf16 ? 2 : 4);
  return data->nbytes;
}

std::vector<uint8_t> StLogical::read() const {
  std::vector<uint8_t> raw = file->source().read_vector(data->file_offset, static_cast<size_t>(data->nbytes));
  if (encoding == StEncoding::plain) return raw;
  const std::vector<uint8_t> sc = scale_file->source().read_vector(scale->file_offset, static_cast<size_t>(scale->nbytes));
  const std::string what = fmt::format("{} with scales {}", where(*file, *data), where(*scale_file, *scale));
  if (encoding == StEncoding::fp4_e8m0) {
    std::vector<uint8_t> out(static_cast<size_t>(mxfp4_bytes(shape[0], shape[1])));
    fp4_e8m0_to_mxfp4(raw.data(), sc.data(), shape[0], shape[1], out.data(), what);
    return out;
  }
  return fp8_block_dequant(raw.data(), sc.data(), scale->dtype == StDtype::f32 ? ScaleType::f32 : ScaleType::e8m0, shape[0], shape[1],
                           block_rows, block_cols, type, what);
}

StResolved resolve_checkpoint_tensors(const SafetensorsSet &set, const CheckpointQuant &quant,
                                      const std::vector<std::string> &skip_prefixes) {
  struct At {
    const SafetensorsFile *file;
    const StTensorInfo *info;
  };
  std::map<std::string, At> all;
  for (const SafetensorsFile &f : set.files())
    for (const StTensorInfo &t : f.tensors()) {
      bool skip = false;
      for (const std::string &p : skip_prefixes) skip = skip || t.name.rfind(p, 0) == 0;
      if (!skip && !all.emplace(t.name, At{&f, &t}).second)
        fail(Status::format, "{}: tensor '{}' appears in two files ({} and {})", f.path(), t.name, all[t.name].file->path(), f.path());
    }
  StResolved out;
  auto find = [&](const std::string &n) -> const At * {
    auto it = all.find(n);
    return it == all.end() ? nullptr : &it->second;
  };
  auto reject = [&](const At &a, const std::string &why) { out.rejected.push_back(fmt::format("{} ({})", where(*a.file, *a.info), why)); };
  for (const auto &[name, at] : all) {
    const StTensorInfo &t = *at.info;
    const std::string stem_of_scale = ends_with(name, ".weight_scale") ? name.substr(0, name.size() - 13)
                                      : ends_with(name, ".weight_shape") ? name.substr(0, name.size() - 13)
                                      : ends_with(name, ".scale")        ? name.substr(0, name.size() - 6)
                                                                         : std::string();
    if (!stem_of_scale.empty()) {
      // A companion: consumed by its weight, an error without one.
      const bool ct = !ends_with(name, ".scale");
      if (!find(stem_of_scale + (ct ? ".weight_packed" : ".weight")))
        reject(at, fmt::format("a scale tensor without its weight {}{}", stem_of_scale, ct ? ".weight_packed" : ".weight"));
      continue;
    }
    StLogical l;
    l.file = at.file;
    l.data = at.info;
    l.origin = where(*at.file, t);
    const bool packed = ends_with(name, ".weight_packed");
    const std::string stem = packed ? name.substr(0, name.size() - 14) : ends_with(name, ".weight") ? name.substr(0, name.size() - 7) : "";
    const At *sc = stem.empty() ? nullptr : find(stem + (packed ? ".weight_scale" : ".scale"));
    l.name = packed ? stem + ".weight" : name;
    if (packed && !sc) {
      reject(at, fmt::format("packed FP4 without its scale tensor {}.weight_scale", stem));
      continue;
    }
    if (!sc) {
      // an 8-bit integer weight is packed FP4 that lost its scales, never a weight of its own
      const bool int8_weight = !stem.empty() && (t.dtype == StDtype::i8 || t.dtype == StDtype::u8);
      const auto type = int8_weight ? std::nullopt : ggml_type_of(t.dtype);
      if (!type) {
        reject(at, t.dtype == StDtype::f8_e4m3 ? fmt::format("FP8 without its block scale tensor {}.scale", stem.empty() ? name : stem)
                   : t.dtype == StDtype::i8 || t.dtype == StDtype::u8
                       ? fmt::format("dtype {} without a scale tensor (packed FP4 needs {}.scale)", st_dtype_name(t.dtype), stem)
                       : fmt::format("dtype {} is not read", st_dtype_name(t.dtype)));
        continue;
      }
      l.type = *type;
      l.shape = t.shape;
      out.tensors.push_back(std::move(l));
      continue;
    }
    const StTensorInfo &s = *sc->info;
    l.scale_file = sc->file;
    l.scale = sc->info;
    l.origin += fmt::format(" with scales {}", where(*sc->file, s));
    const std::string pair = fmt::format("{} with scales {}", where(*at.file, t), where(*sc->file, s));
    if (t.shape.size() != 2 || s.shape.size() != 2) {
      out.rejected.push_back(fmt::format("{} (a block-scaled weight and its scales must be 2-D)", pair));
      continue;
    }
    const uint64_t rows = t.shape[0];
    if (t.dtype == StDtype::f8_e4m3) {
      if (s.dtype != StDtype::f8_e8m0 && s.dtype != StDtype::f32) {
        out.rejected.push_back(fmt::format("{} (FP8 block scales must be F8_E8M0 or F32)", pair));
        continue;
      }
      const uint64_t cols = t.shape[1], br = quant.fp8_block_rows, bc = quant.fp8_block_cols;
      const std::vector<uint64_t> want = {(rows + br - 1) / br, (cols + bc - 1) / bc};
      if (s.shape != want) {
        out.rejected.push_back(fmt::format("{} (the scale shape does not match: {} blocks of {}x{} need scales {})", pair,
                                           shape_str(t.shape), br, bc, shape_str(want)));
        continue;
      }
      l.encoding = StEncoding::fp8_block;
      l.block_rows = br;
      l.block_cols = bc;
      l.shape = t.shape;
      const std::vector<uint8_t> scales = sc->file->source().read_vector(s.file_offset, static_cast<size_t>(s.nbytes));
      l.type = fp8_block_type(scales.data(), want[0] * want[1], s.dtype == StDtype::f32 ? ScaleType::f32 : ScaleType::e8m0);
      out.tensors.push_back(std::move(l));
      continue;
    }
    if ((packed && t.dtype != StDtype::u8) || (!packed && t.dtype != StDtype::i8 && t.dtype != StDtype::u8)) {
      out.rejected.push_back(fmt::format("{} (a weight with a scale tensor must be F8_E4M3, or packed FP4 in {})", pair,
                                         packed ? "U8" : "I8 / U8"));
      continue;
    }
    if (s.dtype != StDtype::f8_e8m0 && s.dtype != StDtype::u8) {
      out.rejected.push_back(fmt::format("{} (FP4 scales must be E8M0: F8_E8M0 or U8)", pair));
      continue;
    }
    const uint64_t cols = t.shape[1] * 2;
    if (cols % 32 != 0 || s.shape != std::vector<uint64_t>{rows, cols / 32}) {
      out.rejected.push_back(fmt::format("{} (the scale shape does not match: {} FP4 values need {} E8M0 scales, one per 32)",
                                         pair, shape_str({rows, cols}), shape_str({rows, cols / 32})));
      continue;
    }
    if (packed) {
      if (const At *ws = find(stem + ".weight_shape")) {
        const StTensorInfo &w = *ws->info;
        bool ok = (w.dtype == StDtype::i64 || w.dtype == StDtype::i32) && w.shape == std::vector<uint64_t>{2};
        if (ok) {
          const std::vector<uint8_t> b = ws->file->source().read_vector(w.file_offset, static_cast<size_t>(w.nbytes));
          int64_t v[2];
          for (int i = 0; i < 2; ++i) {
            if (w.dtype == StDtype::i64) {
              std::memcpy(&v[i], b.data() + 8 * i, 8);
            } else {
              int32_t x;
              std::memcpy(&x, b.data() + 4 * i, 4);
              v[i] = x;
            }
          }
          ok = v[0] == static_cast<int64_t>(rows) && v[1] == static_cast<int64_t>(cols);
        }
        if (!ok) {
          reject(*ws, fmt::format("does not say the shape {} of {}", shape_str({rows, cols}), name));
          continue;
        }
      }
    }
    l.encoding = StEncoding::fp4_e8m0;
    l.type = GgmlType::mxfp4;
    l.shape = {rows, cols};
    out.tensors.push_back(std::move(l));
  }
  return out;
}

}  // namespace ep::format
