//go:build !expertpack_nobatch

package expertpack

/*
#include <stdlib.h>
#include "expertpack/expertpack.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// Fork opens a copy of the session (ep_session_fork): the same tokens, decode state, last
// logits and sampler position. Appending to either leaves the other as it is, so a prompt's
// state can be kept and continued later without running the prompt again. Close the copy like
// any session.
func (s *Session) Fork() (*Session, error) {
	r, err := s.raw()
	if err != nil {
		return nil, err
	}
	m := s.model
	m.mu.Lock()
	defer m.mu.Unlock()
	var raw *C.ep_session
	if err := call("ep_session_fork", func() C.ep_status { return C.ep_session_fork(&raw, r) }); err != nil {
		return nil, err
	}
	m.sessions++
	f := &Session{model: m, ptr: raw}
	runtime.SetFinalizer(f, (*Session).Close)
	return f, nil
}

// Tokens are the token ids the session holds, in order (ep_session_tokens).
func (s *Session) Tokens() ([]int32, error) {
	r, err := s.raw()
	if err != nil {
		return nil, err
	}
	var count C.size_t
	if err := call("ep_session_tokens", func() C.ep_status { return C.ep_session_tokens(nil, 0, &count, r) }); err != nil {
		return nil, err
	}
	for {
		capacity := count
		out := make([]int32, int(capacity)+1)
		err := call("ep_session_tokens", func() C.ep_status {
			return C.ep_session_tokens((*C.int32_t)(unsafe.Pointer(&out[0])), capacity, &count, r)
		})
		if err != nil {
			return nil, err
		}
		if count <= capacity {
			return out[:int(count)], nil
		}
	}
}

// Append appends token ids to the session without generating (AppendMany of this one
// session); Sample then draws the token after them.
func (s *Session) Append(tokens []int32) error {
	return AppendMany([]*Session{s}, [][]int32{tokens})
}

// Sample draws the next token from the logits after the session's last token, where they were
// computed (ep_session_sample); the token is not appended. Of opts, Temperature, TopK, TopP,
// MinP, Seed, RepetitionPenalty and RepetitionWindow apply; nil means DefaultGenerateOptions()
// (greedy). The session's draw counter advances, so sample-and-append with a seed repeats what
// Generate gives for that seed.
func (s *Session) Sample(opts *GenerateOptions) (int32, error) {
	r, err := s.raw()
	if err != nil {
		return -1, err
	}
	co := opts.toC()
	defer co.free()
	var tok C.int32_t
	err = call("ep_session_sample", func() C.ep_status { return C.ep_session_sample(&tok, r, co.o) })
	return int32(tok), err
}

// AppendMany appends tokens[i] (at least one id each: a prefill chunk or one decode token) to
// sessions[i] for every i in one forward pass (ep_sessions_append): the routed experts of all
// of them are read once. The sessions must be distinct and of one model. Each session's logits
// are those of appending its tokens alone. After an error other than ErrInvalidArgument, every
// session of the call must be reset.
func AppendMany(sessions []*Session, tokens [][]int32) error {
	n := len(sessions)
	if n != len(tokens) {
		return &Error{Op: "ep_sessions_append", Status: ErrInvalidArgument,
			Message: "AppendMany: the numbers of sessions and token lists differ"}
	}
	if n == 0 {
		return &Error{Op: "ep_sessions_append", Status: ErrInvalidArgument, Message: "AppendMany: no sessions"}
	}
	total := 0
	for _, t := range tokens {
		total += len(t)
	}
	// C may not keep Go pointers in C-visible arrays: the token lists and the arrays of
	// pointers live in C memory for the call.
	ptrSize := C.size_t(unsafe.Sizeof(uintptr(0)))
	cSessions := (*[1 << 28]*C.ep_session)(C.malloc(C.size_t(n) * ptrSize))[:n:n]
	defer C.free(unsafe.Pointer(&cSessions[0]))
	cTokens := (*[1 << 28]*C.int32_t)(C.malloc(C.size_t(n) * ptrSize))[:n:n]
	defer C.free(unsafe.Pointer(&cTokens[0]))
	cCounts := (*[1 << 28]C.size_t)(C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(C.size_t(0)))))[:n:n]
	defer C.free(unsafe.Pointer(&cCounts[0]))
	buf := (*[1 << 28]C.int32_t)(C.malloc(C.size_t(total+1) * 4))[: total+1 : total+1]
	defer C.free(unsafe.Pointer(&buf[0]))
	at := 0
	for i, s := range sessions {
		r, err := s.raw()
		if err != nil {
			return err
		}
		cSessions[i] = r
		cTokens[i] = &buf[at]
		cCounts[i] = C.size_t(len(tokens[i]))
		for _, t := range tokens[i] {
			buf[at] = C.int32_t(t)
			at++
		}
	}
	return call("ep_sessions_append", func() C.ep_status {
		return C.ep_sessions_append(&cSessions[0], &cTokens[0], &cCounts[0], C.size_t(n))
	})
}

// StepBatch is one decode step of a continuous batch: it samples each session's next token
// with opts (Session.Sample), appends all of them in one AppendMany call, and returns them in
// the order of sessions.
func StepBatch(sessions []*Session, opts *GenerateOptions) ([]int32, error) {
	next := make([]int32, len(sessions))
	lists := make([][]int32, len(sessions))
	for i, s := range sessions {
		t, err := s.Sample(opts)
		if err != nil {
			return nil, err
		}
		next[i] = t
		lists[i] = next[i : i+1]
	}
	if err := AppendMany(sessions, lists); err != nil {
		return nil, err
	}
	return next, nil
}
