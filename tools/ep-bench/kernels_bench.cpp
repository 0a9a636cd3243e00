// ep-bench kernels — measures, in one run on one GPU: the HBM device-to-device copy bandwidth
// (read + write bytes), the cuBLAS bf16 GEMM rate per shape, and per weight type, expert shape
// and GEMV kernel the decode GEMV bandwidth (weight bytes read / time, several experts per
// launch) as a fraction of the copy bandwidth, and the prefill GEMM rate (dequantize + cuBLAS) in
// each of the backend's GEMM modes (--gemm-mode, a list: split, the default f16 halves on tensor
// cores; exact, f32 + SGEMM; bf16, the opt-in; all three unless named) as a fraction of the cuBLAS
// bf16 rate, in a table of its own. --batch N (or N1,N2,N3,N4, one per shape) sets the experts
// per GEMV launch: the engine launches gate and up of all picked experts together and down apart,
// i.e. 12/6/32/16 for DeepSeek-V4-Flash (top-6) and Kimi-K3 (top-16). Weights are cycled through
// a pool much larger than L2 so that HBM is measured. --kernels picks the GEMV kernels (`auto`,
// the default: what the engine runs). The dense types (q8_0, f16, bf16, f32) are measured on the
// dense matrices of DeepSeek-V4-Flash instead (dense_shapes: the attention, shared-expert and head
// matrices in q8_0, the compressor, indexer, router and hyper-connection matrices in the float
// types, as the ds4 layout stores them), one matrix per launch (the grouped o_a: 8); f16, bf16 and
// f32 only when --types names them. --gemv-tokens takes a list of token counts (1..8, and 9..32 for
// the tensor-core kernel's types, gemv_runs_wide: a prompt's expert chunks of 16 and 32; rows of
// other types skip those): every GEMV row is measured at each, with its time per launch and that time over the one-token
// launch's. --ffn adds (and --ffn-only runs only) the decode MoE FFN per model (bench_ffn):
// gate+up, activation and down of one token's experts as three launches, and as two (the
// activation applied as down's kernel reads its input; the engine's path for every type but
// mxfp4).
#include "bench_common.hpp"
#include "cuda_util.hpp"

#include "backend/tensor.hpp"
#include "core/error.hpp"
#include "gpu/check.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "gpu/device.hpp"
#include "backend/cuda/kernels.hpp"

