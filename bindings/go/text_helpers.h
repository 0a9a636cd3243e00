/* C helpers of the Go binding's text API (text.go; excluded with -tags expertpack_notext). */
#ifndef EXPERTPACK_GO_TEXT_HELPERS_H
#define EXPERTPACK_GO_TEXT_HELPERS_H
#include <stdint.h>
#include "expertpack/expertpack.h"
#include "expertpack/text.h"

ep_status ep_go_generate_text(ep_generate_stats *out_stats, ep_session *session, const ep_tokenizer *tokenizer,
                              const char *prompt, const ep_generate_options *options, uintptr_t handle);
ep_status ep_go_generate_chat(ep_generate_stats *out_stats, ep_session *session, const ep_tokenizer *tokenizer,
                              const ep_chat_message *messages, size_t n_messages, const ep_chat_options *chat_options,
                              const ep_generate_options *options, uintptr_t handle);
#endif
