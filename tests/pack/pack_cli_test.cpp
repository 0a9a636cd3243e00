// Runs the ep-pack executable: synth, build, validate (sampled and --full), inspect --json,
// gguf-info, and the exit codes and one-line errors of a corrupt pack.
#include "support/temp_dir.hpp"
#include "support/catch.hpp"

#include <array>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <sys/wait.h>

namespace {

struct Run {
  int code;
  std::string out;
};

Run run(const std::string &args) {
  const std::string cmd = std::string(EP_PACK_EXE) + " " + args + " 2>&1";
  FILE *p = ::popen(cmd.c_str(), "r");
  REQUIRE(p);
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace

TEST_CASE("ep-pack synth, build, validate, inspect and gguf-info", "[pack][cli]") {
  ep::test::TempDir dir;
  const std::string gguf = dir / "m.gguf";
  const std::string pack = dir / "m.epk";
  Run r = run("synth --arch kimi-k3 --layers 3 --experts 4 --embd 256 --ff 256 --type q4_K --shards 3 -o " + gguf);
  INFO(r.out);
  REQUIRE(r.code == 0);
  const std::string first = dir / "m-00001-of-00003.gguf";
  CHECK(r.out.find(first) != std::string::npos);

  r = run("gguf-info " + first);
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out.find("3 shard(s)") != std::string::npos);
  CHECK(r.out.find("blk.2.ffn_down_exps.weight") != std::string::npos);
  CHECK(r.out.find("kimi-k3.expert_count") != std::string::npos);

  r = run("build " + first + " -o " + pack + " --quiet");
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("2 layers x 4 experts") != std::string::npos);
  CHECK(r.out.find("MiB/s") != std::string::npos);

  r = run("validate " + pack);
  CHECK(r.code == 0);
  CHECK(r.out.find("OK (sampled") != std::string::npos);
  r = run("validate " + pack + " --full");
  CHECK(r.code == 0);
  CHECK(r.out.find("OK (full") != std::string::npos);

  r = run("inspect " + pack + " --json");
  REQUIRE(r.code == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j["alignment"] == 4096);
  CHECK(j["num_layers"] == 2);
  CHECK(j["num_experts"] == 4);
  CHECK(j["first_layer"] == 1);
  REQUIRE(j["objects"].size() == 8);
  const auto &o = j["objects"][5];
  CHECK(o["offset"] == j["data_start"].get<uint64_t>() + 5 * j["object_stride"].get<uint64_t>());
  CHECK(o["roles"][0]["ggml_type"] == "q4_K");
  CHECK(o["roles"][2]["source"]["tensor"] == "blk.2.ffn_down_exps.weight");
  CHECK(o["roles"][1]["source"]["nbytes"] == o["roles"][1]["nbytes"]);
  // The bytes at the JSON's absolute offsets are the source's bytes.
  const auto &role = o["roles"][1];
  CHECK(ep::test::read_range(pack, role["offset"], role["nbytes"]) ==
        ep::test::read_range(role["source"]["file"], role["source"]["offset"], role["source"]["nbytes"]));

  r = run("inspect " + pack);
  CHECK(r.code == 0);
  CHECK(r.out.find("object (layer 0, expert 0)") != std::string::npos);

  // A flipped payload byte: sampled validation may miss it, --full names it, exit code 1.
  auto bytes = ep::test::read_file(pack);
  const uint64_t off = role["offset"].get<uint64_t>() + 3;
  bytes[off] ^= 0x55;
  ep::test::write_file(pack, bytes);
  r = run("validate " + pack + " --full");
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK(r.out.find("EP_ERR_CORRUPT") != std::string::npos);
  CHECK(r.out.find("payload hash mismatch: layer 1 expert 1 up") != std::string::npos);
  bytes[0] = 'X';
  ep::test::write_file(pack, bytes);
  r = run("validate " + pack);
  CHECK(r.code == 1);
  CHECK(r.out.find("bad magic") != std::string::npos);

  r = run("frobnicate");
  CHECK(r.code == 2);
  r = run("build " + first);
  CHECK(r.code == 2);
  r = run("build " + (dir / "missing.gguf") + " -o " + pack);
  CHECK(r.code == 1);
  CHECK(r.out.find("source missing") != std::string::npos);
}

TEST_CASE("ep-pack build --stripe writes the objects over part files; validate reads them", "[pack][cli][stripe]") {
  ep::test::TempDir dir;
  const std::string gguf = dir / "m.gguf";
  Run r = run("synth --arch deepseek4 --layers 2 --experts 5 --embd 256 --ff 256 --type q4_K -o " + gguf);
  INFO(r.out);
  REQUIRE(r.code == 0);
  std::filesystem::create_directories(dir / "a");
  std::filesystem::create_directories(dir / "b");
  const std::string pack = dir / "m.epk";
  r = run("build " + gguf + " -o " + pack + " --quiet --stripe " + (dir / "a") + "," + (dir / "b"));
  INFO(r.out);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("part 0: " + (dir / "a") + "/m.epk.part0") != std::string::npos);
  CHECK(r.out.find("part 1: " + (dir / "b") + "/m.epk.part1") != std::string::npos);
  r = run("validate " + pack + " --full");
  INFO(r.out);
  CHECK(r.code == 0);
  // A missing part: the error names it.
  std::filesystem::remove(dir / "b/m.epk.part1");
  r = run("validate " + pack);
  CHECK(r.code != 0);
  CHECK(r.out.find("m.epk.part1") != std::string::npos);
  r = run("build " + gguf + " -o " + pack + " --stripe " + (dir / "a"));
  CHECK(r.code != 0);
  CHECK(r.out.find("at least two directories") != std::string::npos);
}
