#include "backend/cuda/cuda_backend.hpp"

#include "core/error.hpp"
#include "gpu/check.hpp"
#include "backend/cuda/kernels.hpp"

#include <cublas_v2.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <string_view>
#include <tuple>
#include <vector>

namespace ep::backend::cuda {

using backend::Device;
using backend::GgmlType;
using backend::Tensor;

namespace {

void check_cublas(cublasStatus_t status, const char *what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail(Status::cuda, "{}: cuBLAS error {} ({})", what, cublasGetStatusString(status), static_cast<int>(status));
}

uint32_t type_id(GgmlType t) { return static_cast<uint32_t>(t); }

// Workspace slots
enum : unsigned {
  kWsTables = 0, kWsXBf16 = 1, kWsWBf16 = 2, kWsGate = 3, kWsUp = 4, kWsOut = 5,
  // 6, 7: Backend::ffn
  kWsGather = 8, kWsSample = 9, kWsToken = 10, kWsPairs = 11,
  // 12: attention_sinks split partials (cuda_backend_deepseek_v4.cpp)
  kWsGroupX = 13, kWsGroupY = 14,  // grouped_matmul of several tokens
  kWsSampleRows = 15,               // sample_rows: the rows' arguments and lists, uploaded in one copy
  kWsCount = 16,
};
constexpr uint64_t kDequantChunkBytes = uint64_t{64} << 20;  // dequantized weight rows per cuBLAS call
constexpr uint64_t kUploadRingBytes = uint64_t{16} << 20;   // pinned staging of upload()
constexpr uint64_t kUploadAlign = 256;
constexpr unsigned kHostBufferSlots = 4;

/// The weight types launch_gemv runs (the decode MoE reads the role table directly only then).
bool gemv_has_kernel(GgmlType t) { return gemv_runs_type(static_cast<uint32_t>(t)); }

}  // namespace

struct CudaBackend::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  std::vector<void *> ws = std::vector<void *>(kWsCount, nullptr);
  std::vector<uint64_t> ws_bytes = std::vector<uint64_t>(kWsCount, 0);
  GemmMode gemm_mode = GemmMode::split_f16;
  // Uploads are staged in pinned memory so that they return without waiting for the device:
  // a ring of kUploadRingBytes; a span is reused only after the event recorded behind its copy.
  struct UploadSpan {
    uint64_t begin = 0, end = 0;
    cudaEvent_t done = nullptr;
  };
  std::byte *upload_ring = nullptr;
  uint64_t upload_head = 0;
  std::deque<UploadSpan> uploads_in_flight;
  std::vector<cudaEvent_t> free_events;
  // download_async(): pinned destinations (host_buffer) and the event behind the last copy.
  std::vector<void *> host_buffers = std::vector<void *>(kHostBufferSlots, nullptr);
  std::vector<uint64_t> host_buffer_bytes = std::vector<uint64_t>(kHostBufferSlots, 0);
  cudaEvent_t download_done = nullptr;
  // wait_for(): recorded on this stream for another backend's stream to wait on.
  cudaEvent_t order = nullptr;
  // The x row of every GEMV matrix of a decode MoE batch, per (pairs, k): launch_pair_tokens.
  std::map<std::pair<int64_t, int32_t>, void *> pair_tokens;
  // The grouped (prefill) MoE path's per-expert token and pair lists (uploaded per call).
  std::vector<int32_t> group_lists;
  // grouped_matmul(): the row blocks' addresses of each weight, in device memory, per (address,
  // groups, bytes of a group's block): a weight freed and another allocated at its address with
  // another type or shape gets its own table, never the stale one's offsets.
  std::map<std::tuple<const void *, int64_t, uint64_t>, void *> group_tables;
  // grouped_matmul() of several tokens, per (groups, tokens): the gather / scatter rows, then
  // each group's first x row.
  std::map<std::pair<int64_t, int64_t>, void *> group_rows;

  cudaEvent_t take_event() {
    if (free_events.empty()) {
      cudaEvent_t e = nullptr;
      EP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      return e;
    }
    cudaEvent_t e = free_events.back();
    free_events.pop_back();
    return e;
  }
};

CudaBackend::CudaBackend(int device_index) : impl_(std::make_unique<Impl>()) {
  // checked before anything is created (a throwing constructor runs no destructor)
  if (const char *env = std::getenv("EP_CUDA_GEMM"); env && !parse_gemm_mode(env, impl_->gemm_mode))
    fail(Status::invalid_argument, "EP_CUDA_GEMM is '{}': expected split (the default), exact or bf16", env);
  impl_->device = device_index;
  EP_CUDA_CHECK(cudaSetDevice(device_index));
  EP_CUDA_CHECK(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking));
  check_cublas(cublasCreate(&impl_->cublas), "cublasCreate");
  check_cublas(cublasSetStream(impl_->cublas, impl_->stream), "cublasSetStream");
  void *ring = nullptr;
  EP_CUDA_CHECK(cudaHostAlloc(&ring, kUploadRingBytes, cudaHostAllocPortable));
  impl_->upload_ring = static_cast<std::byte *>(ring);
  EP_CUDA_CHECK(cudaEventCreateWithFlags(&impl_->download_done, cudaEventDisableTiming));
  EP_CUDA_CHECK(cudaEventCreateWithFlags(&impl_->order, cudaEventDisableTiming));
}

CudaBackend::~CudaBackend() {
  if (impl_->stream) cudaStreamSynchronize(impl_->stream);
  for (void *p : impl_->ws)
    if (p) cudaFree(p);
  for (const auto &span : impl_->uploads_in_flight) cudaEventDestroy(span.done);
  for (cudaEvent_t e : impl_->free_events) cudaEventDestroy(e);
  if (impl_->download_done) cudaEventDestroy(impl_->download_done);
  if (impl_->order) cudaEventDestroy(impl_->order);
  if (impl_->upload_ring) cudaFreeHost(impl_->upload_ring);
  for (void *p : impl_->host_buffers)
    if (p) cudaFreeHost(p);
  for (auto &[key, p] : impl_->pair_tokens) cudaFree(p);
  for (auto &[key, p] : impl_->group_tables) cudaFree(p);
  for (auto &[key, p] : impl_->group_rows) cudaFree(p);
  if (impl_->cublas) cublasDestroy(impl_->cublas);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

cudaStream_t CudaBackend::stream() const noexcept { return impl_->stream; }

void *CudaBackend::allocate(uint64_t bytes) {
  void *p = nullptr;
  EP_CUDA_CHECK(cudaMalloc(&p, std::max<uint64_t>(bytes, 256)));
  return p;
}
void CudaBackend::deallocate(void *ptr) noexcept {
  if (ptr) {
    cudaStreamSynchronize(impl_->stream);
    cudaFree(ptr);
  }
}
void CudaBackend::upload(void *dst, const void *src, uint64_t bytes) {
  if (bytes == 0) return;
  Impl &m = *impl_;
  if (bytes > kUploadRingBytes / 4) {
    // Large uploads are weights at load time: from pageable memory, waited for.
    EP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, m.stream));
    EP_CUDA_CHECK(cudaStreamSynchronize(m.stream));
    return;
  }
  uint64_t begin = m.upload_head;
  if (begin + bytes > kUploadRingBytes) begin = 0;
  const uint64_t end = begin + bytes;
  // Spans complete in the order they were queued (one stream): wait for the oldest until no
  // span in flight overlaps [begin, end).
  auto overlaps = [&] {
    for (const auto &span : m.uploads_in_flight)
      if (span.begin < end && begin < span.end) return true;
    return false;
  };
  while (overlaps()) {
    Impl::UploadSpan oldest = m.uploads_in_flight.front();
    m.uploads_in_flight.pop_front();
    EP_CUDA_CHECK(cudaEventSynchronize(oldest.done));
    m.free_events.push_back(oldest.done);
  }
  std::memcpy(m.upload_ring + begin, src, bytes);
  EP_CUDA_CHECK(cudaMemcpyAsync(dst, m.upload_ring + begin, bytes, cudaMemcpyHostToDevice, m.stream));
  Impl::UploadSpan span{begin, end, m.take_event()};
  EP_CUDA_CHECK(cudaEventRecord(span.done, m.stream));
  m.uploads_in_flight.push_back(span);
  m.upload_head = (end + kUploadAlign - 1) / kUploadAlign * kUploadAlign;
}
void CudaBackend::download(void *dst, const void *src, uint64_t bytes) {
  EP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, impl_->stream));
  EP_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
}
void *CudaBackend::host_buffer(unsigned slot, uint64_t bytes) {
  if (slot >= kHostBufferSlots) fail(Status::internal, "cuda host buffer slot {} out of range", slot);
  Impl &m = *impl_;
  if (m.host_buffer_bytes[slot] < bytes) {
    if (m.host_buffers[slot]) {
      EP_CUDA_CHECK(cudaStreamSynchronize(m.stream));  // a download_async may still write it
      EP_CUDA_CHECK(cudaFreeHost(m.host_buffers[slot]));
      m.host_buffers[slot] = nullptr;
      m.host_buffer_bytes[slot] = 0;
    }
    const uint64_t grown = std::max<uint64_t>(bytes, 4096);
    EP_CUDA_CHECK(cudaHostAlloc(&m.host_buffers[slot], grown, cudaHostAllocPortable));
    m.host_buffer_bytes[slot] = grown;
  }
  return m.host_buffers[slot];
}
void CudaBackend::download_async(void *dst, const void *src, uint64_t bytes) {
  EP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, impl_->stream));
  EP_CUDA_CHECK(cudaEventRecord(impl_->download_done, impl_->stream));
}
void CudaBackend::wait_downloads() { EP_CUDA_CHECK(cudaEventSynchronize(impl_->download_done)); }
void CudaBackend::fill_zero(void *dst, uint64_t bytes) { EP_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, impl_->stream)); }
void CudaBackend::synchronize() { EP_CUDA_CHECK(cudaStreamSynchronize(impl_->stream)); }
void CudaBackend::make_current() { EP_CUDA_CHECK(cudaSetDevice(impl_->device)); }
int CudaBackend::device_index() const noexcept { return impl_->device; }

