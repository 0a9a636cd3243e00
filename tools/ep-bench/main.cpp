// ep-bench: expert-delivery benchmarks.
//   ep-bench io  --pack PACK | --create-size 20G   [--json]
//   ep-bench h2d [--object-bytes N | --pack PACK]  [--json]
// Kernel benchmarks are a separate tool (ep-bench-kernels); `ep-bench kernels` points there.
#include "bench_common.hpp"

#include "core/error.hpp"

#include <cstdio>
#include <cstring>
#include <string>

namespace ep::bench {
int cmd_io(const Args &args);
int cmd_h2d(const Args &args);
}  // namespace ep::bench

namespace {

constexpr const char *kUsage =
    "usage: ep-bench <command> [options]\n"
    "  io   --pack PACK | --create-size SIZE [--create-path PATH] [--object-bytes N] [--experts N]\n"
    "       [--queue-depth 32] [--splits 1] [--seconds 10] [--rounds 2] [--backend auto|uring|pread] [--no-fio] [--json]\n"
    "       raw O_DIRECT read bandwidth at the object size (fio, else a pread loop) vs the engine's reader\n"
    "  h2d  [--object-bytes N | --pack PACK | --create-size SIZE] [--slots 64] [--staging 16] [--bytes 16G] [--json]\n"
    "       the store's staging -> VRAM copy path vs plain pinned cudaMemcpyAsync\n"
    "  kernels   (a separate tool: ep-bench-kernels)\n"
    "--json prints one JSON object with raw_gbps, engine_gbps and ratio.\n";

}  // namespace

int main(int argc, char **argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "io") return ep::bench::cmd_io(ep::bench::parse_args(argc, argv, 2, {"json", "no-fio"}));
    if (cmd == "h2d") return ep::bench::cmd_h2d(ep::bench::parse_args(argc, argv, 2, {"json"}));
    if (cmd == "kernels") {
      std::fprintf(stderr, "ep-bench: kernel benchmarks are the separate tool ep-bench-kernels\n");
      return 2;
    }
    std::fprintf(stderr, "ep-bench: unknown command '%s'\n%s", cmd.c_str(), kUsage);
    return 2;
  } catch (const ep::Error &e) {
    std::fprintf(stderr, "ep-bench %s: %s: %s\n", cmd.c_str(), ep::status_name(e.status()), e.what());
    return 1;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "ep-bench %s: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}
