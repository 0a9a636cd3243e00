// libFuzzer target: the pack manifest (<pack>.json, src/pack/manifest.*). Arbitrary text is
// parsed; a manifest that parses must survive to_json() → parse() unchanged, and is checked
// against a small pack built once (any mismatch must be a clean ep::Error: stale / corrupt).
// A crash, a sanitizer report, a failed round trip (__builtin_trap) or a huge allocation is a bug.
#include "core/error.hpp"
#include "format/pack_file.hpp"
#include "pack/builder.hpp"
#include "pack/manifest.hpp"
#include "testkit/checkpoint.hpp"

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

namespace {

// A real pack to check parsed manifests against (built once per process, in /tmp).
const ep::format::PackFile *reference_pack() {
  static std::unique_ptr<ep::format::PackFile> pack = [] {
    const std::string dir = "/tmp/ep-manifest-fuzz-" + std::to_string(::getpid());
    std::filesystem::create_directories(dir);
    ep::testkit::SyntheticSpec spec;
    spec.num_layers = 1;
    spec.num_experts = 2;
    spec.n_embd = 64;
    spec.n_ff = 32;
    const std::string src = ep::testkit::write_synthetic_gguf(spec, dir + "/src.gguf")[0];
    ep::pack::build_pack(std::vector<std::string>{src}, dir + "/p.epk");
    auto p = ep::format::PackFile::open(dir + "/p.epk", ep::format::ValidationLevel::structure);
    std::filesystem::remove_all(dir);  // the PackFile keeps its descriptor
    return p;
  }();
  return pack.get();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string text(reinterpret_cast<const char *>(data), size);
  ep::pack::Manifest m;
  try {
    m = ep::pack::Manifest::parse(text, "fuzz.json");
  } catch (const ep::Error &) {
    return 0;
  }
  // Round trip: what we write, we read back the same.
  const std::string once = m.to_json().dump();
  try {
    const ep::pack::Manifest again = ep::pack::Manifest::parse(once, "fuzz-again.json");
    if (again.to_json().dump() != once) __builtin_trap();
  } catch (const ep::Error &) {
    __builtin_trap();
  }
  try {
    ep::pack::check_manifest_matches(m, *reference_pack(), "fuzz.json");
  } catch (const ep::Error &e) {
    if (e.status() != ep::Status::stale && e.status() != ep::Status::corrupt) __builtin_trap();
  }
  return 0;
}