namespace {
CudaBackend &cuda_peer(backend::Backend &other) {
  auto *peer = dynamic_cast<CudaBackend *>(&other);
  if (!peer)
    fail(Status::invalid_argument, "cuda backend: ordered after a {} backend (the devices of a model are of one kind)",
         backend::device_name(other.device()));
  return *peer;
}
}  // namespace

void CudaBackend::wait_for(backend::Backend &other) {
  CudaBackend &peer = cuda_peer(other);
  if (&peer == this) return;
  // The event and the stream it is recorded on are the peer's (one device); waiting on it may cross devices.
  EP_CUDA_CHECK(cudaEventRecord(peer.impl_->order, peer.impl_->stream));
  EP_CUDA_CHECK(cudaStreamWaitEvent(impl_->stream, peer.impl_->order, 0));
}
void CudaBackend::copy_from(backend::Backend &from, void *dst, const void *src, uint64_t bytes) {
  CudaBackend &peer = cuda_peer(from);
  if (bytes == 0) return;
  EP_CUDA_CHECK(cudaMemcpyPeerAsync(dst, impl_->device, src, peer.impl_->device, bytes, impl_->stream));
}

void *CudaBackend::workspace(unsigned slot, uint64_t bytes) {
  if (slot >= kWsCount) fail(Status::internal, "cuda workspace slot {} out of range", slot);
  if (impl_->ws_bytes[slot] < bytes) {
    if (impl_->ws[slot]) {
      EP_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
      EP_CUDA_CHECK(cudaFree(impl_->ws[slot]));
      impl_->ws[slot] = nullptr;
      impl_->ws_bytes[slot] = 0;
    }
    const uint64_t grown = std::max<uint64_t>(bytes, 4096);
    EP_CUDA_CHECK(cudaMalloc(&impl_->ws[slot], grown));
    impl_->ws_bytes[slot] = grown;
  }
  return impl_->ws[slot];
}

const char *gemm_mode_name(GemmMode mode) noexcept {
  switch (mode) {
    case GemmMode::exact_f32: return "exact";
    case GemmMode::fast_bf16: return "bf16";
    case GemmMode::split_f16: return "split";
  }
  return "?";
}

bool parse_gemm_mode(const char *name, GemmMode &out) noexcept {
  if (!name) return false;
  for (GemmMode m : {GemmMode::split_f16, GemmMode::exact_f32, GemmMode::fast_bf16}) {
    if (std::string_view(name) == gemm_mode_name(m)) {
      out = m;
      return true;
    }
  }
  return false;
}

void CudaBackend::set_gemm_mode(GemmMode mode) noexcept { impl_->gemm_mode = mode; }
GemmMode CudaBackend::gemm_mode() const noexcept { return impl_->gemm_mode; }

void CudaBackend::matmul_gemm(const Tensor &w, const Tensor &x, const Tensor &y) { matmul_gemm(w, x, y, impl_->gemm_mode); }

