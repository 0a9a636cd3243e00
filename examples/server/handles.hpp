// Owning handles for the C API objects the server keeps: sessions and text streams close
// themselves when their owner goes away.
#pragma once

#include <expertpack/expertpack.h>

#include <memory>

namespace ep_server {

struct SessionCloser {
  void operator()(ep_session *s) const { ep_session_close(s); }
};
using SessionPtr = std::unique_ptr<ep_session, SessionCloser>;

struct TextStreamCloser {
  void operator()(ep_text_stream *s) const { ep_text_stream_close(s); }
};
using TextStreamPtr = std::unique_ptr<ep_text_stream, TextStreamCloser>;

}  // namespace ep_server