#include <cublas_v2.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace ep::bench {
namespace {

using ep::backend::Device;
using ep::backend::Tensor;
using ep::format::GgmlType;

struct Options {
  bool json = false;
  bool gemm = true;          // prefill GEMM and cuBLAS references
  bool batch1 = true;        // also one matrix per launch (--no-batch1: skip, reported as 0)
  std::vector<ep::backend::cuda::GemmMode> gemm_modes;  // the backend's prefill GEMM paths timed, in order
  int batch[4] = {8, 8, 8, 8};  // experts per GEMV launch, per shape (--batch N or N1,N2,N3,N4)
  std::vector<int> gemv_tokens = {1};  // tokens per GEMV launch, each measured
  int passes = 10;           // timed passes over the weight pool
  bool graph = false;        // --graph: the timed passes captured once as a CUDA graph and replayed (timed_gbps)
  bool ffn = false;          // --ffn: also the decode MoE FFN, three launches against two (bench_ffn)
  bool ffn_only = false;     // --ffn-only: only that
  uint64_t pool_mib = 1024;  // weight bytes cycled per type and shape
  int64_t prefill_tokens = 512;
  std::vector<GgmlType> types;
  std::vector<ep::backend::cuda::GemvKernel> kernels;
};

std::vector<std::string> split_list(const std::string &s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

const std::vector<GgmlType> &bench_types() {
  static const std::vector<GgmlType> all = {GgmlType::mxfp4, GgmlType::q2_k, GgmlType::q3_k, GgmlType::q4_k,
                                            GgmlType::q5_k,  GgmlType::q6_k, GgmlType::q8_0, GgmlType::iq2_xxs,
                                            GgmlType::f16,   GgmlType::bf16, GgmlType::f32};
  return all;
}

// The types measured on DeepSeek-V4-Flash's dense matrices (dense_shapes), not on expert shapes.
bool dense_type(GgmlType t) {
  return t == GgmlType::q8_0 || t == GgmlType::f16 || t == GgmlType::bf16 || t == GgmlType::f32;
}

Options options_from(const Args &args) {
  Options o;
  o.json = args.has("json");
  o.gemm = !args.has("no-gemm");
  o.batch1 = !args.has("no-batch1");
  for (const auto &name : split_list(args.get("gemm-mode", "split,exact,bf16"))) {
    ep::backend::cuda::GemmMode m{};
    if (!ep::backend::cuda::parse_gemm_mode(name.c_str(), m))
      ep::fail(ep::Status::invalid_argument, "ep-bench kernels: --gemm-mode takes split, exact and bf16, not '{}'", name);
    if (std::find(o.gemm_modes.begin(), o.gemm_modes.end(), m) == o.gemm_modes.end()) o.gemm_modes.push_back(m);
  }
  if (o.gemm_modes.empty()) ep::fail(ep::Status::invalid_argument, "ep-bench kernels: --gemm-mode names no mode");
  {  // one number for every shape, or one per shape in the printed order
    const auto items = split_list(args.get("batch", "8"));
    if (items.size() != 1 && items.size() != 4)
      ep::fail(ep::Status::invalid_argument, "--batch: one number or four (one per shape), not '{}'", args.get("batch", ""));
    for (size_t i = 0; i < 4; ++i) {
      const std::string &v = items[items.size() == 1 ? 0 : i];
      char *end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || n < 1 || n > 65535)
        ep::fail(ep::Status::invalid_argument, "--batch: '{}' is not a number of experts in 1..65535", v);
      o.batch[i] = static_cast<int>(n);
    }
  }
  o.gemv_tokens.clear();
  for (const auto &v : split_list(args.get("gemv-tokens", "1"))) {
    char *end = nullptr;
    const long n = std::strtol(v.c_str(), &end, 10);
    if (end == v.c_str() || *end != '\0' || n < 1 || n > ep::backend::cuda::kGemvMaxWideTokens)
      ep::fail(ep::Status::invalid_argument, "--gemv-tokens: '{}' is not a token count in 1..{}", v,
               ep::backend::cuda::kGemvMaxWideTokens);
    if (std::find(o.gemv_tokens.begin(), o.gemv_tokens.end(), static_cast<int>(n)) == o.gemv_tokens.end())
      o.gemv_tokens.push_back(static_cast<int>(n));
  }
  if (o.gemv_tokens.empty()) ep::fail(ep::Status::invalid_argument, "--gemv-tokens: no token count given");
  o.pool_mib = static_cast<uint64_t>(args.number("pool-mib", 1024));
  o.passes = std::max(1, static_cast<int>(args.number("passes", 10)));
  o.graph = args.has("graph");
  o.ffn_only = args.has("ffn-only");
  o.ffn = o.ffn_only || args.has("ffn");
  o.prefill_tokens = std::max<int64_t>(1, static_cast<int64_t>(args.number("tokens", 512)));
  for (const auto &name : split_list(args.get("types", ""))) {
    bool found = false;
    for (GgmlType t : bench_types()) {
      if (name == ep::format::ggml_type_info(static_cast<uint32_t>(t))->name) {
        o.types.push_back(t);
        found = true;
      }
    }
    if (!found) ep::fail(ep::Status::invalid_argument, "--types: unknown or unsupported type '{}'", name);
  }
  if (o.types.empty())  // the quantized types (the float types only when named)
    for (GgmlType t : bench_types())
      if (ep::format::ggml_type_info(static_cast<uint32_t>(t))->quantized) o.types.push_back(t);
  for (const auto &name : split_list(args.get("kernels", "auto"))) {
    ep::backend::cuda::GemvKernel k{};
    if (!ep::backend::cuda::parse_gemv_kernel(name.c_str(), k))
      ep::fail(ep::Status::invalid_argument, "--kernels: unknown GEMV kernel '{}' (auto|generic|pipe|mma|dp4a|stream|rows)", name);
    o.kernels.push_back(k);
  }
  return o;
}

// The launches `record` makes on `stream`, captured once into a CUDA graph (programmatic
// dependent launches become programmatic edges) and replayed by launch(): no host work per kernel.
struct CapturedLaunches {
  cudaGraphExec_t exec{};
  template <typename F>
  CapturedLaunches(cudaStream_t stream, const F &record) {
    cudaGraph_t graph{};
    EP_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    record();
    EP_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    EP_CUDA_CHECK(made);
  }
  ~CapturedLaunches() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
  }
  CapturedLaunches(const CapturedLaunches &) = delete;
  CapturedLaunches &operator=(const CapturedLaunches &) = delete;
  void launch(cudaStream_t stream) const { EP_CUDA_CHECK(cudaGraphLaunch(exec, stream)); }
};

// GB/s of `launches` launches (launch(i), i < launches, reading bytes_per_launch each) on
// `stream`: one warm-up pass, then o.passes timed passes; with --graph the timed passes are
// captured as one CUDA graph after the warm-up (which also fills the launchers' caches), replayed
// once untimed and once timed.
template <typename F>
double timed_gbps(cudaStream_t stream, const Options &o, int launches, double bytes_per_launch, const F &launch) {
  for (int i = 0; i < launches; ++i) launch(i);  // warm-up pass
  auto timed_passes = [&] {
    for (int p = 0; p < o.passes; ++p)
      for (int i = 0; i < launches; ++i) launch(i);
  };
  Events ev;
  if (o.graph) {
    const CapturedLaunches graph(stream, timed_passes);
    graph.launch(stream);
    EP_CUDA_CHECK(cudaEventRecord(ev.start, stream));
    graph.launch(stream);
    EP_CUDA_CHECK(cudaEventRecord(ev.stop, stream));
  } else {
    EP_CUDA_CHECK(cudaEventRecord(ev.start, stream));
    timed_passes();
    EP_CUDA_CHECK(cudaEventRecord(ev.stop, stream));
  }
  return bytes_per_launch * launches * o.passes / (ev.ms() * 1e6);
}