void CudaBackend::matmul_gemm(const Tensor &w, const Tensor &x, const Tensor &y, GemmMode mode) {
  backend::check_matmul(w, x, y, Device::cuda);
  const int64_t k = w.ne[0], n = w.ne[1], t = x.n_rows();
  const float one = 1.0f, zero = 0.0f;
  const uint64_t row_bytes = w.row_bytes();
  if (mode == GemmMode::split_f16) {
    // x and each chunk of weight rows as f16 halves at their powers of two (split_f16.cuh), one
    // f16 GEMM of 3k per chunk (W_hi·x_lo + W_lo·x_hi + W_hi·x_hi in f32), then the scales undone
    // over all of y in one launch. kWsXBf16: the tokens' exponents, the rows', then x's halves.
    if (k % 32 != 0)
      fail(Status::shape, "matmul: the split f16 GEMM takes rows of a multiple of 32 values; W [{}, {}] of ggml type {} has {}",
           k, n, type_id(w.type), k);
    const uint64_t exps_bytes = (static_cast<uint64_t>(t + n) * 4 + 255) / 256 * 256;
    auto *ws = static_cast<uint8_t *>(workspace(kWsXBf16, exps_bytes + static_cast<uint64_t>(t) * 3 * k * 2));
    auto *tok_exps = reinterpret_cast<int32_t *>(ws);
    int32_t *row_exps = tok_exps + t;
    auto *xs = reinterpret_cast<uint16_t *>(ws + exps_bytes);
    // tensor cores, f32 accumulation (the exact mode sets pedantic math for its own call only)
    check_cublas(cublasSetMathMode(impl_->cublas, CUBLAS_DEFAULT_MATH), "matmul: cublasSetMathMode");
    launch_split_tokens(x.as<float>(), k, t, xs, tok_exps, impl_->stream);
    // rows per chunk a multiple of 8 where there are several chunks (16-byte aligned y columns)
    int64_t rows_per_chunk = std::max<int64_t>(1, std::min<int64_t>(n, kDequantChunkBytes / (static_cast<uint64_t>(k) * 6)));
    if (rows_per_chunk < n && rows_per_chunk > 8) rows_per_chunk -= rows_per_chunk % 8;
    auto *wsplit = static_cast<uint16_t *>(workspace(kWsWBf16, static_cast<uint64_t>(rows_per_chunk) * 3 * k * 2));
    for (int64_t r0 = 0; r0 < n; r0 += rows_per_chunk) {
      const int64_t rows = std::min(rows_per_chunk, n - r0);
      launch_dequant_rows_split(type_id(w.type), w.as<uint8_t>() + r0 * row_bytes, k, rows, wsplit, row_exps + r0,
                                impl_->stream);
      check_cublas(cublasGemmEx(impl_->cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(t),
                                static_cast<int>(3 * k), &one, wsplit, CUDA_R_16F, static_cast<int>(3 * k), xs, CUDA_R_16F,
                                static_cast<int>(3 * k), &zero, y.as<float>() + r0, CUDA_R_32F, static_cast<int>(n),
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "matmul: cublasGemmEx split f16");
    }
    launch_unscale_split(y.as<float>(), n, t, row_exps, tok_exps, impl_->stream);
    return;
  }
  if (w.type == GgmlType::f32 || mode == GemmMode::exact_f32) {
    // f32 weights (dequantized in chunks unless they are f32 already) and SGEMM without TF32.
    check_cublas(cublasSetMathMode(impl_->cublas, CUBLAS_PEDANTIC_MATH), "matmul: cublasSetMathMode");
    const int64_t rows_per_chunk =
        w.type == GgmlType::f32 ? n
                                : std::max<int64_t>(1, std::min<int64_t>(n, kDequantChunkBytes / (static_cast<uint64_t>(k) * 4)));
    float *wf = w.type == GgmlType::f32
                    ? nullptr
                    : static_cast<float *>(workspace(kWsWBf16, static_cast<uint64_t>(rows_per_chunk * k) * 4));
    for (int64_t r0 = 0; r0 < n; r0 += rows_per_chunk) {
      const int64_t rows = std::min(rows_per_chunk, n - r0);
      const float *a = w.type == GgmlType::f32 ? w.as<float>() + r0 * k : wf;
      if (w.type != GgmlType::f32)
        launch_dequant_rows(type_id(w.type), w.as<uint8_t>() + r0 * row_bytes, k, rows, wf, nullptr, impl_->stream);
      check_cublas(cublasSgemm(impl_->cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(t),
                               static_cast<int>(k), &one, a, static_cast<int>(k), x.as<float>(), static_cast<int>(k), &zero,
                               y.as<float>() + r0, static_cast<int>(n)),
                   "matmul: cublasSgemm");
    }
    check_cublas(cublasSetMathMode(impl_->cublas, CUBLAS_DEFAULT_MATH), "matmul: cublasSetMathMode");
    return;
  }
  auto *xb = static_cast<uint16_t *>(workspace(kWsXBf16, static_cast<uint64_t>(k * t) * 2));
  launch_f32_to_bf16(x.as<float>(), xb, k * t, impl_->stream);
  const int64_t rows_per_chunk = std::max<int64_t>(1, std::min<int64_t>(n, kDequantChunkBytes / (static_cast<uint64_t>(k) * 2)));
  auto *wb = static_cast<uint16_t *>(workspace(kWsWBf16, static_cast<uint64_t>(rows_per_chunk * k) * 2));
  for (int64_t r0 = 0; r0 < n; r0 += rows_per_chunk) {
    const int64_t rows = std::min(rows_per_chunk, n - r0);
    if (w.type == GgmlType::bf16) {
      EP_CUDA_CHECK(cudaMemcpyAsync(wb, w.as<uint8_t>() + r0 * row_bytes, rows * row_bytes, cudaMemcpyDeviceToDevice,
                                    impl_->stream));
    } else {
      launch_dequant_rows(type_id(w.type), w.as<uint8_t>() + r0 * row_bytes, k, rows, nullptr, wb, impl_->stream);
    }
    check_cublas(cublasGemmEx(impl_->cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(t),
                              static_cast<int>(k), &one, wb, CUDA_R_16BF, static_cast<int>(k), xb, CUDA_R_16BF,
                              static_cast<int>(k), &zero, y.as<float>() + r0, CUDA_R_32F, static_cast<int>(n),
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "matmul: cublasGemmEx bf16");
  }
}

void CudaBackend::matmul(const Tensor &w, const Tensor &x, const Tensor &y) {
  backend::check_matmul(w, x, y, Device::cuda);
  const int64_t t = x.n_rows();
  const bool plain = w.type == GgmlType::f32 || w.type == GgmlType::f16 || w.type == GgmlType::bf16;
  if (plain && w.ne[0] % 32 != 0)  // rows the GEMV / dequant kernels cannot take (tiny test models)
    return launch_matmul_plain(type_id(w.type), w.data, x.as<float>(), y.as<float>(), w.ne[0], w.ne[1], t, impl_->stream);
  // Types without a GEMV kernel take dequantization + cuBLAS for every token count.
  if (!gemv_runs_type(type_id(w.type))) return matmul_gemm(w, x, y);
  GemvArgs a;
  a.w = w.data;
  a.x = x.as<float>();
  a.y = y.as<float>();
  a.k = w.ne[0];
  a.n = w.ne[1];
  a.n_tok = static_cast<int32_t>(std::min<int64_t>(t, kGemvMaxTokens));
  a.n_mat = 1;
  if (t <= kGemvMaxTokens) return launch_gemv(type_id(w.type), a, impl_->stream);
  // More tokens than one GEMV launch takes: up to kChunkedGemvMaxTokens, launches of
  // kGemvMaxTokens tokens each (the last one shorter) where that launch's kernel reads the
  // weights once for all its tokens (the row and tensor-core kernels: a batched decode step of
  // 9-32 sessions costs a few weight reads, where dequantizing every dense matrix for a GEMM cost
  // more than the product); beyond, or where the kernel computes per token, the GEMM.
  if (t > kChunkedGemvMaxTokens) return matmul_gemm(w, x, y);
  const GemvKernel chunk_kernel = gemv_kernel_for(type_id(w.type), a);
  if (chunk_kernel != GemvKernel::rows && chunk_kernel != GemvKernel::mma) return matmul_gemm(w, x, y);
  for (int64_t t0 = 0; t0 < t; t0 += kGemvMaxTokens) {
    a.x = x.as<float>() + t0 * w.ne[0];
    a.y = y.as<float>() + t0 * w.ne[1];
    a.n_tok = static_cast<int32_t>(std::min<int64_t>(t - t0, kGemvMaxTokens));
    launch_gemv(type_id(w.type), a, impl_->stream);
  }
}

void CudaBackend::grouped_matmul(const Tensor &w, int64_t groups, const Tensor &x, const Tensor &y) {
  backend::check_f32(x, "grouped_matmul", "x", Device::cuda);
  backend::check_f32(y, "grouped_matmul", "y", Device::cuda);
  const int64_t k = w.ne[0], t = x.n_rows();
  const bool plain = w.type == GgmlType::f32 || w.type == GgmlType::f16 || w.type == GgmlType::bf16;
  // One GEMV launch over the groups for q8_0 (DeepSeek-V4's o_a) and the float types, whose row
  // kernels read each group's input at its matrix-m offset; the quantized families' kernels read
  // theirs through x_rows only (on the H100, q2_K's gave non-finite rows here): the default path.
  if (t < 1 || t > kGemvMaxTokens || groups <= 0 || groups > 65535 || w.ne[1] % groups != 0 || !gemv_has_kernel(w.type) ||
      !(plain || w.type == GgmlType::q8_0) || (plain && k % 32 != 0))
    return Backend::grouped_matmul(w, groups, x, y);
  if (x.ne[0] != groups * k || y.ne[0] != w.ne[1] || y.n_rows() != t)
    fail(Status::shape, "grouped_matmul: W [{}, {}] in {} groups · x [{}, {}] → y [{}, {}] do not fit", w.ne[0], w.ne[1], groups,
         x.ne[0], t, y.ne[0], y.n_rows());
  // One token: group g's input is x[g·K ..] and its output y[g·O ..], exactly the GEMV's
  // matrix-m layout, so one launch covers every group. Several tokens: x [t][groups·K] is
  // gathered to [groups][t][K] (a group's tokens adjacent, as the GEMV reads them), one launch
  // covers every group, and its y [groups][t][O] is scattered back to [t][groups·O]: three
  // launches instead of a copy, a GEMV and a copy per group.
  const int64_t o = w.ne[1] / groups;
  const uint64_t block_bytes = w.row_bytes() * static_cast<uint64_t>(o);
  void *&table = impl_->group_tables[{w.data, groups, block_bytes}];
  if (!table) {
    std::vector<const void *> blocks(static_cast<size_t>(groups));
    for (int64_t g = 0; g < groups; ++g) blocks[static_cast<size_t>(g)] = static_cast<const uint8_t *>(w.data) + g * block_bytes;
    EP_CUDA_CHECK(cudaMalloc(&table, blocks.size() * sizeof(void *)));
    upload(table, blocks.data(), blocks.size() * sizeof(void *));
  }
  GemvArgs a;
  a.w_ptrs = static_cast<const void *const *>(table);
  a.w_ptrs_aligned16 = (reinterpret_cast<uintptr_t>(w.data) & 15) == 0 && (w.row_bytes() * static_cast<uint64_t>(o)) % 16 == 0;
  a.x = x.as<float>();
  a.y = y.as<float>();
  a.k = k;
  a.n = o;
  a.n_tok = static_cast<int32_t>(t);
  a.n_mat = static_cast<int32_t>(groups);
  if (t == 1) return launch_gemv(type_id(w.type), a, impl_->stream);
  const int64_t n_rows = groups * t;
  void *&rows_dev = impl_->group_rows[{groups, t}];
  if (!rows_dev) {
    // rows[g·t + i] = i·groups + g: row g·t + i of the grouped layout is row i·groups + g of x's
    // (and of y's), K (O) values per row; then rows[n_rows + g] = g·t, group g's first x row
    std::vector<int32_t> rows(static_cast<size_t>(n_rows + groups));
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t i = 0; i < t; ++i) rows[static_cast<size_t>(g * t + i)] = static_cast<int32_t>(i * groups + g);
      rows[static_cast<size_t>(n_rows + g)] = static_cast<int32_t>(g * t);
    }
    EP_CUDA_CHECK(cudaMalloc(&rows_dev, rows.size() * 4));
    upload(rows_dev, rows.data(), rows.size() * 4);
  }
  const auto *rows = static_cast<const int32_t *>(rows_dev);
  auto *xg = static_cast<float *>(workspace(kWsGroupX, static_cast<uint64_t>(n_rows * k) * 4));
  auto *yg = static_cast<float *>(workspace(kWsGroupY, static_cast<uint64_t>(n_rows * o) * 4));
  launch_gather_rows(x.as<float>(), rows, k, n_rows, xg, impl_->stream);
  a.x = xg;
  a.x_rows = rows + n_rows;
  a.y = yg;
  launch_gemv(type_id(w.type), a, impl_->stream);
  launch_scatter_rows(yg, rows, o, n_rows, y.as<float>(), impl_->stream);
}

