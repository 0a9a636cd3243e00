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

int main(void) { return 0; }
