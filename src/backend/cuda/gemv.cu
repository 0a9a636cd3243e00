// launch_gemv: decode GEMV (and small-batch GEMM, up to kGemvMaxTokens tokens) on quantized
// weights, batched over many matrices per launch (the experts of a MoE layer). It validates the
// arguments and runs one kernel family (gemv_families.hpp), picked per type and shape:
//  - stream (gemv_stream.cu; one token, mxfp4, q2_K, q3_K and iq2_xxs with k a multiple of 256
//    and at least kDp4aMinRows rows per matrix): x quantized per block to int8 hi + lo parts, the
//    weights streamed through a per-warp ring in shared memory, dp4a;
//  - dp4a (gemv_dp4a.cu): the same arithmetic with the weights in registers, where stream's
//    shared memory or alignment does not fit (not iq2_xxs);
//  - mma (gemv_mma.cu; 2..8 tokens, mxfp4, q2_K, q3_K, iq2_xxs and q8_0 with k a multiple of 256;
//    q8_0 only while kQ8_0SeveralTokensOnMma): tensor cores, one read of the weights for all the
//    tokens; the only family that takes 9..kGemvMaxWideTokens (32) tokens (gemv_runs_wide: a
//    prompt's expert chunks of 16 and 32 tokens, each decoded weight fragment used for 2 or 4
//    tiles of 8 tokens); asked for another family there, a launch runs mma;
//  - rows (gemv_rows.cu; q8_0 with k a multiple of 256, f32, f16, bf16, 1..8 tokens, 16-byte
//    aligned matrices): warps reading 256-value groups of several rows together (q8_0; 2..8 tokens
//    of the float types, one kernel per token count), or lanes sharing a row (the float types' one
//    token);
//  - else the per-lane kernel the type's row names (format::kGgmlTypes' gemv_lane: generic,
//    gemv_generic.cu, for mxfp4, q4_K and q5_K; pipe, gemv_pipe.cu, for the rest), exact to f32
//    rounding (q8_0 with k not a multiple of 256 comes here, whatever the token count).
// Which families run a type is the type table's `gemv` column (format/ggml_type.hpp); each
// family's covers function adds its shape and alignment rules.
// Each default is the fastest that `ep-bench kernels` measured on an H200 for its types and shapes
// (docs/benchmarks.md, "Kernels"): iq2_xxs at 8 tokens on mma 47-68 us per 8 expert matrices
// against 1,200-1,900 us on pipe (H100).
// GemvArgs::kernel asks for one family; one asked for a type or shape it does not cover falls back
// to the default there.
#include "backend/cuda/dispatch.cuh"
#include "backend/cuda/gemv_families.hpp"
#include "backend/cuda/kernels.hpp"
#include "backend/cuda/quant_unit.cuh"
#include "core/status.hpp"

#include <cstdint>
#include <cstring>
#include <string>

