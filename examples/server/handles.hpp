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
struct GrammarCloser {
  void operator()(ep_grammar *g) const { ep_grammar_close(g); }
};
/// A request's grammar, shared by its answers' states.
using GrammarPtr = std::shared_ptr<ep_grammar>;
struct GrammarStateCloser {
  void operator()(ep_grammar_state *s) const { ep_grammar_state_close(s); }
};
using GrammarStatePtr = std::unique_ptr<ep_grammar_state, GrammarStateCloser>;

}  // namespace ep_server