void CudaBackend::rms_norm(const Tensor &x, const Tensor *weight, float eps, const Tensor &y) {
  backend::check_f32(x, "rms_norm", "x", Device::cuda);
  backend::check_f32(y, "rms_norm", "y", Device::cuda);
  backend::check_same_shape(x, y, "rms_norm");
  if (weight) {
    backend::check_f32(*weight, "rms_norm", "weight", Device::cuda);
    if (weight->n_elems() != x.ne[0])
      fail(Status::shape, "rms_norm: weight has {} values, rows have {}", weight->n_elems(), x.ne[0]);
  }
  launch_rms_norm(x.as<float>(), weight ? weight->as<float>() : nullptr, eps, x.ne[0], x.n_rows(), y.as<float>(),
                  impl_->stream);
}

void CudaBackend::rope(const Tensor &x, const Tensor &positions, const backend::RopeParams &p, const Tensor &y) {
  backend::check_f32(x, "rope", "x", Device::cuda);
  backend::check_f32(y, "rope", "y", Device::cuda);
  backend::check_i32(positions, "rope", "positions", Device::cuda);
  backend::check_same_shape(x, y, "rope");
  RopeArgs a;
  a.head_dim = x.ne[0];
  a.n_heads = x.ne[1];
  a.n_tokens = x.ne[2] * x.ne[3];
  if (positions.n_elems() != a.n_tokens)
    fail(Status::shape, "rope: {} positions for {} tokens", positions.n_elems(), a.n_tokens);
  const std::vector<float> inv = backend::rope_inv_freq(p, static_cast<int32_t>(a.head_dim));
  if (inv.size() > static_cast<size_t>(kRopeMaxPairs))
    fail(Status::unsupported, "rope: {} rotated pairs, at most {}", inv.size(), kRopeMaxPairs);
  std::copy(inv.begin(), inv.end(), a.inv_freq);
  a.n_pairs = static_cast<int32_t>(inv.size());
  a.dim_offset = p.dim_offset;
  a.attention_factor = p.attention_factor;
  a.inverse = p.inverse ? 1 : 0;
  launch_rope(x.as<float>(), positions.as<int32_t>(), a, y.as<float>(), impl_->stream);
}

void CudaBackend::embed(const Tensor &table, const Tensor &ids, const Tensor &y) {
  backend::check_weight_type(table.type, "embed");
  backend::check_i32(ids, "embed", "ids", Device::cuda);
  backend::check_f32(y, "embed", "y", Device::cuda);
  if (table.device != Device::cuda) fail(Status::invalid_argument, "embed: table is not on cuda");
  if (y.ne[0] != table.ne[0] || y.n_rows() != ids.n_elems())
    fail(Status::shape, "embed: table rows of {} and {} ids do not fit y [{}, {}]", table.ne[0], ids.n_elems(), y.ne[0],
         y.n_rows());
  launch_embed(type_id(table.type), table.data, table.ne[0], table.ne[1], ids.as<int32_t>(), ids.n_elems(),
               y.as<float>(), impl_->stream);
}

void CudaBackend::softmax(const Tensor &x, const Tensor &y) {
  backend::check_f32(x, "softmax", "x", Device::cuda);
  backend::check_f32(y, "softmax", "y", Device::cuda);
  backend::check_same_shape(x, y, "softmax");
  launch_softmax(x.as<float>(), x.ne[0], x.n_rows(), y.as<float>(), impl_->stream);
}

void CudaBackend::top_k(const Tensor &x, int32_t k, const Tensor &indices, const Tensor &values) {
  backend::check_f32(x, "top_k", "x", Device::cuda);
  backend::check_i32(indices, "top_k", "indices", Device::cuda);
  backend::check_f32(values, "top_k", "values", Device::cuda);
  if (k <= 0 || k > x.ne[0] || indices.ne[0] != k || values.ne[0] != k || indices.n_rows() != x.n_rows() ||
      values.n_rows() != x.n_rows())
    fail(Status::shape, "top_k: k = {} of rows of {} does not fit indices [{}, {}] / values [{}, {}]", k, x.ne[0],
         indices.ne[0], indices.n_rows(), values.ne[0], values.n_rows());
  launch_top_k(x.as<float>(), x.ne[0], x.n_rows(), k, indices.as<int32_t>(), values.as<float>(), impl_->stream);
}

void CudaBackend::glu(const Tensor &gate, const Tensor &up, const backend::Activation &act, const Tensor &y) {
  backend::check_f32(gate, "glu", "gate", Device::cuda);
  backend::check_f32(up, "glu", "up", Device::cuda);
  backend::check_f32(y, "glu", "y", Device::cuda);
  backend::check_same_shape(gate, up, "glu");
  backend::check_same_shape(gate, y, "glu");
  launch_glu(gate.as<float>(), up.as<float>(), y.n_elems(), static_cast<int32_t>(act.kind), act.limit, act.beta_g,
             act.beta_u, y.as<float>(), impl_->stream);
}

void CudaBackend::add(const Tensor &a, const Tensor &b, const Tensor &y) {
  backend::check_f32(a, "add", "a", Device::cuda);
  backend::check_f32(b, "add", "b", Device::cuda);
  backend::check_f32(y, "add", "y", Device::cuda);
  backend::check_same_shape(a, b, "add");
  backend::check_same_shape(a, y, "add");
  launch_add(a.as<float>(), b.as<float>(), y.n_elems(), y.as<float>(), impl_->stream);
}

void CudaBackend::route(const Tensor &logits, const backend::RouterParams &p, const Tensor &expert_ids,
                        const Tensor &weights) {
  backend::check_f32(logits, "route", "logits", Device::cuda);
  backend::check_i32(expert_ids, "route", "expert_ids", Device::cuda);
  backend::check_f32(weights, "route", "weights", Device::cuda);
  const int64_t n_exp = logits.ne[0], n_tok = logits.n_rows();
  if (p.k <= 0 || p.k > n_exp || expert_ids.ne[0] != p.k || weights.ne[0] != p.k || expert_ids.n_rows() != n_tok ||
      weights.n_rows() != n_tok)
    fail(Status::shape, "route: k = {} of {} experts for {} tokens does not fit ids [{}, {}] / weights [{}, {}]", p.k,
         n_exp, n_tok, expert_ids.ne[0], expert_ids.n_rows(), weights.ne[0], weights.n_rows());
  RouteArgs a;
  a.scoring = static_cast<int32_t>(p.scoring);
  a.k = p.k;
  a.renormalize = p.renormalize ? 1 : 0;
  a.scale = p.scale;
  if (p.bias) {
    backend::check_f32(*p.bias, "route", "bias", Device::cuda);
    if (p.bias->n_elems() != n_exp) fail(Status::shape, "route: bias has {} values for {} experts", p.bias->n_elems(), n_exp);
    a.bias = p.bias->as<float>();
  }
  if (p.hash_table) {
    backend::check_i32(*p.hash_table, "route", "hash_table", Device::cuda);
    if (!p.token_ids) fail(Status::invalid_argument, "route: hash routing needs token_ids");
    backend::check_i32(*p.token_ids, "route", "token_ids", Device::cuda);
    if (p.hash_table->ne[0] != p.k || p.token_ids->n_elems() != n_tok)
      fail(Status::shape, "route: hash table rows of {} / {} token ids for k = {} and {} tokens", p.hash_table->ne[0],
           p.token_ids->n_elems(), p.k, n_tok);
    a.hash_table = p.hash_table->as<int32_t>();
    a.token_ids = p.token_ids->as<int32_t>();
    a.hash_vocab = p.hash_table->ne[1];
  }
  launch_route(logits.as<float>(), n_exp, n_tok, a, expert_ids.as<int32_t>(), weights.as<float>(), impl_->stream);
}

