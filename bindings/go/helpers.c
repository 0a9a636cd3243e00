#include "helpers.h"
#include "_cgo_export.h"

static int token_trampoline(int32_t token, uint32_t index, void *payload) {
  return epGoToken(token, index, (uintptr_t)payload);
}

ep_status ep_go_generate(ep_generate_stats *out_stats, ep_session *session, const int32_t *prompt, size_t n_prompt,
                         const ep_generate_options *options, uintptr_t handle) {
  return ep_generate(out_stats, session, prompt, n_prompt, options, token_trampoline, (void *)handle);
}

static void progress_trampoline(uint64_t done, uint64_t total, void *payload) {
  epGoProgress(done, total, (uintptr_t)payload);
}

ep_status ep_go_model_open(ep_model **out_model, const char *path, ep_model_options *options, uintptr_t handle) {
  if (handle) {
    options->progress = progress_trampoline;
    options->progress_payload = (void *)handle;
  }
  return ep_model_open(out_model, path, options);
}

static void log_trampoline(ep_log_level level, const char *message, void *payload) {
  (void)payload;
  epGoLog((int32_t)level, (char *)message);
}

void ep_go_set_log_callback(int install) { ep_set_log_callback(install ? log_trampoline : NULL, NULL); }

ep_status ep_go_log_configure(int install, ep_log_level level) {
  /* init writes the library's sizeof, which matches this header: the binding is built with it. */
  ep_log_options o;
  ep_log_options_init(&o);
  o.min_level = level;
  o.callback = install ? log_trampoline : NULL;
  return ep_log_configure(&o);
}