namespace ep::backend::cuda {
namespace {

using namespace quant;

// Below this many rows per matrix (one token) the per-lane f32 kernels are used: they are exact
// to f32 rounding, and such matrices (small test models) are too small for speed to matter. The
// choice depends on the matrix, not on how many share the launch, so a matrix's result does not
// change with the launch it is in (the MoE's expert-major pass computes subsets of the pairs).
constexpr int64_t kDp4aMinRows = 2048;

// q8_0 at 2..8 tokens (the attention and shared-expert matrices of DeepSeek-V4's flash-ds4 files,
// so most of a batched decode step), by default: true runs the tensor-core kernel (one read of the
// weights for every token; a token's outputs differ in their last bits from its one-token launch,
// whose row kernel sums in another order: a session decoded in a batch gets the same tokens, not
// the same bits, on CUDA), false the row kernel (f32 FMAs per token, each token summed in the
// one-token kernel's order: bit-identical to the token alone). `ep-bench kernels --types q8_0
// --gemv-tokens 1,2,4,8 --kernels mma,rows` measures both: on an H100 the row kernel took 6.5-39 us
// at 2..8 tokens on DeepSeek-V4's dense q8_0 matrices where mma took 19-133 us (only the head at 8
// tokens was faster on mma: 503 against 750 us), so the row kernel is the default.
constexpr bool kQ8_0SeveralTokensOnMma = false;

// The kernels that can apply GemvArgs::glu: they read x once per block, into their quantized copy.
bool applies_glu(GemvKernel kernel) { return kernel == GemvKernel::dp4a || kernel == GemvKernel::stream; }

GemvKernel pick_gemv_kernel(uint32_t type, const GemvArgs &args) {
  // more tokens than the other families take: the tensor-core kernel or none (launch_gemv throws)
  if (args.n_tok > kGemvMaxTokens) return gemv_mma_covers(type, args.k) ? GemvKernel::mma : GemvKernel::automatic;
  GemvKernel want = args.kernel;
  const bool mma_ok = gemv_mma_covers(type, args.k), dp4a_ok = gemv_dp4a_covers(type, args);
  const bool mma_default = mma_ok && (type != static_cast<uint32_t>(kQ8_0) || kQ8_0SeveralTokensOnMma);
  if (want == GemvKernel::stream && !gemv_stream_covers(type, args)) want = GemvKernel::automatic;
  if (want == GemvKernel::rows && !gemv_rows_covers(type, args)) want = GemvKernel::automatic;
  if (want == GemvKernel::automatic || (want == GemvKernel::mma && !mma_ok) || (want == GemvKernel::dp4a && !dp4a_ok)) {
    // stream measured faster than dp4a; the same rows-per-matrix rule
    if (args.n >= kDp4aMinRows) {
      if (gemv_stream_covers(type, args)) return GemvKernel::stream;
      if (dp4a_ok) return GemvKernel::dp4a;
    }
    if (mma_default && args.n_tok > 1) return GemvKernel::mma;
    if (gemv_rows_covers(type, args)) return GemvKernel::rows;
    const format::GgmlTypeInfo *row = format::ggml_type_row(type);
    return row && row->gemv_lane == format::kGemvGeneric ? GemvKernel::generic : GemvKernel::pipe;
  }
  return want;
}

}  // namespace

const char *gemv_kernel_name(GemvKernel kernel) {
  switch (kernel) {
    case GemvKernel::automatic: return "auto";
    case GemvKernel::generic: return "generic";
    case GemvKernel::pipe: return "pipe";
    case GemvKernel::mma: return "mma";
    case GemvKernel::dp4a: return "dp4a";
    case GemvKernel::stream: return "stream";
    case GemvKernel::rows: return "rows";
  }
  return "?";
}

bool parse_gemv_kernel(const char *name, GemvKernel &out) {
  for (GemvKernel k : {GemvKernel::automatic, GemvKernel::generic, GemvKernel::pipe, GemvKernel::mma, GemvKernel::dp4a,
                       GemvKernel::stream, GemvKernel::rows}) {
    if (std::strcmp(name, gemv_kernel_name(k)) == 0) {
      out = k;
      return true;
    }
  }
  return false;
}

GemvKernel gemv_kernel_for(uint32_t type, const GemvArgs &args) { return pick_gemv_kernel(type, args); }

bool gemv_runs_wide(uint32_t type, int64_t k) { return gemv_mma_covers(type, k); }

bool gemv_takes_glu(uint32_t type, const GemvArgs &args) { return applies_glu(pick_gemv_kernel(type, args)); }

void launch_gemv(uint32_t type, const GemvArgs &args, cudaStream_t stream) {
  if (args.n_tok < 1 || args.n_tok > kGemvMaxWideTokens)
    throw Error(Status::invalid_argument, "launch_gemv: n_tok " + std::to_string(args.n_tok) + " outside 1..32");
  if (args.n_tok > kGemvMaxTokens && !gemv_runs_wide(type, args.k))
    throw Error(Status::invalid_argument, "launch_gemv: n_tok " + std::to_string(args.n_tok) + " above 8 for type " +
                                              std::to_string(type) + " with k = " + std::to_string(args.k) +
                                              ": only the tensor-core kernel's types (mxfp4, q2_K, q3_K, iq2_xxs, "
                                              "q8_0) with k a multiple of 256 take 9..32 tokens");
  if (args.n_mat < 1 || args.n_mat > 65535)
    throw Error(Status::invalid_argument, "launch_gemv: n_mat " + std::to_string(args.n_mat) + " outside 1..65535");
  if (args.k % 32 != 0 || (reinterpret_cast<uintptr_t>(args.x) & 15) != 0)
    throw Error(Status::invalid_argument, "launch_gemv: k must be a multiple of 32 and x 16-byte aligned");
  if (args.n < 0 || args.n > INT32_MAX || args.k > INT32_MAX)
    throw Error(Status::invalid_argument, "launch_gemv: n = " + std::to_string(args.n) + ", k = " + std::to_string(args.k) +
                                              ": both must be below 2^31");
  const GemvKernel kernel = pick_gemv_kernel(type, args);
  if (args.glu.up != nullptr && ((reinterpret_cast<uintptr_t>(args.glu.up) & 15) != 0 || !applies_glu(kernel)))
    throw Error(Status::invalid_argument, "launch_gemv: an activation on the input (GemvArgs::glu) needs the dp4a or stream "
                                          "kernel (gemv_takes_glu) and a 16-byte aligned up row; " +
                                              std::string(gemv_kernel_name(kernel)) + " was picked for type " +
                                              std::to_string(type));
  if (args.n == 0) return;
  dispatch_type(type, "launch_gemv", [&](auto tag) {
    constexpr int T = decltype(tag)::value;
    if (args.k % Traits<T>::elems != 0)
      throw Error(Status::shape, "launch_gemv: k = " + std::to_string(args.k) + " is not a whole number of blocks");
  });
  switch (kernel) {
    case GemvKernel::generic: return launch_gemv_generic(type, args, stream);
    case GemvKernel::mma: return launch_gemv_mma(type, args, stream);
    case GemvKernel::dp4a: return launch_gemv_dp4a(type, args, stream);
    case GemvKernel::stream: return launch_gemv_stream(type, args, stream);
    case GemvKernel::rows: return launch_gemv_rows(type, args, stream);
    default: return launch_gemv_pipe(type, args, stream);  // pipe (pick_gemv_kernel never returns automatic)
  }
}

}  // namespace ep::backend::cuda
