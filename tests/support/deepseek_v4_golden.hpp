// Shared helpers of the DeepSeek-V4 tests (model, engine, store): the oracle goldens (tests/data/deepseek_v4),
// logit comparison, and the safetensors checkpoint rebuilt from a golden GGUF.
#pragma once

#include "support/catch.hpp"

#include "support/golden_common.hpp"
#include "backend/dequant.hpp"
#include "format/gguf.hpp"
#include "format/safetensors.hpp"
#include "model/deepseek_v4.hpp"
#include "model/weight_catalog.hpp"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace deepseek_v4test {

namespace fs = std::filesystem;
using nlohmann::json;
using ep::model::DeepseekV4Model;

inline const char *const kConfigs[] = {"deepseek_v4_a", "deepseek_v4_b"};

inline std::string data_dir() { return std::string(EP_TEST_DATA_DIR) + "/deepseek_v4"; }

using ep::test::compare;
using ep::test::Diff;
using ep::test::slurp;

struct Golden : ep::test::GoldenData {
  std::string name;
};

inline Golden load_golden(const std::string &name) {
  Golden g;
  static_cast<ep::test::GoldenData &>(g) = ep::test::load_golden_data(data_dir() + "/" + name, "tests/oracle/deepseek_v4.py");
  g.name = name;
  return g;
}


inline std::vector<float> run_full(DeepseekV4Model &m, const std::vector<int32_t> &tokens) {
  ep::model::DeepseekV4State st = m.new_state();
  std::vector<float> logits(tokens.size() * static_cast<size_t>(m.config().vocab));
  m.forward(tokens.data(), static_cast<int64_t>(tokens.size()), st, logits.data());
  CHECK(st.n_past == static_cast<int64_t>(tokens.size()));
  return logits;
}

inline fs::path scratch_dir(const std::string &tag) {
  static int counter = 0;
  fs::path p = fs::temp_directory_path() / ("ep_deepseek_v4_" + tag + "_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

/// Rebuilds the checkpoint transformers' save_pretrained() wrote (names, shapes, dtypes from the
/// oracle's manifest) from the GGUF, checks each tensor's fingerprint against the manifest, and
/// writes config.json + model.safetensors into @p dir. @p drop / @p extra edit the tensor list.
inline void write_checkpoint(const Golden &g, const fs::path &dir, const std::string &drop = "", const std::string &extra = "") {
  const ep::format::GgufFile gguf = ep::format::GgufFile::open(g.gguf);
  REQUIRE(g.meta.contains("saved_tensors"));
  std::vector<ep::format::StWriteTensor> infos;
  std::vector<std::vector<uint8_t>> data;
  for (const json &t : g.meta["saved_tensors"]) {
    const std::string name = t.at("name").get<std::string>();
    if (name == drop) continue;
    int64_t expert = -1;
    const std::string src = ep::model::deepseek_v4_gguf_name(name, &expert);
    INFO("checkpoint tensor " << name << " -> " << src);
    REQUIRE(!src.empty());
    const ep::format::GgufTensorInfo *info = gguf.find_tensor(src);
    REQUIRE(info != nullptr);
    std::vector<uint8_t> raw = gguf.source().read_vector(info->file_offset, static_cast<size_t>(info->nbytes));
    std::vector<uint64_t> shape;
    for (const auto &s : t.at("shape")) shape.push_back(s.get<uint64_t>());
    uint64_t n = 1;
    for (uint64_t s : shape) n *= s;
    const std::string dtype = t.at("dtype").get<std::string>();
    std::vector<uint8_t> bytes;
    std::vector<double> values;
    if (dtype == "int64") {
      REQUIRE(info->type == ep::format::GgmlType::i32);
      REQUIRE(raw.size() == n * 4);
      bytes.resize(n * 8);
      for (uint64_t i = 0; i < n; ++i) {
        int32_t v32;
        std::memcpy(&v32, raw.data() + 4 * i, 4);
        const int64_t v = v32;
        std::memcpy(bytes.data() + 8 * i, &v, 8);
        values.push_back(static_cast<double>(v));
      }
      infos.push_back({name, ep::format::StDtype::i64, shape});
    } else {
      REQUIRE(dtype == "float32");
      const uint64_t total = info->ne[0] * info->ne[1] * info->ne[2] * info->ne[3];
      std::vector<float> f(total);
      ep::backend::dequantize_row(info->type, raw.data(), f.data(), static_cast<int64_t>(total));
      uint64_t first = 0;
      if (expert >= 0) first = static_cast<uint64_t>(expert) * info->ne[0] * info->ne[1];
      REQUIRE(first + n <= total);
      bytes.resize(n * 4);
      std::memcpy(bytes.data(), f.data() + first, n * 4);
      for (uint64_t i = 0; i < n; ++i) values.push_back(f[first + i]);
      infos.push_back({name, ep::format::StDtype::f32, shape});
    }
    // fingerprint: (Σx, Σx·w_i) with w_i = (i mod 251 + 1) / 251, as the oracle computed it
    double s0 = 0, s1 = 0, sa = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      s0 += values[i];
      s1 += values[i] * (static_cast<double>(i % 251) + 1) / 251.0;
      sa += std::fabs(values[i]);
    }
    const double f0 = t.at("fp")[0].get<double>(), f1 = t.at("fp")[1].get<double>();
    CHECK(std::fabs(s0 - f0) <= 1e-9 * sa + 1e-12);
    CHECK(std::fabs(s1 - f1) <= 1e-9 * sa + 1e-12);
    data.push_back(std::move(bytes));
  }
  if (!extra.empty()) {
    infos.push_back({extra, ep::format::StDtype::f32, {4}});
    data.push_back(std::vector<uint8_t>(16, 0));
  }
  ep::format::write_safetensors((dir / "model.safetensors").string(), infos,
                                [&](size_t i, uint64_t off, std::span<uint8_t> out) {
                                  std::memcpy(out.data(), data[i].data() + off, out.size());
                                });
  std::ofstream(dir / "config.json") << g.meta.at("hf_config_json").dump(1);
}

}  // namespace deepseek_v4test
