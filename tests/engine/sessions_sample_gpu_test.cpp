// ep_sessions_sample on CUDA (skips without a GPU): every session of a step sampled in one launch
// with one download, against one ep_session_sample / ep_session_sample_logprobs per session on a
// fork of it taken just before (the same logits and draw counter): the same tokens and the same
// log-probabilities, bit for bit (one block per row running the single-row kernels' device code),
// with greedy, temperature + top_p, repetition penalty + logit bias, a JSON grammar's mask and
// log-probabilities mixed in one call.
#include "sessions_sample_support.hpp"

using sessions_sample::Fixture;

TEST_CASE("ep_sessions_sample on CUDA: each session's draw as its single-session sample", "[engine][batch][sampling][gpu]") {
  Fixture f(EP_DEVICE_CUDA, true);
  CHECK(demomodel::model_info(f.m).device == EP_DEVICE_CUDA);
  f.run(12);
}
