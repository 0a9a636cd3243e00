// ep-bench: expert-delivery benchmarks.
//   ep-bench io  --pack PACK | --create-size 20G   [--json]
//   ep-bench h2d [--object-bytes N | --pack PACK]  [--json]
//   ep-bench kernels [--kernels auto,mma,...] [--types q2_K,...] [--batch 8] [--json]   (CUDA builds)
//   ep-bench compute --model F.gguf [--prompt-tokens 512] [--gen-tokens 128] [--reps 3] [--ds4-bench PATH] [--json OUT]
#include "bench_common.hpp"

#include "core/error.hpp"

#include <cstdio>
#include <cstring>
#include <string>

namespace ep::bench {
int cmd_io(const Args &args);
int cmd_h2d(const Args &args);
int cmd_kernels(const Args &args);
int cmd_e2e(const Args &args);
int cmd_compute(const Args &args);
}  // namespace ep::bench

namespace {

constexpr const char *kUsage =
    "usage: ep-bench <command> [options]\n"
    "  io   --pack PACK | --create-size SIZE [--create-path PATH] [--object-bytes N] [--experts N]\n"
    "       [--queue-depth 32] [--splits 1] [--seconds 10] [--rounds 2] [--backend auto|uring|pread] [--no-fio] [--json]\n"
    "       raw O_DIRECT read bandwidth at the object size (fio, else a pread loop) vs the engine's reader\n"
    "  h2d  [--object-bytes N | --pack PACK | --create-size SIZE] [--slots 64] [--staging 16] [--bytes 16G] [--json]\n"
    "       the store's staging -> VRAM copy path vs plain pinned cudaMemcpyAsync\n"
    "  kernels [--kernels auto|generic|pipe|mma|dp4a|stream|rows,...] [--types mxfp4,q2_K,...,q8_0,f16,bf16,f32] [--batch 8 | --batch 12,6,32,16]\n"
    "       [--gemv-tokens 1 | --gemv-tokens 1,2,4,8,16,32] [--pool-mib 1024] [--passes 10] [--tokens 512] [--no-gemm] [--no-batch1] [--gemm-mode split,exact,bf16] [--graph] [--ffn | --ffn-only] [--json]\n"
    "       HBM copy bandwidth, decode GEMV per type/shape/kernel/token count as a fraction of it (q8_0 and the float types\n"
    "       on DeepSeek-V4-Flash's dense matrices), prefill GEMM vs cuBLAS\n"
    "       (--graph: the timed GEMV and FFN launches replayed from a CUDA graph, without host work per launch;\n"
    "       --ffn: also the decode MoE FFN per model, three launches against the engine's two; --ffn-only: only that)\n"
    "  e2e  --model PATH [--tokenizer tokenizer.json|.gguf] [--workload bench/workload/seed-10.jsonl] [--max-new N]\n"
    "       [--requests N] [--device auto|cpu|cuda | --devices cuda:0,cuda:1] [--cache-mib N (per device)] [--staging-mib N | --staging-slots N] [--ignore-eos]\n"
    "       [--io-seconds 5] [--io-depth 32] [--pack-dir DIR] [--no-pack] [--json FILE] [--json-stdout] [--open-only]\n"
    "       [--host-cache-mib N] [--no-overlap] [--prefetch] [--policy decay|lru|sglang-lfu|...] [--mode ours|ours-prefetch|sglang|ours,sglang,...]\n"
    "       [--replay-trace FILE]\n"
    "       the workload one request at a time (temperature 0) through the C API: per dataset prefill/decode tok/s,\n"
    "       cache hit rate, SSD bytes per token; the I/O bound from the disk's raw bandwidth measured in the same run;\n"
    "       --mode sglang: SGLang's algorithm on this engine (LFU, no host tier, no overlap, no prefetch); several\n"
    "       modes run one after another in the same process and are shown side by side; --no-pack: the experts read\n"
    "       from the source files through a source index (the raw figure then reads the largest source file);\n"
    "       --replay-trace: each MoE layer's picks from a routing trace (route CSV or store trace) in place of the\n"
    "       router's, the compute unchanged: model layer l replays trace layer l mod its layers, expert e becomes\n"
    "       e mod the model's experts, every position takes the next recorded token (docs/expert-delivery.md)\n"
    "  compute --model F.gguf [--prompt-tokens 512] [--gen-tokens 128] [--reps 3] [--warmup 1] [--device cuda|cpu]\n"
    "       [--ds4-bench PATH [--ds4-reps N] [--ds4-args ARGS] [--ds4-timeout 300]] [--prompt-file TEXT] [--work-dir DIR] [--json OUT] [--csv OUT]\n"
    "       [--batch 1,2,4,8 [--batch-sample batched|each]]\n"
    "       compute speed with every routed expert resident (no pack), greedy, EOS ignored: prefill tok/s of the prompt and\n"
    "       decode tok/s of the generated tokens, best and median of --reps runs in fresh sessions; the HBM copy bandwidth\n"
    "       of the same run and the HBM bound of a decode token: bytes/token / bandwidth, where bytes/token = every dense\n"
    "       tensor once + one row of token_embd and of each ffn_gate_tid2eid + per MoE layer its routed expert bytes x\n"
    "       top_k / n_experts. --ds4-bench: antirez/ds4's ds4-bench on the same file and prompt text, --ds4-reps times\n"
    "       (DS4_CUDA_COPY_MODEL=1 unless set), side by side with ratios ours/ds4 and the targets (decode >= 1.2x ds4,\n"
    "       prefill >= 1.0x ds4, decode <= 3x the HBM bound; medians). --device cpu: the same steps on the CPU backend\n"
    "       (no HBM bound; a check of the tool). Without a GPU (--device cuda) it fails with exit status 1\n"
    "       --batch: also the aggregate decode of that many sessions stepped together (ep_sessions_append +\n"
    "       one ep_sessions_sample per step, as the server does; --batch-sample each: one ep_session_sample per session),\n"
    "       with the ratio to one session\n"
    "--json prints one JSON object (io, h2d: raw_gbps, engine_gbps and ratio).\n";

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
    if (cmd == "compute") return ep::bench::cmd_compute(ep::bench::parse_args(argc, argv, 2, {}));
    if (cmd == "e2e") return ep::bench::cmd_e2e(ep::bench::parse_args(argc, argv, 2, {"ignore-eos", "json-stdout", "open-only", "no-overlap", "prefetch", "no-pack"}));
    if (cmd == "kernels") {
#ifdef EP_HAVE_CUDA
      return ep::bench::cmd_kernels(ep::bench::parse_args(argc, argv, 2, {"json", "no-gemm", "no-batch1", "graph", "ffn", "ffn-only"}));
#else
      std::fprintf(stderr, "ep-bench kernels: this build has no CUDA backend (EP_WITH_CUDA=OFF)\n");
      return 2;
#endif
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
