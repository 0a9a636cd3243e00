//go:build !expertpack_notext && !expertpack_nobatch

#include "textstream_helpers.h"

#include <stdlib.h>
#include <string.h>

static int collect(const char *piece, size_t length, void *payload) {
  ep_go_text_buf *b = (ep_go_text_buf *)payload;
  if (b->length + length > b->capacity) {
    size_t capacity = b->capacity ? b->capacity : 64;
    while (capacity < b->length + length) capacity *= 2;
    char *p = (char *)realloc(b->data, capacity);
    if (!p) return 1; /* stops the stream: EP_ERR_CANCELLED */
    b->data = p;
    b->capacity = capacity;
  }
  memcpy(b->data + b->length, piece, length);
  b->length += length;
  return 0;
}

ep_status ep_go_text_stream_push(ep_text_stream *stream, int32_t token, ep_go_text_buf *out, int32_t *out_stopped) {
  return ep_text_stream_push(stream, token, collect, out, out_stopped);
}

ep_status ep_go_text_stream_finish(ep_text_stream *stream, ep_go_text_buf *out, int32_t *out_stopped) {
  return ep_text_stream_finish(stream, collect, out, out_stopped);
}
