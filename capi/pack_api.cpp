// C API: read-only inspection of an Expert Pack (include/expertpack/pack.h).
#include <expertpack/expertpack.h>

#include "capi/guard.hpp"
#include "format/pack_file.hpp"

#include <cstring>
#include <memory>

struct ep_pack {
  std::unique_ptr<ep::format::PackFile> file;
};

namespace {
// The first published sizes: fields are only appended after these.
constexpr size_t kOpenOptionsV1 = sizeof(ep_pack_open_options);
constexpr size_t kPropertiesV1 = sizeof(ep_pack_properties);
}  // namespace

extern "C" {

EP_API void ep_pack_open_options_init(ep_pack_open_options *options) {
  if (!options) return;
  *options = ep_pack_open_options{};
  options->struct_size = sizeof(ep_pack_open_options);
  options->validation = EP_PACK_VALIDATE_SAMPLED;
}

EP_API ep_status ep_pack_open(ep_pack **out_pack, const char *path, const ep_pack_open_options *options) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_pack, fn, "out_pack");
    *out_pack = nullptr;
    ep::capi::require_arg(path, fn, "path");
    ep_pack_open_options opts;
    ep_pack_open_options_init(&opts);
    if (options) {
      ep::capi::check_struct_size(options->struct_size, kOpenOptionsV1, sizeof(ep_pack_open_options),
                                  "ep_pack_open_options");
      opts.validation = options->validation;
    }
    ep::format::ValidationLevel level;
    switch (opts.validation) {
      case EP_PACK_VALIDATE_STRUCTURE: level = ep::format::ValidationLevel::structure; break;
      case EP_PACK_VALIDATE_SAMPLED: level = ep::format::ValidationLevel::sampled; break;
      case EP_PACK_VALIDATE_FULL: level = ep::format::ValidationLevel::full; break;
      default:
        ep::fail(ep::Status::invalid_argument, "{}: validation {} is not an ep_pack_validation", fn,
                 static_cast<int>(opts.validation));
    }
    auto pack = std::make_unique<ep_pack>();
    pack->file = ep::format::PackFile::open(path, level);
    *out_pack = pack.release();
  });
}

EP_API void ep_pack_properties_init(ep_pack_properties *properties) {
  if (!properties) return;
  *properties = ep_pack_properties{};
  properties->struct_size = sizeof(ep_pack_properties);
}

EP_API ep_status ep_pack_info(ep_pack_properties *out_properties, const ep_pack *pack) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_properties, fn, "out_properties");
    ep::capi::require_arg(pack, fn, "pack");
    ep::capi::check_struct_size(out_properties->struct_size, kPropertiesV1, sizeof(ep_pack_properties),
                                "ep_pack_properties");
    const ep::format::PackFile &f = *pack->file;
    const auto &h = f.header();
    ep_pack_properties p{};
    p.struct_size = out_properties->struct_size;
    p.format_version = h.version;
    p.num_layers = h.num_layers;
    p.num_experts = h.num_experts;
    p.num_roles = h.num_roles;
    p.top_k = h.top_k;
    p.first_layer = h.first_layer;
    p.alignment = h.alignment;
    p.data_start = h.data_start;
    p.object_stride = h.object_stride;
    p.max_object_bytes = f.max_object_bytes();
    p.file_size = h.file_size;
    std::memcpy(p.source_files_sha256, h.source_files_sha256, 32);
    std::memcpy(p.model_identity_sha256, h.model_identity_sha256, 32);
    std::memcpy(p.config_sha256, h.config_sha256, 32);
    std::memcpy(out_properties, &p, out_properties->struct_size);
  });
}

EP_API ep_status ep_pack_object(ep_pack_object_info *out_object, const ep_pack *pack, uint32_t layer, uint32_t expert) {
  return ep::capi::guard(__func__, [&](const char *fn) {
    ep::capi::require_arg(out_object, fn, "out_object");
    ep::capi::require_arg(pack, fn, "pack");
    const ep::format::PackFile &f = *pack->file;
    ep_pack_object_info o{};
    o.offset = f.object_offset(layer, expert);
    o.bytes = f.object_bytes(layer, expert);
    for (uint32_t r = 0; r < 3; ++r) {
      const auto &e = f.entry(layer, expert, static_cast<ep::format::Role>(r));
      o.role_offset[r] = e.file_offset;
      o.role_bytes[r] = e.nbytes;
      o.role_ggml_type[r] = static_cast<uint32_t>(e.type);
    }
    *out_object = o;
  });
}

EP_API void ep_pack_close(ep_pack *pack) { delete pack; }

}  // extern "C"
