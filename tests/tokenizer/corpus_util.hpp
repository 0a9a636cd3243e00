// Shared helpers of the tokenizer corpus and golden tests.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace ep_test {

/// The DeepSeek-V3 tokenizer.json, unpacked by the build from tests/data/tokenizer/deepseek-v3/
/// (its tokenizer_config.json beside it).
inline std::string deepseek_tokenizer_path() {
  return std::string(EP_TEST_BUILD_DATA_DIR) + "/tokenizer/deepseek-v3/tokenizer.json";
}
inline std::string corpus_path() { return std::string(EP_TEST_DATA_DIR) + "/tokenizer/corpus.jsonl"; }
inline std::string goldens_path() { return std::string(EP_TEST_DATA_DIR) + "/tokenizer/deepseek_v3_goldens.jsonl"; }

/// Every line of a JSON-lines file, parsed. Throws when the file is missing or a line is bad.
inline std::vector<nlohmann::json> read_jsonl(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::vector<nlohmann::json> out;
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) throw std::runtime_error(path + ": line " + std::to_string(n) + " is not JSON");
    out.push_back(std::move(j));
  }
  return out;
}

inline std::vector<std::string> read_corpus() {
  std::vector<std::string> texts;
  for (const auto &j : read_jsonl(corpus_path())) texts.push_back(j.at("text").get<std::string>());
  return texts;
}

}  // namespace ep_test