namespace {

// Whether a prompt's routed experts run faster as one-token GEMVs over their (token, expert)
// pairs than in chunks of kGemvMaxTokens tokens per expert: when a role's chunk launch would
// fall to a per-lane kernel (pipe or generic) while one token runs the dp4a family. Reading an
// expert once per token at the dp4a family's speed is still many times faster than the per-lane
// kernels on chunks. Every type with a dp4a-family kernel has a tensor-core one now (IQ2_XXS
// since it joined the mma family: its chunks read each expert once per 8 tokens), so chunks
// win for every type of the table; the rule stays for a type that gets the one without the other.
bool one_token_gemvs_beat_chunks(const backend::SlotLayout &l) {
  static const void *const kTable[1] = {nullptr};  // any table: the kernels' choice only asks whether there is one
  const backend::SlotWeight *roles[3] = {&l.gate, &l.up, &l.down};
  for (const backend::SlotWeight *w : roles)
    if (!gemv_runs_type(type_id(w->type)) || w->ne0 % 32 != 0) return false;
  for (const backend::SlotWeight *w : roles) {
    GemvArgs a;
    a.w_ptrs = kTable;
    a.k = w->ne0;
    a.n = w->ne1;
    a.n_tok = kGemvMaxTokens;
    const GemvKernel chunk = gemv_kernel_for(type_id(w->type), a);
    a.n_tok = 1;
    const GemvKernel one = gemv_kernel_for(type_id(w->type), a);
    if ((chunk == GemvKernel::pipe || chunk == GemvKernel::generic) && (one == GemvKernel::stream || one == GemvKernel::dp4a))
      return true;
  }
  return false;
}

// The chunk sizes of run_chunked_expert_gemvs: kGemvMaxTokens, and where all three roles run
// wide (gemv_runs_wide: the tensor-core kernel) 16 and kGemvMaxWideTokens, whose launches use
// each decoded weight fragment for 2 and 4 tiles of 8 tokens.
constexpr int kChunkSizes = 3;
constexpr int64_t kChunkSize[kChunkSizes] = {kGemvMaxTokens, 2 * kGemvMaxTokens, kGemvMaxWideTokens};
static_assert(kGemvMaxWideTokens == 4 * kGemvMaxTokens, "expert_chunks' sizes");

bool expert_chunks_wide(const backend::SlotLayout &l) {
  const backend::SlotWeight *roles[3] = {&l.gate, &l.up, &l.down};
  for (const backend::SlotWeight *w : roles)
    if (!gemv_runs_type(type_id(w->type)) || !gemv_runs_wide(type_id(w->type), w->ne0)) return false;
  return true;
}

// How many chunks of each size (kChunkSize) an expert of @p n tokens runs: not wide, ceil(n / 8)
// of 8; wide, n / 32 of 32 and the rest r (if any) in one chunk of 8 (r <= 8), 16 (r <= 16) or 32.
// A function of n alone (and the layout): an expert's chunks, so its rows' bits, are the same in
// every pass that computes it.
void expert_chunks(int64_t n, bool wide, int64_t (&out)[kChunkSizes]) {
  out[0] = out[1] = out[2] = 0;
  if (!wide) {
    out[0] = (n + kGemvMaxTokens - 1) / kGemvMaxTokens;
    return;
  }
  out[2] = n / kGemvMaxWideTokens;
  const int64_t r = n % kGemvMaxWideTokens;
  if (r == 0) return;
  ++out[r <= kChunkSize[0] ? 0 : r <= kChunkSize[1] ? 1 : 2];
}

}  // namespace

bool CudaBackend::moe_reads_host_picks(int64_t n_tokens, const backend::SlotLayout &l) const {
  return !(n_tokens <= kGemvMaxTokens && gemv_has_kernel(l.gate.type) && gemv_has_kernel(l.up.type) &&
           gemv_has_kernel(l.down.type));
}

void CudaBackend::gather_role_table(const Tensor &expert_ids, const void *const *slots, int64_t n_experts,
                                    const backend::SlotLayout &l, const void **out) {
  backend::check_i32(expert_ids, "gather_role_table", "expert_ids", Device::cuda);
  launch_gather_role_table(expert_ids.as<int32_t>(), expert_ids.n_elems(), slots, n_experts, l.gate.offset, l.up.offset,
                           l.down.offset, out, impl_->stream);
}

void CudaBackend::moe(const Tensor &x, const Tensor &expert_ids, const Tensor &weights, const backend::ExpertBatch &batch,
                      const backend::SlotLayout &l, const backend::Activation &act, const Tensor &y) {
  backend::check_moe(x, expert_ids, weights, l, y, Device::cuda);
  const int64_t d = x.ne[0], k = expert_ids.ne[0], n_tok = x.n_rows(), pairs = k * n_tok;
  if (pairs == 0) return;
  // Every (token, j) pair gets its own output row, then each token sums its rows in j order:
  // deterministic, no atomics, and moe_pairs() + moe_combine() give the same bits.
  auto *pair_out = static_cast<float *>(workspace(kWsPairs, static_cast<uint64_t>(pairs * d) * 4));
  if (!moe_reads_host_picks(n_tok, l)) {
    if (!batch.role_table || batch.n_pairs != pairs)
      fail(Status::internal, "moe: the expert batch has no device role table for {} pairs", pairs);
    compute_pairs_from_table(x, batch, k, l, act, pair_out);
  } else {
    backend::check_host_batch(batch, pairs, true, "moe");
    compute_pairs_grouped(x, batch, l, act, pair_out);
  }
  launch_moe_combine(pair_out, weights.as<float>(), d, n_tok, static_cast<int32_t>(k), y.as<float>(), impl_->stream);
}

void CudaBackend::moe_pairs(const Tensor &x, const Tensor &expert_ids, const backend::ExpertBatch &batch,
                            const backend::SlotLayout &l, const backend::Activation &act, const Tensor &pairs) {
  backend::check_moe_pairs(x, expert_ids, l, pairs, Device::cuda);
  if (x.n_rows() == 0) return;
  backend::check_host_batch(batch, expert_ids.n_elems(), false, "moe_pairs");
  compute_pairs_grouped(x, batch, l, act, pairs.as<float>());
}

void CudaBackend::moe_combine(const Tensor &pairs, const Tensor &weights, const Tensor &y) {
  backend::check_moe_combine(pairs, weights, y, Device::cuda);
  if (y.n_rows() == 0) return;
  launch_moe_combine(pairs.as<float>(), weights.as<float>(), y.ne[0], y.n_rows(), static_cast<int32_t>(weights.ne[0]),
                     y.as<float>(), impl_->stream);
}

void CudaBackend::compute_pairs_from_table(const Tensor &x, const backend::ExpertBatch &batch, int64_t k,
                                           const backend::SlotLayout &l, const backend::Activation &act, float *pair_out) {
  const int64_t np = batch.n_pairs;
  if (np > 65535) fail(Status::unsupported, "moe: {} pairs in one decode batch (at most 65535)", np);
  void *&tokens = impl_->pair_tokens[{np, static_cast<int32_t>(k)}];
  if (!tokens) {
    EP_CUDA_CHECK(cudaMalloc(&tokens, static_cast<size_t>(2 * np) * sizeof(int32_t)));
    launch_pair_tokens(np, static_cast<int32_t>(k), static_cast<int32_t *>(tokens), impl_->stream);
  }
  run_pair_gemvs(x, batch.role_table, static_cast<const int32_t *>(tokens), np, 1, nullptr, l, act, pair_out);
}

