/* C helpers of the Go binding: callback trampolines (Go functions cannot be C function pointers). */
#ifndef EXPERTPACK_GO_HELPERS_H
#define EXPERTPACK_GO_HELPERS_H
#include <stdint.h>
#include <stdlib.h>
#include "expertpack/expertpack.h"

ep_status ep_go_generate(ep_generate_stats *out_stats, ep_session *session, const int32_t *prompt, size_t n_prompt,
                         const ep_generate_options *options, uintptr_t handle);
ep_status ep_go_model_open(ep_model **out_model, const char *path, ep_model_options *options, uintptr_t handle);
void ep_go_set_log_callback(int install);
ep_status ep_go_log_configure(int install, ep_log_level level);
#endif
