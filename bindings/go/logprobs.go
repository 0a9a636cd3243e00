//go:build !expertpack_nobatch && !expertpack_nologprobs

package expertpack

/*
#include "expertpack/expertpack.h"
*/
import "C"

// MaxTopLogprobs is the most alternatives SampleLogprobs reports (EP_MAX_TOP_LOGPROBS).
const MaxTopLogprobs = C.EP_MAX_TOP_LOGPROBS

// TokenLogprob is a token with its log-probability.
type TokenLogprob struct {
	Token   int32
	Logprob float32
}

// TokenLogprobs are a sampled token's log-probability and the most likely alternatives
// (ep_token_logprobs), most likely first.
type TokenLogprobs struct {
	TokenLogprob
	Top []TokenLogprob
}

// SampleLogprobs is Sample with log-probabilities (ep_session_sample_logprobs, 0.4): the token,
// its log-probability and the top (0..MaxTopLogprobs) most likely tokens with theirs. They are
// the model's own: log-softmax of the raw logits, before the repetition penalty, the logit bias,
// the temperature and the top_k / top_p / min_p cuts. A library before 0.4: build with the tag
// expertpack_nologprobs.
func (s *Session) SampleLogprobs(opts *GenerateOptions, top uint32) (TokenLogprobs, error) {
	r, err := s.raw()
	if err != nil {
		return TokenLogprobs{}, err
	}
	co := opts.toC()
	defer co.free()
	var out C.ep_token_logprobs
	C.ep_token_logprobs_init(&out)
	if err := call("ep_session_sample_logprobs", func() C.ep_status {
		return C.ep_session_sample_logprobs(&out, r, co.o, C.uint32_t(top))
	}); err != nil {
		return TokenLogprobs{}, err
	}
	res := TokenLogprobs{TokenLogprob: TokenLogprob{int32(out.token), float32(out.logprob)}}
	for i := 0; i < int(out.n_top) && i < MaxTopLogprobs; i++ {
		res.Top = append(res.Top, TokenLogprob{int32(out.top_tokens[i]), float32(out.top_logprobs[i])})
	}
	return res, nil
}
