// Shared helpers of the Kimi-Linear / Kimi-K3 tests (model, engine): the oracle goldens
// (tests/data/kimi_linear, tests/data/kimi_k3), logit comparison and a full pass.
#pragma once

#include "support/catch.hpp"

#include "support/golden_common.hpp"
#include "model/kimi.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace kimitest {

namespace fs = std::filesystem;
using nlohmann::json;
using ep::model::KimiModel;
using ep::model::KimiState;
using ep::test::compare;
using ep::test::Diff;
using ep::test::slurp;

struct Golden : ep::test::GoldenData {};

inline Golden load_golden(const std::string &name, const std::string &dir = "kimi_linear") {
  Golden g;
  static_cast<ep::test::GoldenData &>(g) = ep::test::load_golden_data(
      std::string(EP_TEST_DATA_DIR) + "/" + dir + "/" + name, "tests/oracle/kimi_linear.py / kimi_k3_ref.py");
  return g;
}


inline std::vector<float> run_full(KimiModel &m, const std::vector<int32_t> &tokens) {
  KimiState st = m.new_state();
  std::vector<float> logits(tokens.size() * static_cast<size_t>(m.config().vocab));
  m.forward(tokens.data(), static_cast<int64_t>(tokens.size()), st, logits.data());
  CHECK(st.n_past == static_cast<int64_t>(tokens.size()));
  return logits;
}


}  // namespace kimitest