// n floats uniform in [−1, 1) (seed 5) copied to dev: the activations x of the benchmarks.
void upload_random_x(void *dev, size_t n) {
  std::vector<float> hx(n);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (auto &v : hx) v = dist(rng);
  EP_CUDA_CHECK(cudaMemcpy(dev, hx.data(), n * 4, cudaMemcpyHostToDevice));
}

void check_cublas(cublasStatus_t s, const char *what) {
  if (s != CUBLAS_STATUS_SUCCESS) ep::fail(ep::Status::cuda, "{}: {}", what, cublasGetStatusString(s));
}

// cuBLAS bf16 GEMM y[N,T] = W[K,N]^T x[K,T] with f32 output (what the prefill path calls).
double cublas_bf16_tflops(cublasHandle_t h, cudaStream_t stream, int64_t k, int64_t n, int64_t t) {
  DeviceMem w(static_cast<uint64_t>(k * n) * 2), x(static_cast<uint64_t>(k * t) * 2), y(static_cast<uint64_t>(n * t) * 4);
  EP_CUDA_CHECK(cudaMemsetAsync(w.p, 0x3c, static_cast<uint64_t>(k * n) * 2, stream));
  EP_CUDA_CHECK(cudaMemsetAsync(x.p, 0x3c, static_cast<uint64_t>(k * t) * 2, stream));
  const float one = 1, zero = 0;
  auto run = [&] {
    check_cublas(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(t), static_cast<int>(k), &one,
                              w.p, CUDA_R_16BF, static_cast<int>(k), x.p, CUDA_R_16BF, static_cast<int>(k), &zero, y.p,
                              CUDA_R_32F, static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  };
  for (int i = 0; i < 5; ++i) run();
  Events ev;
  const int iters = 50;
  EP_CUDA_CHECK(cudaEventRecord(ev.start, stream));
  for (int i = 0; i < iters; ++i) run();
  EP_CUDA_CHECK(cudaEventRecord(ev.stop, stream));
  return 2.0 * static_cast<double>(k) * static_cast<double>(n) * static_cast<double>(t) * iters / (ev.ms() * 1e9);
}

// One matrix of n rows of k values of `type`: random bytes with finite f16 scales (timing does not
// depend on the values; keep them sane).
std::vector<uint8_t> random_matrix(GgmlType type, int64_t k, int64_t n, uint32_t seed) {
  const auto info = *ep::format::ggml_type_info(static_cast<uint32_t>(type));
  const uint64_t mat_bytes = ep::format::ggml_row_bytes(type, static_cast<uint64_t>(k), "bench") * static_cast<uint64_t>(n);
  std::mt19937 rng(seed);
  std::vector<uint8_t> host(mat_bytes);
  for (auto &b : host) b = static_cast<uint8_t>(rng());
  if (!info.quantized) {  // f16 / bf16 / f32: the exponent's top bit cleared, |v| < 2 (no inf or NaN)
    const uint64_t size = type == GgmlType::f32 ? 4 : 2;
    for (uint64_t v = 0; v + size <= host.size(); v += size) host[v + size - 1] &= 0xBF;
  }
  if (info.quantized && type != GgmlType::mxfp4) {
    const uint32_t d_off = type == GgmlType::q2_k ? 80 : type == GgmlType::q3_k ? 108 : type == GgmlType::q6_k ? 208 : 0;
    for (uint64_t b = 0; b + info.block_bytes <= host.size(); b += info.block_bytes) {
      host[b + d_off] = 0x00;
      host[b + d_off + 1] = 0x20;  // f16 0.0078125
      if (type == GgmlType::q2_k || type == GgmlType::q4_k || type == GgmlType::q5_k) {
        const uint32_t m_off = type == GgmlType::q2_k ? 82 : 2;
        host[b + m_off] = 0x00;
        host[b + m_off + 1] = 0x20;
      }
    }
  }
  return host;
}

struct Shape {
  int64_t k, n;  // input dim (ggml ne0) × output rows
  const char *what;
  int mats = 0;  // matrices per launch; 0: --batch's number for the shape
};

// DeepSeek-V4-Flash's dense matrices as the decode step multiplies them (testkit's flash_ds4
// layout, the `ep-synth --preset flash-ds4` file): q8_0 for the attention, shared-expert and head
// matrices, the float types for the others.
const std::vector<Shape> &dense_shapes(GgmlType t) {
  static const std::vector<Shape> q8 = {{4096, 1024, "attn_q_a", 1},          {1024, 32768, "attn_q_b", 1},
                                        {4096, 512, "attn_kv", 1},            {4096, 1024, "attn_output_a (8 groups)", 8},
                                        {8192, 4096, "attn_output_b", 1},     {4096, 2048, "ffn_gate/up_shexp", 1},
                                        {2048, 4096, "ffn_down_shexp", 1},    {4096, 129280, "output (head)", 1}};
  static const std::vector<Shape> side = {{4096, 1024, "attn_compressor_kv/gate (CSA)", 1},
                                          {4096, 512, "attn_compressor_kv/gate (HCA)", 1},
                                          {1024, 8192, "indexer.attn_q_b", 1},
                                          {4096, 256, "indexer_compressor_kv/gate, ffn_gate_inp", 1},
                                          {4096, 64, "indexer.proj", 1},
                                          {16384, 24, "hc_attn/ffn_fn", 1}};
  return t == GgmlType::q8_0 ? q8 : side;
}

struct GemvResult {
  std::string kernel;
  int want;    // index of the kernel asked for in Options::kernels
  int tokens;  // tokens per launch
  double gbps, batch1_gbps;
  double us;   // time per launch at --batch's matrices
};
struct Result {
  std::string type;
  Shape shape;
  uint64_t matrix_bytes;
  int pool_matrices;
  int batch;                     // experts per GEMV launch
  std::vector<GemvResult> gemv;  // one per distinct kernel asked for
  std::vector<double> gemm_tflops;  // per Options::gemm_modes
  double cublas_tflops;
};

Result bench_one(ep::backend::cuda::CudaBackend &be, GgmlType type, const Shape &s, int batch, const Options &o,
                 double cublas_tflops) {
  const int max_tokens = *std::max_element(o.gemv_tokens.begin(), o.gemv_tokens.end());
  const auto info = *ep::format::ggml_type_info(static_cast<uint32_t>(type));
  const uint64_t row_bytes = ep::format::ggml_row_bytes(type, static_cast<uint64_t>(s.k), "bench");
  const uint64_t mat_bytes = row_bytes * static_cast<uint64_t>(s.n);
  const uint64_t mat_stride = (mat_bytes + 4095) / 4096 * 4096;  // experts are 4096-aligned in a pack
  int pool = static_cast<int>((o.pool_mib << 20) / mat_stride);
  pool = std::max(pool, 2 * batch);
  pool -= pool % batch;
  cudaStream_t stream = be.stream();
  DeviceMem weights(mat_stride * static_cast<uint64_t>(pool));
  {
    const std::vector<uint8_t> host = random_matrix(type, s.k, s.n, static_cast<uint32_t>(s.k * 31 + s.n));
    auto *base = static_cast<uint8_t *>(weights.p);
    EP_CUDA_CHECK(cudaMemcpy(base, host.data(), mat_bytes, cudaMemcpyHostToDevice));
    for (int m = 1; m < pool; ++m)
      EP_CUDA_CHECK(cudaMemcpyAsync(base + m * mat_stride, base, mat_bytes, cudaMemcpyDeviceToDevice, stream));
  }
  std::vector<const void *> ptrs(static_cast<size_t>(pool));
  for (int m = 0; m < pool; ++m) ptrs[m] = static_cast<uint8_t *>(weights.p) + m * mat_stride;
  DeviceMem dptrs(ptrs.size() * sizeof(void *));
  EP_CUDA_CHECK(cudaMemcpy(dptrs.p, ptrs.data(), ptrs.size() * sizeof(void *), cudaMemcpyHostToDevice));
  // x: matrix m of a launch reads rows m .. m + tokens − 1; y: n per matrix and token
  const int64_t xt = std::max<int64_t>(batch + max_tokens, o.prefill_tokens);
  const int64_t yt_rows = std::max<int64_t>(xt, static_cast<int64_t>(batch) * max_tokens);
  DeviceMem x(static_cast<uint64_t>(s.k * xt) * 4), y(static_cast<uint64_t>(s.n * yt_rows) * 4);
  upload_random_x(x.p, static_cast<size_t>(s.k * xt));
  // GB/s of launch(table + i·per_launch) over the whole pool, bytes_per_matrix read per matrix
  const auto *table = static_cast<const void *const *>(dptrs.p);
  auto pass_gbps = [&](int per_launch, uint64_t bytes_per_matrix, const auto &launch) {
    return timed_gbps(stream, o, pool / per_launch, static_cast<double>(bytes_per_matrix) * per_launch,
                      [&](int i) { launch(table + i * per_launch); });
  };
  auto gemv_gbps = [&](int per_launch, ep::backend::cuda::GemvKernel kernel, int tokens) {
    ep::backend::cuda::GemvArgs a;
    a.x = static_cast<float *>(x.p);
    a.y = static_cast<float *>(y.p);
    a.k = s.k;
    a.n = s.n;
    a.n_mat = per_launch;
    a.n_tok = tokens;
    a.kernel = kernel;
    a.w_ptrs_aligned16 = true;  // the pool's matrices start 4096 bytes apart (mat_stride): the row kernel takes them
    return pass_gbps(per_launch, mat_bytes, [&](const void *const *mats) {
      a.w_ptrs = mats;
      ep::backend::cuda::launch_gemv(static_cast<uint32_t>(type), a, stream);
    });
  };
  Result r{std::string(info.name), s, mat_bytes, pool, batch, {}, {}, cublas_tflops};
  for (size_t wi = 0; wi < o.kernels.size(); ++wi)
    for (int tokens : o.gemv_tokens) {
      if (tokens > ep::backend::cuda::kGemvMaxTokens && !ep::backend::cuda::gemv_runs_wide(static_cast<uint32_t>(type), s.k))
        continue;  // only the tensor-core kernel takes more than 8 tokens
      const ep::backend::cuda::GemvKernel want = o.kernels[wi];
      auto resolved = [&](int mats) {  // the kernel launch_gemv runs for this many matrices per launch
        ep::backend::cuda::GemvArgs probe;  // as gemv_gbps launches: a table of 16-byte aligned matrices
        probe.w_ptrs = table;
        probe.w_ptrs_aligned16 = true;
        probe.k = s.k;
        probe.n = s.n;
        probe.n_mat = mats;
        probe.n_tok = tokens;
        probe.kernel = want;
        return std::string(ep::backend::cuda::gemv_kernel_name(ep::backend::cuda::gemv_kernel_for(static_cast<uint32_t>(type), probe)));
      };
      std::string name = resolved(batch);
      if (want == ep::backend::cuda::GemvKernel::automatic) {  // "auto:<kernel at --batch>[/<kernel at batch 1>]"
        const std::string one = resolved(1);
        std::string label = "auto:";
        label += name;
        if (one != name) {
          label += '/';
          label += one;
        }
        name = label;
      } else if (std::any_of(r.gemv.begin(), r.gemv.end(),
                             [&](const GemvResult &g) { return g.kernel == name && g.tokens == tokens; })) {
        continue;  // an mma kernel asked for a type it does not run falls back to one measured already
      }
      const double gbps = gemv_gbps(batch, want, tokens);
      const double us = static_cast<double>(mat_bytes) * batch / (gbps * 1e3);
      r.gemv.push_back({name, static_cast<int>(wi), tokens, gbps, o.batch1 ? gemv_gbps(1, want, tokens) : 0.0, us});
    }
  if (o.gemm) {  // prefill GEMM through the backend (dequantize rows + cuBLAS), in each mode
    const Tensor xt_t = Tensor::make(x.p, GgmlType::f32, Device::cuda, {s.k, o.prefill_tokens});
    const Tensor yt = Tensor::make(y.p, GgmlType::f32, Device::cuda, {s.n, o.prefill_tokens});
    for (const ep::backend::cuda::GemmMode mode : o.gemm_modes) {
      auto run = [&](int m) { be.matmul_gemm(Tensor::make(ptrs[m % pool], type, Device::cuda, {s.k, s.n}), xt_t, yt, mode); };
      for (int i = 0; i < 3; ++i) run(i);
      Events ev;
      const int iters = 30;
      EP_CUDA_CHECK(cudaEventRecord(ev.start, stream));
      for (int i = 0; i < iters; ++i) run(i);
      EP_CUDA_CHECK(cudaEventRecord(ev.stop, stream));
      r.gemm_tflops.push_back(2.0 * static_cast<double>(s.k) * static_cast<double>(s.n) *
                              static_cast<double>(o.prefill_tokens) * iters / (ev.ms() * 1e9));
    }
  }
  return r;
}

// The routed experts' decode FFN of one token (gate, up, GLU, down of `experts` experts): three
// launches (launch_gemv of gate and up, launch_glu, launch_gemv of down) against two (the GLU
// applied by down's kernel, GemvArgs::glu), in GB/s of expert weights read (each FFN's
// experts cycled through a pool much larger than L2, launches back to back on one stream as
// decode issues them).
struct FfnModel {
  const char *name;
  int64_t d, f;
  int top_k;
};
struct FfnResult {
  std::string type;
  const FfnModel *model;
  int experts;
  uint64_t expert_bytes;  // gate + up + down of one expert
  double three_gbps, two_gbps;  // three launches; two (the engine's)
};

FfnResult bench_ffn(ep::backend::cuda::CudaBackend &be, GgmlType type, const FfnModel &mdl, int experts, const Options &o) {
  const auto info = *ep::format::ggml_type_info(static_cast<uint32_t>(type));
  const uint64_t gu_bytes = ep::format::ggml_row_bytes(type, static_cast<uint64_t>(mdl.d), "bench") * static_cast<uint64_t>(mdl.f);
  const uint64_t down_bytes = ep::format::ggml_row_bytes(type, static_cast<uint64_t>(mdl.f), "bench") * static_cast<uint64_t>(mdl.d);
  auto aligned = [](uint64_t b) { return (b + 4095) / 4096 * 4096; };  // experts are 4096-aligned in a pack
  const uint64_t expert_stride = 2 * aligned(gu_bytes) + aligned(down_bytes);
  int pool = static_cast<int>((o.pool_mib << 20) / expert_stride);
  pool = std::max(pool, 2 * experts);
  pool -= pool % experts;
  cudaStream_t stream = be.stream();
  DeviceMem weights(expert_stride * static_cast<uint64_t>(pool));
  auto *base = static_cast<uint8_t *>(weights.p);
  {
    const auto gu = random_matrix(type, mdl.d, mdl.f, static_cast<uint32_t>(mdl.d * 7 + mdl.f));
    const auto dn = random_matrix(type, mdl.f, mdl.d, static_cast<uint32_t>(mdl.f * 7 + mdl.d));
    EP_CUDA_CHECK(cudaMemcpy(base, gu.data(), gu_bytes, cudaMemcpyHostToDevice));
    EP_CUDA_CHECK(cudaMemcpy(base + aligned(gu_bytes), gu.data(), gu_bytes, cudaMemcpyHostToDevice));
    EP_CUDA_CHECK(cudaMemcpy(base + 2 * aligned(gu_bytes), dn.data(), down_bytes, cudaMemcpyHostToDevice));
    for (int e = 1; e < pool; ++e)
      EP_CUDA_CHECK(cudaMemcpyAsync(base + e * expert_stride, base, expert_stride, cudaMemcpyDeviceToDevice, stream));
  }
  // per launch: the gate matrices of its experts, then up, then down (compute_pairs' table)
  const int launches = pool / experts;
  std::vector<const void *> table;
  for (int l = 0; l < launches; ++l)
    for (int role = 0; role < 3; ++role)
      for (int e = 0; e < experts; ++e) table.push_back(base + (l * experts + e) * expert_stride + role * aligned(gu_bytes));
  DeviceMem dtable(table.size() * sizeof(void *));
  EP_CUDA_CHECK(cudaMemcpy(dtable.p, table.data(), table.size() * sizeof(void *), cudaMemcpyHostToDevice));
  const std::vector<int32_t> rows(static_cast<size_t>(2 * experts), 0);  // one token: every matrix reads x row 0
  DeviceMem drows(rows.size() * 4), x(static_cast<uint64_t>(mdl.d) * 4), gate_up(static_cast<uint64_t>(2 * experts * mdl.f) * 4),
      h(static_cast<uint64_t>(experts * mdl.f) * 4), y(static_cast<uint64_t>(experts * mdl.d) * 4);
  EP_CUDA_CHECK(cudaMemcpy(drows.p, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice));
  upload_random_x(x.p, static_cast<size_t>(mdl.d));
  const auto *tbl = static_cast<const void *const *>(dtable.p);
  auto *gu_out = static_cast<float *>(gate_up.p);
  // gate and up, then down of launch l's experts; the activation in its own launch (three) or in
  // down's (two)
  auto ffn = [&](int l, bool glu_in_down) {
    ep::backend::cuda::GemvArgs a;
    a.w_ptrs = tbl + 3 * l * experts;
    a.x = static_cast<const float *>(x.p);
    a.x_rows = static_cast<const int32_t *>(drows.p);
    a.y = gu_out;
    a.k = mdl.d;
    a.n = mdl.f;
    a.n_mat = 2 * experts;
    ep::backend::cuda::launch_gemv(static_cast<uint32_t>(type), a, stream);
    ep::backend::cuda::GemvArgs b;
    b.w_ptrs = tbl + 3 * l * experts + 2 * experts;
    b.y = static_cast<float *>(y.p);
    b.k = mdl.f;
    b.n = mdl.d;
    b.n_mat = experts;
    if (glu_in_down) {
      b.x = gu_out;
      b.glu = ep::backend::cuda::GemvGlu{gu_out + experts * mdl.f, 0, 7.0f, 1.0f, 1.0f};
    } else {
      ep::backend::cuda::launch_glu(gu_out, gu_out + experts * mdl.f, experts * mdl.f, 0, 7.0f, 1.0f, 1.0f, static_cast<float *>(h.p),
                           stream);
      b.x = static_cast<const float *>(h.p);
    }
    ep::backend::cuda::launch_gemv(static_cast<uint32_t>(type), b, stream);
  };
  const double bytes = static_cast<double>(2 * gu_bytes + down_bytes) * experts;  // per FFN
  FfnResult r{std::string(info.name), &mdl, experts, 2 * gu_bytes + down_bytes, 0.0, 0.0};
  r.three_gbps = timed_gbps(stream, o, launches, bytes, [&](int l) { ffn(l, false); });
  r.two_gbps = timed_gbps(stream, o, launches, bytes, [&](int l) { ffn(l, true); });
  return r;
}

int run(const Options &o) {
  std::string why;
  if (ep::gpu::device_count(&why) == 0) ep::fail(ep::Status::no_device, "{}", why);
  const std::string device = ep::gpu::describe_device(0);
  ep::backend::cuda::CudaBackend be(0);
  cudaStream_t stream = be.stream();
  cublasHandle_t h = nullptr;
  check_cublas(cublasCreate(&h), "cublasCreate");
  check_cublas(cublasSetStream(h, stream), "cublasSetStream");
  const double hbm = hbm_copy_gbps(stream);
  const Shape shapes[] = {{4096, 2048, "DeepSeek-V4 expert gate/up"},
                          {2048, 4096, "DeepSeek-V4 expert down"},
                          {3584, 3072, "Kimi-K3 latent expert gate/up"},
                          {3072, 3584, "Kimi-K3 latent expert down"}};
  std::vector<double> cublas(4, 0.0);
  double cublas_big = 0;
  if (o.gemm) {
    for (int i = 0; i < 4; ++i) cublas[i] = cublas_bf16_tflops(h, stream, shapes[i].k, shapes[i].n, o.prefill_tokens);
    cublas_big = cublas_bf16_tflops(h, stream, 8192, 8192, 8192);
  }
  std::vector<Result> results;
  if (!o.ffn_only)
    for (GgmlType t : o.types) {
      if (dense_type(t)) {
        for (const Shape &s : dense_shapes(t))
          results.push_back(bench_one(be, t, s, s.mats, o, o.gemm ? cublas_bf16_tflops(h, stream, s.k, s.n, o.prefill_tokens) : 0.0));
      } else {
        for (int i = 0; i < 4; ++i) results.push_back(bench_one(be, t, shapes[i], o.batch[i], o, cublas[i]));
      }
    }
  static const FfnModel models[] = {{"DeepSeek-V4-Flash", 4096, 2048, 6}, {"Kimi-K3 (latent)", 3584, 3072, 16}};
  std::vector<FfnResult> ffn;
  if (o.ffn)
    for (GgmlType t : o.types)
      for (const FfnModel &m : models)
        for (int e : {m.top_k, 8}) {
          if (e == 8 && m.top_k == 8) continue;
          ep::backend::cuda::GemvArgs down;  // where down's kernel can apply the activation
          down.k = m.f;
          down.n = m.d;
          down.n_mat = e;
          if (ep::backend::cuda::gemv_takes_glu(static_cast<uint32_t>(t), down)) ffn.push_back(bench_ffn(be, t, m, e, o));
        }
  cublasDestroy(h);
  const double hbm_after = hbm_copy_gbps(stream);  // the copy reference again, after the kernels

  if (o.json) {
    nlohmann::json j;
    j["device"] = device;
    j["hbm_copy_gbps"] = hbm;
    j["hbm_copy_gbps_after"] = hbm_after;
    j["gemv_tokens"] = o.gemv_tokens;
    j["gemv_graph"] = o.graph;
    j["prefill_tokens"] = o.prefill_tokens;
    j["cublas_bf16_tflops_8192"] = cublas_big;
    for (const auto &r : results) {
      for (const auto &g : r.gemv) {
        nlohmann::json e = {{"type", r.type},
                            {"k", r.shape.k},
                            {"n", r.shape.n},
                            {"what", r.shape.what},
                            {"kernel", g.kernel},
                            {"gemv_tokens", g.tokens},
                            {"gemv_us_per_launch", g.us},
                            {"matrix_bytes", r.matrix_bytes},
                            {"pool_matrices", r.pool_matrices},
                            {"gemv_batch", r.batch},
                            {"gemv_gbps", g.gbps},
                            {"gemv_fraction_of_hbm", g.gbps / hbm},
                            {"gemv_batch1_gbps", g.batch1_gbps},
                            {"gemv_batch1_fraction_of_hbm", g.batch1_gbps / hbm}};
        if (o.gemm) {
          e["cublas_bf16_tflops"] = r.cublas_tflops;
          for (size_t m = 0; m < o.gemm_modes.size(); ++m)
            e["gemm"].push_back({{"mode", ep::backend::cuda::gemm_mode_name(o.gemm_modes[m])},
                                 {"tflops", r.gemm_tflops[m]},
                                 {"fraction_of_cublas", r.gemm_tflops[m] / r.cublas_tflops}});
        }
        j["results"].push_back(e);
      }
    }
    for (const auto &r : ffn)
      j["ffn_results"].push_back({{"type", r.type},
                                  {"model", r.model->name},
                                  {"d", r.model->d},
                                  {"f", r.model->f},
                                  {"experts", r.experts},
                                  {"expert_bytes", r.expert_bytes},
                                  {"three_launches_gbps", r.three_gbps},
                                  {"three_launches_fraction_of_hbm", r.three_gbps / hbm},
                                  {"two_launches_gbps", r.two_gbps},
                                  {"two_launches_fraction_of_hbm", r.two_gbps / hbm}});
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  fmt::print("{}\n", device);
  fmt::print("HBM device-to-device copy: {:.0f} GB/s (read + write; {:.0f} GB/s again after the kernels)\n", hbm, hbm_after);
  if (o.gemm) {
    fmt::print("cuBLAS bf16 GEMM 8192^3: {:.1f} TFLOP/s\n", cublas_big);
    for (int i = 0; i < 4; ++i)
      fmt::print("cuBLAS bf16 GEMM {}x{} x {} tokens ({}): {:.1f} TFLOP/s\n", shapes[i].k, shapes[i].n, o.prefill_tokens,
                 shapes[i].what, cublas[i]);
  }
  if (!ffn.empty()) {
    fmt::print("\ndecode MoE FFN, one token (gate, up, GLU, down of each expert; expert weight bytes read / time):\n"
               "three launches (GEMV gate+up, GLU, GEMV down) and two (the GLU applied by down's GEMV: what the engine\n"
               "runs for q2_K, q3_K and iq2_xxs; mxfp4 measured no faster and keeps three)\n");
    fmt::print("{:<8} {:<18} {:>7} {:>10} {:>12} {:>8} {:>12} {:>8} {:>8}\n", "type", "model (d x f)", "experts", "MiB/exp",
               "3 launches", "of HBM", "2 launches", "of HBM", "speedup");
    for (const auto &r : ffn)
      fmt::print("{:<8} {:<18} {:>7} {:>10.2f} {:>12.0f} {:>8.3f} {:>12.0f} {:>8.3f} {:>8.2f}\n", r.type,
                 fmt::format("{}x{}", r.model->d, r.model->f), r.experts, static_cast<double>(r.expert_bytes) / (1 << 20),
                 r.three_gbps, r.three_gbps / hbm, r.two_gbps, r.two_gbps / hbm, r.two_gbps / r.three_gbps);
  }
  if (o.ffn_only) return 0;
  std::string token_list;
  for (int t : o.gemv_tokens) {
    if (!token_list.empty()) token_list += ',';
    token_list += std::to_string(t);
  }
  fmt::print("\ndecode GEMV: {} experts per launch by expert shape (and 1; dense shapes: the mats column), {} token(s){}\n",
             fmt::format("{}/{}/{}/{}", o.batch[0], o.batch[1], o.batch[2], o.batch[3]), token_list,
             o.graph ? ", launches replayed from a CUDA graph" : "");
  // tok: tokens per launch; us: time per launch (mats matrices); x1: that time over the same
  // kernel request's one-token launch (when 1 is in --gemv-tokens)
  fmt::print("{:<8} {:>12} {:>9} {:<18} {:>3} {:>9} {:>6} {:>10} {:>8} {:>10} {:>8} {:>5}  {}\n", "type", "K x N", "MiB/mat",
             "kernel", "tok", "us", "x1", "GEMV GB/s", "of HBM", "batch1", "of HBM", "mats", "matrix");
  for (const auto &r : results)
    for (const auto &g : r.gemv) {
      double one_us = 0;
      for (const auto &o1 : r.gemv)
        if (o1.want == g.want && o1.tokens == 1) one_us = o1.us;
      fmt::print("{:<8} {:>12} {:>9.2f} {:<18} {:>3} {:>9.2f} {:>6} {:>10.0f} {:>8.3f} {:>10.0f} {:>8.3f} {:>5}  {}\n", r.type,
                 fmt::format("{}x{}", r.shape.k, r.shape.n), static_cast<double>(r.matrix_bytes) / (1 << 20), g.kernel, g.tokens,
                 g.us, one_us > 0 ? fmt::format("{:.2f}", g.us / one_us) : std::string("-"), g.gbps, g.gbps / hbm,
                 g.batch1_gbps, g.batch1_gbps / hbm, r.batch, r.shape.what);
    }
  if (!o.gemm) return 0;
  // the prefill GEMM per mode: TFLOP/s (2·K·N·tokens per call, the dequantization included) and
  // that over cuBLAS bf16's rate at the same shape and token count
  fmt::print("\nprefill GEMM: {} tokens through CudaBackend::matmul_gemm, TFLOP/s and the fraction of cuBLAS bf16 at the "
             "shape (split: f16 halves on tensor cores, the exact default; exact: f32 + SGEMM without TF32; bf16: weights "
             "and x rounded to bf16, the opt-in)\n",
             o.prefill_tokens);
  fmt::print("{:<8} {:>12} {:>11}", "type", "K x N", "cuBLAS bf16");
  for (const auto mode : o.gemm_modes) fmt::print(" {:>10} {:>7}", fmt::format("{} TF/s", ep::backend::cuda::gemm_mode_name(mode)), "of bf16");
  fmt::print("  {}\n", "matrix");
  for (const auto &r : results) {
    fmt::print("{:<8} {:>12} {:>11.1f}", r.type, fmt::format("{}x{}", r.shape.k, r.shape.n), r.cublas_tflops);
    for (size_t m = 0; m < o.gemm_modes.size(); ++m) fmt::print(" {:>10.1f} {:>7.3f}", r.gemm_tflops[m], r.gemm_tflops[m] / r.cublas_tflops);
    fmt::print("  {}\n", r.shape.what);
  }
  return 0;
}

}  // namespace

int cmd_kernels(const Args &args) { return run(options_from(args)); }

}  // namespace ep::bench
