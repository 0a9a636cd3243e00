//go:build !expertpack_notext

#include "text_helpers.h"
#include "_cgo_export.h"

static int text_trampoline(const char *piece, size_t length, void *payload) {
  return epGoText((char *)piece, length, (uintptr_t)payload);
}

ep_status ep_go_generate_text(ep_generate_stats *out_stats, ep_session *session, const ep_tokenizer *tokenizer,
                              const char *prompt, const ep_generate_options *options, uintptr_t handle) {
  return ep_generate_text(out_stats, session, tokenizer, prompt, options, text_trampoline, (void *)handle);
}

ep_status ep_go_generate_chat(ep_generate_stats *out_stats, ep_session *session, const ep_tokenizer *tokenizer,
                              const ep_chat_message *messages, size_t n_messages, const ep_chat_options *chat_options,
                              const ep_generate_options *options, uintptr_t handle) {
  return ep_generate_chat(out_stats, session, tokenizer, messages, n_messages, chat_options, options, text_trampoline,
                          (void *)handle);
}