void CudaBackend::run_pair_gemvs(const Tensor &x, const void *const *role_table, const int32_t *x_rows, int64_t n_mat,
                                 int32_t n_tok, const int32_t *down_rows, const backend::SlotLayout &l,
                                 const backend::Activation &act, float *out) {
  // One launch for gate and up together (when they share a type and fit one launch: each launch
  // has a fixed cost of a few microseconds) and one for down, the activation applied as down's
  // kernel reads its input (GemvGlu; its own launch where that kernel cannot). The role table's
  // rows are the matrices: gate rows then up rows are one array of 2·n_mat matrices.
  const int64_t d = x.ne[0], f = l.gate.ne1, rows = n_mat * n_tok;
  cudaStream_t s = impl_->stream;
  const bool fused = l.gate.type == l.up.type && 2 * n_mat <= 65535;
  auto *g = static_cast<float *>(workspace(kWsGate, static_cast<uint64_t>(2 * rows * f) * 4));
  float *u = g + rows * f;  // right after the gate rows: one launch writes both
  GemvArgs a;
  a.x = x.as<float>();
  a.x_rows = x_rows;
  a.k = d;
  a.n = f;
  a.n_tok = n_tok;
  a.n_mat = static_cast<int32_t>(fused ? 2 * n_mat : n_mat);
  a.w_ptrs = role_table;
  a.y = g;
  launch_gemv(type_id(l.gate.type), a, s);
  if (!fused) {
    a.n_mat = static_cast<int32_t>(n_mat);
    a.w_ptrs = role_table + n_mat;
    a.x_rows = x_rows + n_mat;
    a.y = u;
    launch_gemv(type_id(l.up.type), a, s);
  }
  GemvArgs b;
  b.w_ptrs = role_table + 2 * n_mat;
  b.x = g;
  b.x_rows = down_rows;  // null: matrix i reads row i of g (one token per matrix)
  b.y = out;
  b.k = f;
  b.n = d;
  b.n_tok = n_tok;
  b.n_mat = static_cast<int32_t>(n_mat);
  // mxfp4 runs the activation in its own launch: measured no faster inside down's kernel
  // (q2_K, q3_K and iq2_xxs are faster with it there)
  if (l.down.type != GgmlType::mxfp4 && gemv_takes_glu(type_id(l.down.type), b)) {
    b.glu = GemvGlu{u, static_cast<int32_t>(act.kind), act.limit, act.beta_g, act.beta_u};
  } else {
    launch_glu(g, u, rows * f, static_cast<int32_t>(act.kind), act.limit, act.beta_g, act.beta_u, g, s);
  }
  launch_gemv(type_id(l.down.type), b, s);
}

void CudaBackend::compute_pairs_grouped(const Tensor &x, const backend::ExpertBatch &batch, const backend::SlotLayout &l,
                                        const backend::Activation &act, float *pair_out) {
  // Prefill (or a batch covering some pairs): the covered pairs grouped by expert; per expert
  // gather its tokens, run the three products (GEMV or dequantize + cuBLAS by batch size) and
  // scatter its rows to their pairs. A pair's row never depends on which other pairs are
  // computed with it.
  const int64_t d = x.ne[0], f = l.gate.ne1;
  const int64_t k = batch.n_pairs / std::max<int64_t>(x.n_rows(), 1);
  cudaStream_t s = impl_->stream;
  if (!moe_reads_host_picks(x.n_rows(), l) || one_token_gemvs_beat_chunks(l)) {
    // Few tokens (an expert-major pass of a decode step), or a prompt whose expert types run
    // far faster one token at a time: the decode GEMVs over the covered pairs, compacted, then
    // scattered to their rows: the same kernels, so the same bits, as moe() on a decode step.
    // Slices of kPairSlice pairs bound the workspace.
    constexpr int64_t kPairSlice = 4096;
    std::vector<int32_t> covered;
    for (int64_t p = 0; p < batch.n_pairs; ++p)
      if (batch.pair_slots[p]) covered.push_back(static_cast<int32_t>(p));
    if (batch.wave_table) {
      // The store's table of this wave (the same pairs in the same order, the same addresses and
      // lists as built below): no host table, no upload.
      const int64_t np = batch.n_wave;
      if (np != static_cast<int64_t>(covered.size()) || !batch.wave_lists)
        fail(Status::internal, "moe: the wave table has {} pairs, the batch covers {}", np, covered.size());
      if (np == 0) return;
      auto *o = static_cast<float *>(workspace(kWsOut, static_cast<uint64_t>(np * d) * 4));
      run_pair_gemvs(x, batch.wave_table, batch.wave_lists, np, 1, nullptr, l, act, o);
      launch_scatter_rows(o, batch.wave_lists + 3 * np, d, np, pair_out, s);
      return;
    }
    const uint64_t offsets[3] = {l.gate.offset, l.up.offset, l.down.offset};
    for (size_t s0 = 0; s0 < covered.size(); s0 += kPairSlice) {
      const int64_t np = std::min<int64_t>(kPairSlice, static_cast<int64_t>(covered.size() - s0));
      const int32_t *slice = covered.data() + s0;
      std::vector<const void *> table(static_cast<size_t>(3 * np));
      for (int r = 0; r < 3; ++r)
        for (int64_t i = 0; i < np; ++i)
          table[static_cast<size_t>(r * np + i)] = static_cast<const uint8_t *>(batch.pair_slots[slice[i]]) + offsets[r];
      std::vector<int32_t> &lists = impl_->group_lists;  // x rows (gate, then up), then the pairs
      lists.clear();
      for (int rep = 0; rep < 2; ++rep)
        for (int64_t i = 0; i < np; ++i) lists.push_back(slice[i] / static_cast<int32_t>(k));
      lists.insert(lists.end(), slice, slice + np);
      const uint64_t table_bytes = table.size() * sizeof(void *);
      auto *dev = static_cast<uint8_t *>(workspace(kWsTables, table_bytes + lists.size() * 4));
      upload(dev, table.data(), table_bytes);
      auto *dev_lists = reinterpret_cast<int32_t *>(dev + table_bytes);
      upload(dev_lists, lists.data(), lists.size() * 4);
      auto *o = static_cast<float *>(workspace(kWsOut, static_cast<uint64_t>(np * d) * 4));
      run_pair_gemvs(x, reinterpret_cast<const void *const *>(dev), dev_lists, np, 1, nullptr, l, act, o);
      launch_scatter_rows(o, dev_lists + 2 * np, d, np, pair_out, s);
    }
    return;
  }
  const std::vector<backend::ExpertGroup> groups = backend::group_pairs_by_expert(batch);
  if (groups.empty()) return;
  const auto plain_ok = [](const backend::SlotWeight &w) {
    const bool plain = w.type == GgmlType::f32 || w.type == GgmlType::f16 || w.type == GgmlType::bf16;
    return gemv_has_kernel(w.type) && (!plain || w.ne0 % 32 == 0);
  };
  if (plain_ok(l.gate) && plain_ok(l.up) && plain_ok(l.down)) {
    run_chunked_expert_gemvs(x, groups, k, l, act, pair_out);
    return;
  }
  std::vector<int32_t> &lists = impl_->group_lists;  // per expert: tokens then pair indices
  lists.clear();
  std::vector<size_t> at;
  int64_t max_n = 0;
  for (const backend::ExpertGroup &g : groups) {
    at.push_back(lists.size());
    for (int32_t p : g.pairs) lists.push_back(p / static_cast<int32_t>(k));
    for (int32_t p : g.pairs) lists.push_back(p);
    max_n = std::max<int64_t>(max_n, static_cast<int64_t>(g.pairs.size()));
  }
  auto *dev_lists = static_cast<int32_t *>(workspace(kWsTables, lists.size() * 4));
  upload(dev_lists, lists.data(), lists.size() * 4);
  auto *xe = static_cast<float *>(workspace(kWsGather, static_cast<uint64_t>(max_n * d) * 4));
  auto *g = static_cast<float *>(workspace(kWsGate, static_cast<uint64_t>(max_n * f) * 4));
  auto *u = static_cast<float *>(workspace(kWsUp, static_cast<uint64_t>(max_n * f) * 4));
  auto *o = static_cast<float *>(workspace(kWsOut, static_cast<uint64_t>(max_n * d) * 4));
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const int64_t ne = static_cast<int64_t>(groups[gi].pairs.size());
    const auto *base = static_cast<const uint8_t *>(groups[gi].slot);
    launch_gather_rows(x.as<float>(), dev_lists + at[gi], d, ne, xe, s);
    const Tensor xt = Tensor::make(xe, GgmlType::f32, Device::cuda, {d, ne});
    const Tensor gt = Tensor::make(g, GgmlType::f32, Device::cuda, {f, ne});
    const Tensor ut = Tensor::make(u, GgmlType::f32, Device::cuda, {f, ne});
    const Tensor ot = Tensor::make(o, GgmlType::f32, Device::cuda, {d, ne});
    matmul(Tensor::make(base + l.gate.offset, l.gate.type, Device::cuda, {d, f}), xt, gt);
    matmul(Tensor::make(base + l.up.offset, l.up.type, Device::cuda, {d, f}), xt, ut);
    launch_glu(g, u, ne * f, static_cast<int32_t>(act.kind), act.limit, act.beta_g, act.beta_u, g, s);
    matmul(Tensor::make(base + l.down.offset, l.down.type, Device::cuda, {f, d}), gt, ot);
    launch_scatter_rows(o, dev_lists + at[gi] + ne, d, ne, pair_out, s);
  }
}

