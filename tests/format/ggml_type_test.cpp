#include "format/ggml_type.hpp"

#include "core/error.hpp"
#include "support/catch.hpp"

using ep::format::GgmlType;

TEST_CASE("ggml type sizes match ggml-common.h", "[format][ggml]") {
  struct Row { GgmlType type; uint32_t elems, bytes; };
  const Row rows[] = {{GgmlType::q8_0, 32, 34},   {GgmlType::mxfp4, 32, 17}, {GgmlType::q2_k, 256, 84},
                      {GgmlType::q3_k, 256, 110}, {GgmlType::q4_k, 256, 144}, {GgmlType::q5_k, 256, 176},
                      {GgmlType::q6_k, 256, 210}, {GgmlType::iq2_xxs, 256, 66}, {GgmlType::bf16, 1, 2}};
  for (const Row &r : rows) {
    auto info = ep::format::ggml_type_info(static_cast<uint32_t>(r.type));
    REQUIRE(info);
    CHECK(info->block_elems == r.elems);
    CHECK(info->block_bytes == r.bytes);
  }
}

TEST_CASE("retired and unknown type ids are rejected", "[format][ggml]") {
  CHECK_FALSE(ep::format::ggml_type_info(4));
  CHECK_FALSE(ep::format::ggml_type_info(31));
  CHECK_FALSE(ep::format::ggml_type_info(1000));
  CHECK_THROWS_AS(ep::format::require_ggml_type(1000, "t"), ep::Error);
}

TEST_CASE("row bytes and names", "[format][ggml]") {
  CHECK(ep::format::ggml_row_bytes(GgmlType::mxfp4, 4096, "w") == 4096 / 32 * 17);
  CHECK(ep::format::ggml_row_bytes(GgmlType::q2_k, 2048, "w") == 8 * 84);
  CHECK_THROWS_AS(ep::format::ggml_row_bytes(GgmlType::q2_k, 100, "w"), ep::Error);
  auto q4k = ep::format::ggml_type_by_name("Q4_K");
  REQUIRE(q4k);
  CHECK(q4k->type == GgmlType::q4_k);
}
