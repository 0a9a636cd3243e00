// The C API over a pack built in the test: ep_pack_open / ep_pack_info / ep_pack_object /
// ep_pack_close, and its error reporting.
#include <expertpack/expertpack.h>

#include "format/pack_file.hpp"
#include "pack/builder.hpp"
#include "support/temp_dir.hpp"
#include "support/catch.hpp"
#include "testkit/checkpoint.hpp"

#include <cstring>
#include <string>

using namespace ep;

TEST_CASE("C API: open, describe and close a pack", "[pack][capi]") {
  test::TempDir dir;
  testkit::SyntheticSpec spec;
  spec.num_layers = 3;
  spec.num_experts = 5;
  spec.top_k = 3;
  const std::string src = testkit::write_synthetic_gguf(spec, dir / "s.gguf")[0];
  const std::string path = dir / "s.epk";
  pack::build_pack(std::vector<std::string>{src}, path);
  auto ref = format::PackFile::open(path);

  ep_pack *p = nullptr;
  REQUIRE(ep_pack_open(&p, path.c_str(), nullptr) == EP_OK);
  REQUIRE(p != nullptr);
  ep_pack_properties info;
  ep_pack_properties_init(&info);
  REQUIRE(ep_pack_info(&info, p) == EP_OK);
  CHECK(info.format_version == 1);
  CHECK(info.num_layers == 3);
  CHECK(info.num_experts == 5);
  CHECK(info.num_roles == 3);
  CHECK(info.top_k == 3);
  CHECK(info.alignment == 4096);
  CHECK(info.data_start == ref->data_start());
  CHECK(info.object_stride == ref->object_stride());
  CHECK(info.max_object_bytes == ref->max_object_bytes());
  CHECK(info.file_size == ref->file_size());
  CHECK(std::memcmp(info.model_identity_sha256, ref->header().model_identity_sha256, 32) == 0);
  ep_pack_object_info obj;
  REQUIRE(ep_pack_object(&obj, p, 2, 4) == EP_OK);
  CHECK(obj.offset == ref->object_offset(2, 4));
  CHECK(obj.bytes == ref->object_bytes(2, 4));
  CHECK(obj.role_offset[2] == ref->entry(2, 4, format::Role::down).file_offset);
  CHECK(obj.role_ggml_type[0] == 39);
  CHECK(ep_pack_object(&obj, p, 3, 0) == EP_ERR_INVALID_ARGUMENT);
  CHECK(std::string(ep_last_error()).find("out of range") != std::string::npos);
  ep_pack_properties small = info;
  small.struct_size = 8;
  CHECK(ep_pack_info(&small, p) == EP_ERR_STRUCT_SIZE);
  ep_pack_close(p);
  ep_pack_close(nullptr);

  ep_pack_open_options opt;
  ep_pack_open_options_init(&opt);
  CHECK(opt.validation == EP_PACK_VALIDATE_SAMPLED);
  opt.validation = EP_PACK_VALIDATE_FULL;
  REQUIRE(ep_pack_open(&p, path.c_str(), &opt) == EP_OK);
  ep_pack_close(p);
  opt.validation = static_cast<ep_pack_validation>(7);
  CHECK(ep_pack_open(&p, path.c_str(), &opt) == EP_ERR_INVALID_ARGUMENT);
  CHECK(p == nullptr);

  CHECK(ep_pack_open(&p, (dir / "none.epk").c_str(), nullptr) == EP_ERR_NOT_FOUND);
  CHECK(ep_pack_open(nullptr, path.c_str(), nullptr) == EP_ERR_INVALID_ARGUMENT);
  auto bytes = test::read_file(path);
  bytes[40] ^= 1;  // inside the checksummed header
  test::write_file(path, bytes);
  CHECK(ep_pack_open(&p, path.c_str(), nullptr) == EP_ERR_CORRUPT);
  CHECK(std::string(ep_last_error()).find("header checksum mismatch") != std::string::npos);
  bytes[40] ^= 1;
  bytes[8] = 2;
  test::write_file(path, bytes);
  CHECK(ep_pack_open(&p, path.c_str(), nullptr) == EP_ERR_VERSION);
}
