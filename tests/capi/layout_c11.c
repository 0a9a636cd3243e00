/* Pins the layout of every public struct and the width of every public enum: a change here
   breaks FFI users (Rust, Go, C#, Python ctypes) and must be a deliberate ABI decision.
   Sizes and offsets are those of LP64 (Linux x86-64, aarch64). */
#include <expertpack/expertpack.h>

#include <stddef.h>

_Static_assert(sizeof(ep_status) == 4, "ep_status is 32 bits");
_Static_assert(sizeof(ep_log_level) == 4, "ep_log_level is 32 bits");
_Static_assert(sizeof(ep_feature) == 4, "ep_feature is 32 bits");

_Static_assert(offsetof(ep_log_options, struct_size) == 0, "struct_size first");
_Static_assert(offsetof(ep_log_options, min_level) == 8, "ep_log_options.min_level");
_Static_assert(offsetof(ep_log_options, callback) == 16, "ep_log_options.callback");
_Static_assert(offsetof(ep_log_options, payload) == 24, "ep_log_options.payload");
_Static_assert(sizeof(ep_log_options) == 32, "ep_log_options size");

_Static_assert(EP_OK == 0 && EP_ERR_INVALID_ARGUMENT == -1 && EP_ERR_INTERNAL == -17,
               "status numbers are stable");

_Static_assert(sizeof(ep_pack_validation) == 4, "ep_pack_validation is 32 bits");
_Static_assert(offsetof(ep_pack_open_options, validation) == 8, "ep_pack_open_options.validation");
_Static_assert(sizeof(ep_pack_open_options) == 16, "ep_pack_open_options size");
_Static_assert(offsetof(ep_pack_properties, format_version) == 8, "ep_pack_properties.format_version");
_Static_assert(offsetof(ep_pack_properties, alignment) == 32, "ep_pack_properties.alignment");
_Static_assert(offsetof(ep_pack_properties, source_files_sha256) == 72, "ep_pack_properties.source_files_sha256");
_Static_assert(sizeof(ep_pack_properties) == 168, "ep_pack_properties size");
_Static_assert(offsetof(ep_pack_object_info, role_offset) == 16, "ep_pack_object_info.role_offset");
_Static_assert(offsetof(ep_pack_object_info, role_ggml_type) == 64, "ep_pack_object_info.role_ggml_type");
_Static_assert(sizeof(ep_pack_object_info) == 80, "ep_pack_object_info size");

int main(void) { return 0; }