void CudaBackend::run_chunked_expert_gemvs(const Tensor &x, const std::vector<backend::ExpertGroup> &groups, int64_t k,
                                           const backend::SlotLayout &l, const backend::Activation &act, float *pair_out) {
  // Every expert's tokens in chunks (expert_chunks: of 8 tokens, or where the three roles run
  // wide, of 32 with the last of 8, 16 or 32; each padded with zero rows whose results are
  // dropped), every chunk a matrix of one GEMV launch per role and chunk size: a prompt pass is a
  // handful of launches, and each expert's weights are read and decoded once per chunk. A chunk's
  // rows depend only on its own expert's tokens, and the chunk sizes only on its expert's token
  // count and the layout, so disjoint expert sets (moe_pairs) give moe()'s bits.
  constexpr int64_t kMaxRows = 16384;  // rows gathered per pass (bounds the workspaces)
  const bool wide = expert_chunks_wide(l);
  const int64_t d = x.ne[0];
  cudaStream_t s = impl_->stream;
  const uint64_t offsets[3] = {l.gate.offset, l.up.offset, l.down.offset};
  std::vector<const void *> table;
  std::vector<int32_t> &lists = impl_->group_lists;
  for (size_t g0 = 0; g0 < groups.size();) {
    // the experts of this pass: as many as keep the padded rows within kMaxRows (at least one)
    size_t g1 = g0;
    int64_t chunks[kChunkSizes] = {}, rows = 0;
    while (g1 < groups.size()) {
      int64_t c[kChunkSizes];
      expert_chunks(static_cast<int64_t>(groups[g1].pairs.size()), wide, c);
      int64_t r = 0;
      for (int z = 0; z < kChunkSizes; ++z) r += c[z] * kChunkSize[z];
      if (g1 > g0 && rows + r > kMaxRows) break;
      for (int z = 0; z < kChunkSizes; ++z) chunks[z] += c[z];
      rows += r;
      ++g1;
    }
    // rows and tables by chunk size: size z's chunks from row base[z], their three roles'
    // addresses from table entry 3·first[z] (role-major), their first rows (relative to base[z],
    // twice: gate's and up's x rows) from list entry 2·rows + 2·first[z]
    int64_t base[kChunkSizes], first[kChunkSizes], total = 0;
    int64_t at_row = 0;
    for (int z = 0; z < kChunkSizes; ++z) {
      if (2 * chunks[z] > 65535)
        fail(Status::unsupported, "moe: {} expert chunks of {} tokens in one pass (at most 32767)", chunks[z], kChunkSize[z]);
      base[z] = at_row;
      first[z] = total;
      at_row += chunks[z] * kChunkSize[z];
      total += chunks[z];
    }
    // per row: the token it gathers and the pair it scatters to (-1: padding)
    table.assign(static_cast<size_t>(3 * total), nullptr);
    lists.assign(static_cast<size_t>(2 * rows + 2 * total), -1);
    int32_t *gather_rows = lists.data(), *scatter_rows = gather_rows + rows, *chunk_rows = scatter_rows + rows;
    int64_t next[kChunkSizes] = {};  // chunks placed so far per size
    for (size_t gi = g0; gi < g1; ++gi) {
      const std::vector<int32_t> &pairs = groups[gi].pairs;
      const auto *base_addr = static_cast<const uint8_t *>(groups[gi].slot);
      int64_t c[kChunkSizes];
      expert_chunks(static_cast<int64_t>(pairs.size()), wide, c);
      size_t p0 = 0;
      for (int z = kChunkSizes - 1; z >= 0; --z) {  // the largest first: full chunks, then the rest
        for (int64_t n = 0; n < c[z]; ++n, ++next[z]) {
          const int64_t size = kChunkSize[z], row0 = next[z] * size;
          for (int r = 0; r < 3; ++r) table[static_cast<size_t>(3 * first[z] + r * chunks[z] + next[z])] = base_addr + offsets[r];
          chunk_rows[2 * first[z] + next[z]] = chunk_rows[2 * first[z] + chunks[z] + next[z]] = static_cast<int32_t>(row0);
          for (int64_t i = 0; i < size && p0 < pairs.size(); ++i, ++p0) {
            const int64_t row = base[z] + row0 + i;
            gather_rows[row] = pairs[p0] / static_cast<int32_t>(k);
            scatter_rows[row] = pairs[p0];
          }
        }
      }
      if (p0 != pairs.size())
        fail(Status::internal, "moe: an expert's chunks hold {} of its {} tokens", p0, pairs.size());
    }
    const uint64_t table_bytes = table.size() * sizeof(void *);
    auto *dev = static_cast<uint8_t *>(workspace(kWsTables, table_bytes + lists.size() * 4));
    upload(dev, table.data(), table_bytes);
    auto *dev_lists = reinterpret_cast<int32_t *>(dev + table_bytes);
    upload(dev_lists, lists.data(), lists.size() * 4);
    const auto *dev_table = reinterpret_cast<const void *const *>(dev);
    const int32_t *dev_gather = dev_lists, *dev_scatter = dev_lists + rows, *dev_chunk_rows = dev_lists + 2 * rows;
    auto *xe = static_cast<float *>(workspace(kWsGather, static_cast<uint64_t>(rows * d) * 4));
    auto *o = static_cast<float *>(workspace(kWsOut, static_cast<uint64_t>(rows * d) * 4));
    launch_gather_rows(x.as<float>(), dev_gather, d, rows, xe, s);
    for (int z = 0; z < kChunkSizes; ++z) {
      if (chunks[z] == 0) continue;
      // chunk c's rows of this size's gathered x and of its gate output start at row c · size
      const int64_t size_rows = chunks[z] * kChunkSize[z];
      run_pair_gemvs(Tensor::make(xe + base[z] * d, GgmlType::f32, Device::cuda, {d, size_rows}), dev_table + 3 * first[z],
                     dev_chunk_rows + 2 * first[z], chunks[z], static_cast<int32_t>(kChunkSize[z]),
                     dev_chunk_rows + 2 * first[z], l, act, o + base[z] * d);
    }
    launch_scatter_rows(o, dev_scatter, d, rows, pair_out, s);
    g0 = g1;
  }
}

int32_t CudaBackend::sample(const Tensor &logits, const backend::SamplingParams &p, uint64_t counter,
                            backend::TokenLogprobs *logprobs) {
  backend::check_f32(logits, "sample", "logits", Device::cuda);
  const int64_t n = logits.ne[0];
  if (logits.n_rows() != 1 || n <= 0) fail(Status::shape, "sample: expected one row of logits, got [{}, {}]", n, logits.n_rows());
  backend::check_logit_bias(p, n);
  backend::check_token_mask(p, n);
  const int32_t top_n = logprobs ? logprobs->top_n : 0;
  if (top_n < 0 || top_n > backend::kMaxTopLogprobs)
    fail(Status::invalid_argument, "sample: top_n {} of the log-probabilities (expected 0..{})", top_n, backend::kMaxTopLogprobs);
  // kWsSample: n floats of probabilities, then (with a repetition penalty, a logit bias or a
  // token mask) n floats of adjusted logits, the distinct penalized ids, the biased ids and their
  // biases, the mask's words.
  const std::vector<int32_t> ids =
      p.repetition_penalty != 1.0f ? backend::penalty_ids(p.penalty_tokens, n) : std::vector<int32_t>{};
  const size_t n_bias = p.logit_bias.size();
  const size_t n_words = std::min<size_t>(p.allowed.size(), static_cast<size_t>((n + 31) / 32));
  const bool adjust = !ids.empty() || n_bias > 0 || !p.allowed.empty();
  const uint64_t n_bytes = static_cast<uint64_t>(n) * 4;
  auto *scratch = static_cast<float *>(
      workspace(kWsSample, adjust ? 2 * n_bytes + (ids.size() + 2 * n_bias + n_words) * 4 : n_bytes));
  // kWsToken: what comes back to the host in one copy: log Σ exp (double), the token, its
  // log-probability, then top_n ids and top_n raw logits.
  struct Back {
    double lse;
    int32_t token;
    float logprob;
    int32_t top_ids[backend::kMaxTopLogprobs];
    float top_logits[backend::kMaxTopLogprobs];
  };
  auto *back = static_cast<Back *>(workspace(kWsToken, sizeof(Back)));
  const float *z = logits.as<float>();
  if (adjust) {
    float *copy = scratch + n;
    auto *dev_ids = reinterpret_cast<int32_t *>(copy + n);
    auto *dev_bias_ids = dev_ids + ids.size();
    auto *dev_bias = reinterpret_cast<float *>(dev_bias_ids + n_bias);
    EP_CUDA_CHECK(cudaMemcpyAsync(copy, z, n_bytes, cudaMemcpyDeviceToDevice, impl_->stream));
    if (!ids.empty()) {
      upload(dev_ids, ids.data(), ids.size() * 4);
      launch_repetition_penalty(copy, dev_ids, static_cast<int32_t>(ids.size()), p.repetition_penalty, impl_->stream);
    }
    if (n_bias) {
      std::vector<int32_t> bias_ids(n_bias);
      std::vector<float> bias(n_bias);
      for (size_t i = 0; i < n_bias; ++i) {
        bias_ids[i] = p.logit_bias[i].token;
        bias[i] = p.logit_bias[i].bias;
      }
      upload(dev_bias_ids, bias_ids.data(), n_bias * 4);
      upload(dev_bias, bias.data(), n_bias * 4);
      launch_logit_bias(copy, dev_bias_ids, dev_bias, static_cast<int32_t>(n_bias), impl_->stream);
    }
    if (!p.allowed.empty()) {
      auto *dev_mask = reinterpret_cast<uint32_t *>(dev_bias + n_bias);
      upload(dev_mask, p.allowed.data(), n_words * 4);
      launch_token_mask(copy, n, dev_mask, static_cast<int64_t>(n_words), impl_->stream);
    }
    z = copy;
  }
  launch_sample(z, n, p.temperature, p.top_k, p.top_p, p.min_p, backend::sample_uniform(p.seed, counter), scratch, &back->token,
                impl_->stream);
  if (!logprobs) {
    int32_t token = -1;
    download(&token, &back->token, 4);
    if (token < 0)
      fail(Status::internal, "sample: no token kept (temperature {}, top_k {}, top_p {}, min_p {})", p.temperature, p.top_k,
           p.top_p, p.min_p);
    return token;
  }
  launch_token_logprob(logits.as<float>(), n, &back->token, &back->lse, &back->logprob, impl_->stream);
  const int32_t k = static_cast<int32_t>(std::min<int64_t>(top_n, n));
  if (k > 0) launch_top_k(logits.as<float>(), n, 1, k, back->top_ids, back->top_logits, impl_->stream);
  Back host;
  download(&host, back, sizeof(Back));
  if (host.token < 0)
    fail(Status::internal, "sample: no token kept (temperature {}, top_k {}, top_p {}, min_p {})", p.temperature, p.top_k,
         p.top_p, p.min_p);
  logprobs->logprob = host.logprob;
  logprobs->top_ids.assign(host.top_ids, host.top_ids + k);
  logprobs->top_logprobs.resize(static_cast<size_t>(k));
  for (int32_t i = 0; i < k; ++i)
    logprobs->top_logprobs[i] = static_cast<float>(static_cast<double>(host.top_logits[i]) - host.lse);
  return host.token;
}

