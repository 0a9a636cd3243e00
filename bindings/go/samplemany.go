//go:build !expertpack_nobatch && !expertpack_nologprobs && !expertpack_nosamplemany

package expertpack

/*
#include <stdlib.h>
#include "expertpack/expertpack.h"
*/
import "C"

import "unsafe"

// SampleMany draws the next token of every session of sessions (distinct, of one model, each
// holding a token) in one call (ep_sessions_sample, 0.5: one sampling launch and one download
// for all of them). opts is nil (greedy defaults for every session) or one entry per session
// (a nil entry: the defaults). tops is nil (no log-probabilities) or one entry per session: a
// negative count asks for none, 0..MaxTopLogprobs for the token's log-probability and that many
// alternatives. Each result is what Sample (or SampleLogprobs) gives for the session alone, and
// each draw counter advances the same way; a refused call (ErrInvalidArgument naming the
// session's index) changes no session. Without log-probabilities a result's Logprob is 0 and
// its Top empty. A library before 0.6: build with the tag expertpack_nosamplemany.
func SampleMany(sessions []*Session, opts []*GenerateOptions, tops []int) ([]TokenLogprobs, error) {
	n := len(sessions)
	if n == 0 {
		return nil, &Error{Op: "ep_sessions_sample", Status: ErrInvalidArgument, Message: "SampleMany: no sessions"}
	}
	if (opts != nil && len(opts) != n) || (tops != nil && len(tops) != n) {
		return nil, &Error{Op: "ep_sessions_sample", Status: ErrInvalidArgument,
			Message: "SampleMany: the numbers of sessions, options and log-probability counts differ"}
	}
	// C may not keep Go pointers in C-visible arrays: the arrays live in C memory for the call.
	ptrSize := C.size_t(unsafe.Sizeof(uintptr(0)))
	cSessions := (*[1 << 28]*C.ep_session)(C.malloc(C.size_t(n) * ptrSize))[:n:n]
	defer C.free(unsafe.Pointer(&cSessions[0]))
	cOpts := (*[1 << 28]*C.ep_generate_options)(C.malloc(C.size_t(n) * ptrSize))[:n:n]
	defer C.free(unsafe.Pointer(&cOpts[0]))
	cTokens := (*[1 << 28]C.int32_t)(C.malloc(C.size_t(n) * 4))[:n:n]
	defer C.free(unsafe.Pointer(&cTokens[0]))
	cLps := (*[1 << 28]*C.ep_token_logprobs)(C.malloc(C.size_t(n) * ptrSize))[:n:n]
	defer C.free(unsafe.Pointer(&cLps[0]))
	cLpStructs := (*[1 << 28]C.ep_token_logprobs)(C.malloc(C.size_t(n) * C.sizeof_ep_token_logprobs))[:n:n]
	defer C.free(unsafe.Pointer(&cLpStructs[0]))
	cTops := (*[1 << 28]C.uint32_t)(C.malloc(C.size_t(n) * 4))[:n:n]
	defer C.free(unsafe.Pointer(&cTops[0]))
	for i, s := range sessions {
		r, err := s.raw()
		if err != nil {
			return nil, err
		}
		cSessions[i] = r
		var o *GenerateOptions
		if opts != nil {
			o = opts[i]
		}
		co := o.toC()
		defer co.free()
		cOpts[i] = co.o
		cLps[i] = nil
		cTops[i] = 0
		if tops != nil && tops[i] >= 0 {
			C.ep_token_logprobs_init(&cLpStructs[i])
			cLps[i] = &cLpStructs[i]
			cTops[i] = C.uint32_t(tops[i])
		}
	}
	var lpArg **C.ep_token_logprobs
	var topArg *C.uint32_t
	if tops != nil {
		lpArg, topArg = &cLps[0], &cTops[0]
	}
	if err := call("ep_sessions_sample", func() C.ep_status {
		return C.ep_sessions_sample(&cTokens[0], lpArg, &cSessions[0], &cOpts[0], topArg, C.size_t(n))
	}); err != nil {
		return nil, err
	}
	out := make([]TokenLogprobs, n)
	for i := range out {
		out[i].Token = int32(cTokens[i])
		if cLps[i] == nil || tops == nil {
			continue
		}
		lp := &cLpStructs[i]
		out[i].Logprob = float32(lp.logprob)
		for j := 0; j < int(lp.n_top) && j < MaxTopLogprobs; j++ {
			out[i].Top = append(out[i].Top, TokenLogprob{int32(lp.top_tokens[j]), float32(lp.top_logprobs[j])})
		}
	}
	return out, nil
}
