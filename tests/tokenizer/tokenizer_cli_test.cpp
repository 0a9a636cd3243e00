// ep-tokenize end to end: JSON lines in and out, --decode, --add-special, --bench, errors.
#include "core/error.hpp"
#include "corpus_util.hpp"
#include "support/catch.hpp"
#include "tokenizer/tokenizer.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

using ep::tokenizer::Tokenizer;
using json = nlohmann::json;

namespace {

struct TempDir {
  std::filesystem::path path;
  TempDir() : path(std::filesystem::temp_directory_path() / ("ep_tokenize_cli_" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

int run(const std::string &args, const std::string &in, const std::string &out, const std::string &err) {
  const std::string cmd = std::string(EP_TOKENIZE_EXE) + " " + args + " < '" + in + "' > '" + out + "' 2> '" + err + "'";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string slurp(const std::string &p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("ep-tokenize encodes and decodes JSON lines like the library") {
  TempDir tmp;
  const std::string tok_path = ep_test::deepseek_tokenizer_path();
  REQUIRE(std::filesystem::exists(tok_path));
  const Tokenizer tok = Tokenizer::from_json_file(tok_path);
  const auto corpus = ep_test::read_corpus();
  const std::string in = (tmp.path / "in.jsonl").string();
  const std::string ids = (tmp.path / "ids.jsonl").string();
  const std::string back = (tmp.path / "back.jsonl").string();
  const std::string err = (tmp.path / "err.txt").string();
  {
    std::ofstream f(in, std::ios::binary);
    for (size_t i = 0; i < corpus.size(); i += 7) f << json{{"text", corpus[i]}}.dump() << '\n';
  }
  REQUIRE(run("--tokenizer '" + tok_path + "'", in, ids, err) == 0);
  REQUIRE(run("--tokenizer '" + tok_path + "' --decode", ids, back, err) == 0);
  const auto id_lines = ep_test::read_jsonl(ids);
  const auto back_lines = ep_test::read_jsonl(back);
  size_t n = 0, bad = 0;
  for (size_t i = 0; i < corpus.size(); i += 7, ++n) {
    REQUIRE(n < id_lines.size());
    if (id_lines[n].at("ids").get<std::vector<int32_t>>() != tok.encode(corpus[i])) ++bad;
    if (back_lines[n].at("text").get<std::string>() != corpus[i]) ++bad;
  }
  CHECK(n == id_lines.size());
  CHECK(bad == 0);

  // --add-special prepends BOS (tokenizer_config.json add_bos_token); nothing without it.
  {
    std::ofstream f(in, std::ios::binary);
    f << R"({"text": "hello"})" << '\n';
  }
  REQUIRE(run("--tokenizer '" + tok_path + "' --add-special", in, ids, err) == 0);
  const auto with_bos = ep_test::read_jsonl(ids).at(0).at("ids").get<std::vector<int32_t>>();
  REQUIRE(run("--tokenizer '" + tok_path + "'", in, ids, err) == 0);
  const auto plain = ep_test::read_jsonl(ids).at(0).at("ids").get<std::vector<int32_t>>();
  REQUIRE(with_bos.size() == plain.size() + 1);
  CHECK(with_bos[0] == 0);

  // Errors: a line that is not JSON names the line; exit status 1.
  {
    std::ofstream f(in, std::ios::binary);
    f << R"({"text": "ok"})" << '\n' << "not json\n";
  }
  CHECK(run("--tokenizer '" + tok_path + "'", in, ids, err) == 1);
  CHECK(slurp(err).find("line 2") != std::string::npos);
  CHECK(run("--tokenizer /nonexistent.json", in, ids, err) == 1);
  CHECK(slurp(err).find("EP_ERR_NOT_FOUND") != std::string::npos);

  // --bench prints a speed.
  REQUIRE(run("--tokenizer '" + tok_path + "' --bench '" + ep_test::corpus_path() + "' --seconds 0.2", in, ids, err) == 0);
  CHECK(slurp(ids).find("MB/s") != std::string::npos);
}
