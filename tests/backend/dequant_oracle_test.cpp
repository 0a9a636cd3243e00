// Dequantization against an independent implementation: tests/oracle/quants_golden.py writes
// blocks of every type the Python oracle reads (seeded random bytes, extreme and zero scales, an
// all-ones block) with the values it computes from the ggml formulas; the backend must give the
// same floats, bit for bit. CTest generates the file first (EP_QUANT_ORACLE_GGUF names it).
#include "backend/dequant.hpp"
#include "format/gguf.hpp"
#include "support/catch.hpp"

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

TEST_CASE("dequantization matches the Python oracle bit for bit", "[dequant][oracle]") {
  const char *path = std::getenv("EP_QUANT_ORACLE_GGUF");
  REQUIRE(path != nullptr);  // set by CTest, which writes the file first
  const ep::format::GgufFile f = ep::format::GgufFile::open(path);
  int types = 0;
  for (const ep::format::GgufTensorInfo &t : f.tensors()) {
    if (t.name.find(".values") != std::string::npos) continue;
    const ep::format::GgufTensorInfo *want = f.find_tensor(t.name + ".values");
    REQUIRE(want != nullptr);
    REQUIRE(want->type == ep::format::GgmlType::f32);
    const int64_t n = static_cast<int64_t>(t.ne[0]);
    REQUIRE(static_cast<int64_t>(want->ne[0]) == n);
    const std::vector<uint8_t> raw = f.source().read_vector(t.file_offset, static_cast<size_t>(t.nbytes));
    const std::vector<uint8_t> ref = f.source().read_vector(want->file_offset, static_cast<size_t>(want->nbytes));
    std::vector<float> got(static_cast<size_t>(n));
    ep::backend::dequantize_row(t.type, raw.data(), got.data(), n);
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; ++i)
      if (std::memcmp(&got[static_cast<size_t>(i)], ref.data() + 4 * i, 4) != 0 && bad++ == 0) first = i;
    INFO(t.name << ": " << bad << " of " << n << " values differ, the first at " << first);
    CHECK(bad == 0);
    ++types;
  }
  CHECK(types == 13);
}