static_assert(kSampleTopMax == backend::kMaxTopLogprobs, "one limit of the alternatives");

void CudaBackend::sample_rows(std::span<const backend::SampleRow> rows, std::span<int32_t> tokens) {
  backend::check_sample_rows(rows, tokens.size(), Device::cuda);
  if (rows.empty()) return;
  const size_t n_rows = rows.size();
  // One upload: the rows' arguments, then each row's penalized ids, biased ids, biases and mask
  // words (4-byte entries). Scratch (kWsSample): per row n probabilities, and n adjusted logits
  // where the row has a penalty, a bias or a mask.
  std::vector<SampleRowArgs> args;
  args.reserve(n_rows);
  std::vector<uint32_t> lists;
  struct Offsets {
    size_t penalty, bias_ids, bias, mask;
  };
  std::vector<Offsets> at(n_rows);
  uint64_t scratch_floats = 0;
  std::vector<uint64_t> probs_at(n_rows), adjusted_at(n_rows, UINT64_MAX);
  for (size_t i = 0; i < n_rows; ++i) {
    const backend::SampleRow &r = rows[i];
    const backend::SamplingParams &p = *r.params;
    const int64_t n = r.logits.ne[0];
    const std::vector<int32_t> ids =
        p.repetition_penalty != 1.0f ? backend::penalty_ids(p.penalty_tokens, n) : std::vector<int32_t>{};
    const size_t n_bias = p.logit_bias.size();
    const size_t n_words = std::min<size_t>(p.allowed.size(), static_cast<size_t>((n + 31) / 32));
    const bool adjust = !ids.empty() || n_bias > 0 || !p.allowed.empty();
    at[i].penalty = lists.size();
    for (int32_t id : ids) lists.push_back(static_cast<uint32_t>(id));
    at[i].bias_ids = lists.size();
    for (const backend::TokenBias &b : p.logit_bias) lists.push_back(static_cast<uint32_t>(b.token));
    at[i].bias = lists.size();
    for (const backend::TokenBias &b : p.logit_bias) {
      uint32_t bits = 0;
      std::memcpy(&bits, &b.bias, 4);
      lists.push_back(bits);
    }
    at[i].mask = lists.size();
    lists.insert(lists.end(), p.allowed.begin(), p.allowed.begin() + static_cast<std::ptrdiff_t>(n_words));
    probs_at[i] = scratch_floats;
    scratch_floats += static_cast<uint64_t>(n);
    if (adjust) {
      adjusted_at[i] = scratch_floats;
      scratch_floats += static_cast<uint64_t>(n);
    }
    SampleRowArgs a;
    a.logits = r.logits.as<float>();
    a.u = backend::sample_uniform(p.seed, r.counter);
    a.n = n;
    a.mask_words = static_cast<int64_t>(n_words);
    a.temperature = p.temperature;
    a.top_p = p.top_p;
    a.min_p = p.min_p;
    a.penalty = p.repetition_penalty;
    a.top_k = p.top_k;
    a.n_penalty = static_cast<int32_t>(ids.size());
    a.n_bias = static_cast<int32_t>(n_bias);
    a.logprobs = r.logprobs ? 1 : 0;
    a.top_n = r.logprobs ? static_cast<int32_t>(std::min<int64_t>(r.logprobs->top_n, n)) : 0;
    args.push_back(a);
  }
  const uint64_t args_bytes = n_rows * sizeof(SampleRowArgs), lists_bytes = lists.size() * 4;
  auto *dev = static_cast<uint8_t *>(workspace(kWsSampleRows, args_bytes + lists_bytes));
  auto *dev_lists = reinterpret_cast<uint32_t *>(dev + args_bytes);
  auto *scratch = static_cast<float *>(workspace(kWsSample, scratch_floats * 4));
  auto *results = static_cast<SampleRowResult *>(workspace(kWsToken, n_rows * sizeof(SampleRowResult)));
  for (size_t i = 0; i < n_rows; ++i) {
    SampleRowArgs &a = args[i];
    a.probs = scratch + probs_at[i];
    if (adjusted_at[i] != UINT64_MAX) a.adjusted = scratch + adjusted_at[i];
    a.penalty_ids = reinterpret_cast<const int32_t *>(dev_lists + at[i].penalty);
    a.bias_ids = reinterpret_cast<const int32_t *>(dev_lists + at[i].bias_ids);
    a.bias = reinterpret_cast<const float *>(dev_lists + at[i].bias);
    if (!rows[i].params->allowed.empty()) a.mask = dev_lists + at[i].mask;
  }
  std::vector<uint8_t> block(args_bytes + lists_bytes);
  std::memcpy(block.data(), args.data(), args_bytes);
  if (lists_bytes) std::memcpy(block.data() + args_bytes, lists.data(), lists_bytes);
  upload(dev, block.data(), block.size());
  launch_sample_rows(reinterpret_cast<const SampleRowArgs *>(dev), static_cast<int64_t>(n_rows), results, impl_->stream);
  std::vector<SampleRowResult> host(n_rows);
  download(host.data(), results, n_rows * sizeof(SampleRowResult));
  for (size_t i = 0; i < n_rows; ++i) {
    const backend::SamplingParams &p = *rows[i].params;
    if (host[i].token < 0)
      fail(Status::internal, "sample_rows: rows[{}]: no token kept (temperature {}, top_k {}, top_p {}, min_p {})", i, p.temperature,
           p.top_k, p.top_p, p.min_p);
  }
  for (size_t i = 0; i < n_rows; ++i) {
    tokens[i] = host[i].token;
    backend::TokenLogprobs *lp = rows[i].logprobs;
    if (!lp) continue;
    const int32_t k = args[i].top_n;
    lp->logprob = host[i].logprob;
    lp->top_ids.assign(host[i].top_ids, host[i].top_ids + k);
    lp->top_logprobs.resize(static_cast<size_t>(k));
    for (int32_t j = 0; j < k; ++j)
      lp->top_logprobs[j] = static_cast<float>(static_cast<double>(host[i].top_logits[j]) - host[i].lse);
  }
}

}  // namespace ep::backend::cuda
