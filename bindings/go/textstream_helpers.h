/* C helpers of the Go binding's text streams (textstream.go): the text a push or finish
   delivers is collected into a malloc'ed buffer, so no Go callback is needed. */
#ifndef EXPERTPACK_GO_TEXTSTREAM_HELPERS_H
#define EXPERTPACK_GO_TEXTSTREAM_HELPERS_H
#include <stdint.h>
#include "expertpack/expertpack.h"
#include "expertpack/text.h"

/** Text collected by one call; free data with free(). */
typedef struct ep_go_text_buf {
  char *data;
  size_t length, capacity;
} ep_go_text_buf;

ep_status ep_go_text_stream_push(ep_text_stream *stream, int32_t token, ep_go_text_buf *out, int32_t *out_stopped);
ep_status ep_go_text_stream_finish(ep_text_stream *stream, ep_go_text_buf *out, int32_t *out_stopped);
#endif
