//go:build !expertpack_notext && !expertpack_nobatch

package expertpack

/*
#include <stdlib.h>
#include "expertpack/expertpack.h"
#include "expertpack/text.h"
#include "textstream_helpers.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// TextStream turns generated tokens into text for hosts that sample themselves
// (ep_text_stream_*): Push each token and get the text it completes, as GenerateText would
// stream it (complete UTF-8 only, special tokens left out, text that may begin a stop string
// held back until it is known not to). One stream per generation; not safe for concurrent use.
// Close frees it. Its tokenizer must stay open while it is used (Push and Finish fail once the
// tokenizer is closed).
type TextStream struct {
	ptr     *C.ep_text_stream
	tok     *Tokenizer // the C stream reads it: kept alive while the stream is
	stopped bool
}

// NewTextStream opens a stream over tok; the text ends where one of stopStrings (non-empty)
// appears.
func NewTextStream(tok *Tokenizer, stopStrings []string) (*TextStream, error) {
	t, err := tok.lock()
	if err != nil {
		return nil, err
	}
	defer tok.mu.RUnlock()
	var arr **C.char
	n := len(stopStrings)
	if n > 0 {
		cs := (*[1 << 28]*C.char)(C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(uintptr(0)))))[:n:n]
		defer C.free(unsafe.Pointer(&cs[0]))
		for i, s := range stopStrings {
			cs[i] = C.CString(s)
			defer C.free(unsafe.Pointer(cs[i]))
		}
		arr = &cs[0]
	}
	var raw *C.ep_text_stream
	err = call("ep_text_stream_open", func() C.ep_status { return C.ep_text_stream_open(&raw, t, arr, C.size_t(n)) })
	if err != nil {
		return nil, err
	}
	ts := &TextStream{ptr: raw, tok: tok}
	runtime.SetFinalizer(ts, (*TextStream).Close)
	return ts, nil
}

// Close frees the stream. It is safe to call more than once.
func (ts *TextStream) Close() error {
	if ts.ptr != nil {
		C.ep_text_stream_close(ts.ptr)
		ts.ptr = nil
		runtime.SetFinalizer(ts, nil)
	}
	return nil
}

func (ts *TextStream) step(op string, f func(out *C.ep_go_text_buf, stopped *C.int32_t) C.ep_status) (string, error) {
	if ts.ptr == nil {
		return "", errClosed
	}
	// The C stream reads its tokenizer: held for the call, and refused once it was closed.
	if _, err := ts.tok.lock(); err != nil {
		return "", err
	}
	defer ts.tok.mu.RUnlock()
	var out C.ep_go_text_buf
	var stopped C.int32_t
	err := call(op, func() C.ep_status { return f(&out, &stopped) })
	text := ""
	if out.data != nil {
		text = C.GoStringN(out.data, C.int(out.length))
		C.free(unsafe.Pointer(out.data))
	}
	if err != nil {
		return "", err
	}
	ts.stopped = stopped != 0
	return text, nil
}

// Push adds one generated token and returns the text it completes (often "", at times several
// tokens' worth).
func (ts *TextStream) Push(token int32) (string, error) {
	return ts.step("ep_text_stream_push", func(out *C.ep_go_text_buf, stopped *C.int32_t) C.ep_status {
		return C.ep_go_text_stream_push(ts.ptr, C.int32_t(token), out, stopped)
	})
}

// Finish ends the text and returns what was held back (an incomplete UTF-8 sequence is dropped).
func (ts *TextStream) Finish() (string, error) {
	return ts.step("ep_text_stream_finish", func(out *C.ep_go_text_buf, stopped *C.int32_t) C.ep_status {
		return C.ep_go_text_stream_finish(ts.ptr, out, stopped)
	})
}

// Stopped reports whether a stop string appeared: the text before it was delivered, later
// tokens add nothing.
func (ts *TextStream) Stopped() bool { return ts.stopped }
