// CUDA dequantization of the oracle's blocks (tests/oracle/quants_golden.py: seeded random bytes,
// extreme, subnormal and zero scales, all-ones blocks) against the CPU's, bit for bit in f32 and
// as the CPU value rounded to bf16; and the embedding lookup of those rows. Skips without a GPU.
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/kernels.hpp"
#include "backend/dequant.hpp"
#include "format/gguf.hpp"
#include "gpu/check.hpp"
#include "support/catch.hpp"

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using ep::backend::cuda::CudaBackend;

namespace {
struct Dev {
  CudaBackend &be;
  void *p;
  Dev(CudaBackend &b, uint64_t bytes) : be(b), p(b.allocate(bytes)) {
    EP_CUDA_CHECK(cudaMemsetAsync(p, 0xFF, bytes, b.stream()));  // NaN until written
  }
  ~Dev() { be.deallocate(p); }
  Dev(const Dev &) = delete;
  Dev &operator=(const Dev &) = delete;
};
}  // namespace

TEST_CASE("CUDA dequantization of the oracle's blocks equals the CPU's bit for bit", "[gpu][dequant]") {
  const char *path = std::getenv("EP_QUANT_ORACLE_GGUF");
  REQUIRE(path != nullptr);  // set by CTest, which writes the file first
  CudaBackend be;
  const ep::format::GgufFile f = ep::format::GgufFile::open(path);
  int types = 0;
  std::string covered;
  for (const ep::format::GgufTensorInfo &t : f.tensors()) {
    if (t.name.find(".values") != std::string::npos) continue;
    const auto info = *ep::format::ggml_type_info(static_cast<uint32_t>(t.type));
    // the blocks as rows of one block each (k = 32 or 256) and as one long row
    const int64_t n = static_cast<int64_t>(t.ne[0]), k = info.block_elems, rows = n / k;
    const std::vector<uint8_t> raw = f.source().read_vector(t.file_offset, static_cast<size_t>(t.nbytes));
    std::vector<float> want(static_cast<size_t>(n));
    ep::backend::dequantize_row(t.type, raw.data(), want.data(), n);
    Dev w(be, raw.size()), y(be, static_cast<uint64_t>(n) * 4), y16(be, static_cast<uint64_t>(n) * 2),
        ids(be, static_cast<uint64_t>(rows) * 4), emb(be, static_cast<uint64_t>(n) * 4);
    be.upload(w.p, raw.data(), raw.size());
    std::vector<int32_t> order(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) order[static_cast<size_t>(r)] = static_cast<int32_t>(rows - 1 - r);  // reversed
    be.upload(ids.p, order.data(), order.size() * 4);
    const uint32_t id = static_cast<uint32_t>(t.type);
    ep::backend::cuda::launch_dequant_rows(id, w.p, k, rows, static_cast<float *>(y.p), nullptr, be.stream());
    ep::backend::cuda::launch_dequant_rows(id, w.p, k, rows, nullptr, static_cast<uint16_t *>(y16.p), be.stream());
    ep::backend::cuda::launch_embed(id, w.p, k, rows, static_cast<const int32_t *>(ids.p), rows, static_cast<float *>(emb.p),
                                    be.stream());
    std::vector<float> got(static_cast<size_t>(n)), got_emb(static_cast<size_t>(n));
    std::vector<uint16_t> got16(static_cast<size_t>(n));
    be.download(got.data(), y.p, got.size() * 4);
    be.download(got16.data(), y16.p, got16.size() * 2);
    be.download(got_emb.data(), emb.p, got_emb.size() * 4);
    int64_t bad = 0, bad16 = 0, bad_emb = 0;
    for (int64_t i = 0; i < n; ++i) {
      const size_t u = static_cast<size_t>(i);
      bad += std::memcmp(&got[u], &want[u], 4) != 0;
      bad16 += got16[u] != ep::backend::fp32_to_bf16(want[u]);
      const size_t src = static_cast<size_t>((rows - 1 - i / k) * k + i % k);
      bad_emb += std::memcmp(&got_emb[u], &want[src], 4) != 0;
    }
    INFO(info.name << ": " << n << " values");
    CHECK(bad == 0);
    CHECK(bad16 == 0);
    CHECK(bad_emb == 0);
    ++types;
    if (!covered.empty()) covered += ' ';
    covered += info.name;
  }
  // the oracle's file holds one tensor per type it writes (tests/oracle: IQ2_XXS and the twelve
  // types added with the checkpoints)
  INFO("covered: " << covered);
  CHECK(types == 13);
}
