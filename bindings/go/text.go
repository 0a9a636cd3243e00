//go:build !expertpack_notext

package expertpack

/*
#include <stdlib.h>
#include "expertpack/expertpack.h"
#include "expertpack/text.h"
#include "text_helpers.h"
*/
import "C"

import (
	"errors"
	"runtime"
	"runtime/cgo"
	"sync"
	"unsafe"
)

// ChatTemplate is a chat template family.
type ChatTemplate int32

const (
	ChatTemplateAuto       ChatTemplate = 0
	ChatTemplateDeepseekV4 ChatTemplate = 1
	ChatTemplateKimiK3     ChatTemplate = 2
	ChatTemplateNone       ChatTemplate = 3
)

// TokenizerInfo describes a tokenizer.
type TokenizerInfo struct {
	VocabSize                 uint32
	BOSID, EOSID, EndOfTurnID int32
	ChatTemplate              ChatTemplate
}

// ChatMessage is one message of a conversation.
type ChatMessage struct {
	Role, Content    string
	ReasoningContent string // assistant messages: the thinking text ("" = none)
}

// ChatOptions are the options of chat rendering.
type ChatOptions struct {
	Template            ChatTemplate
	Thinking            int32 // 1 on, 0 off, -1 the template's default
	AddGenerationPrompt bool
}

// DefaultChatOptions are the library's defaults (ep_chat_options_init).
func DefaultChatOptions() ChatOptions {
	var o C.ep_chat_options
	C.ep_chat_options_init(&o)
	return ChatOptions{Template: ChatTemplate(o.chat_template), Thinking: int32(o.thinking),
		AddGenerationPrompt: o.add_generation_prompt != 0}
}

// Tokenizer is an open tokenizer (immutable: safe for concurrent use).
type Tokenizer struct {
	mu  sync.RWMutex
	ptr *C.ep_tokenizer
}

func newTokenizer(raw *C.ep_tokenizer) *Tokenizer {
	t := &Tokenizer{ptr: raw}
	runtime.SetFinalizer(t, (*Tokenizer).Close)
	return t
}

// OpenTokenizer opens a tokenizer file: a .gguf, a tokenizer.json (or its folder), or a tiktoken file.
func OpenTokenizer(path string) (*Tokenizer, error) {
	p := C.CString(path)
	defer C.free(unsafe.Pointer(p))
	var raw *C.ep_tokenizer
	if err := call("ep_tokenizer_open", func() C.ep_status { return C.ep_tokenizer_open(&raw, p) }); err != nil {
		return nil, err
	}
	return newTokenizer(raw), nil
}

// Tokenizer opens the model's own tokenizer; it may outlive the model.
func (m *Model) Tokenizer() (*Tokenizer, error) {
	r, err := m.raw()
	if err != nil {
		return nil, err
	}
	var raw *C.ep_tokenizer
	if err := call("ep_tokenizer_open_model", func() C.ep_status { return C.ep_tokenizer_open_model(&raw, r) }); err != nil {
		return nil, err
	}
	return newTokenizer(raw), nil
}

// Close frees the tokenizer. It is safe to call more than once.
func (t *Tokenizer) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ptr != nil {
		C.ep_tokenizer_close(t.ptr)
		t.ptr = nil
		runtime.SetFinalizer(t, nil)
	}
	return nil
}

func (t *Tokenizer) lock() (*C.ep_tokenizer, error) {
	t.mu.RLock()
	if t.ptr == nil {
		t.mu.RUnlock()
		return nil, errClosed
	}
	return t.ptr, nil
}

// Info describes the tokenizer.
func (t *Tokenizer) Info() (TokenizerInfo, error) {
	r, err := t.lock()
	if err != nil {
		return TokenizerInfo{}, err
	}
	defer t.mu.RUnlock()
	var p C.ep_tokenizer_properties
	C.ep_tokenizer_properties_init(&p)
	if err := call("ep_tokenizer_info", func() C.ep_status { return C.ep_tokenizer_info(&p, r) }); err != nil {
		return TokenizerInfo{}, err
	}
	return TokenizerInfo{VocabSize: uint32(p.vocab_size), BOSID: int32(p.bos_id), EOSID: int32(p.eos_id),
		EndOfTurnID: int32(p.end_of_turn_id), ChatTemplate: ChatTemplate(p.chat_template)}, nil
}

// TokenID is the id of one token given by its text.
func (t *Tokenizer) TokenID(token string) (int32, error) {
	r, err := t.lock()
	if err != nil {
		return 0, err
	}
	defer t.mu.RUnlock()
	c := C.CString(token)
	defer C.free(unsafe.Pointer(c))
	var id C.int32_t
	err = call("ep_tokenizer_token_id", func() C.ep_status { return C.ep_tokenizer_token_id(&id, r, c) })
	return int32(id), err
}

// Encode gives the token ids of text. addSpecial adds BOS/EOS as configured; specialAsText
// tokenizes special tokens' text as plain text.
func (t *Tokenizer) Encode(text string, addSpecial, specialAsText bool) ([]int32, error) {
	r, err := t.lock()
	if err != nil {
		return nil, err
	}
	defer t.mu.RUnlock()
	flags := C.uint32_t(0)
	if addSpecial {
		flags |= C.EP_TOKENIZE_ADD_SPECIAL
	}
	if specialAsText {
		flags |= C.EP_TOKENIZE_SPECIAL_AS_TEXT
	}
	ctext := C.CString(text)
	defer C.free(unsafe.Pointer(ctext))
	var count C.size_t
	if err := call("ep_tokenize", func() C.ep_status {
		return C.ep_tokenize(nil, 0, &count, r, ctext, C.size_t(len(text)), flags)
	}); err != nil {
		return nil, err
	}
	for {
		capacity := count
		buf := (*C.int32_t)(C.malloc(C.size_t(capacity+1) * 4))
		err := call("ep_tokenize", func() C.ep_status {
			return C.ep_tokenize(buf, capacity, &count, r, ctext, C.size_t(len(text)), flags)
		})
		if err != nil || count <= capacity {
			ids := make([]int32, int(count))
			if err == nil && count > 0 {
				src := (*[1 << 28]C.int32_t)(unsafe.Pointer(buf))[:count:count]
				for i := range ids {
					ids[i] = int32(src[i])
				}
			}
			C.free(unsafe.Pointer(buf))
			if err != nil {
				return nil, err
			}
			return ids, nil
		}
		C.free(unsafe.Pointer(buf))
	}
}

// fillText calls a buffer-filling C function until its text fits.
func fillText(op string, f func(buf *C.char, capacity C.size_t, length *C.size_t) C.ep_status) (string, error) {
	var length C.size_t
	if err := call(op, func() C.ep_status { return f(nil, 0, &length) }); err != nil {
		return "", err
	}
	for {
		capacity := length + 1
		buf := (*C.char)(C.malloc(capacity))
		err := call(op, func() C.ep_status { return f(buf, capacity, &length) })
		if err != nil {
			C.free(unsafe.Pointer(buf))
			return "", err
		}
		if length < capacity {
			s := C.GoStringN(buf, C.int(length))
			C.free(unsafe.Pointer(buf))
			return s, nil
		}
		C.free(unsafe.Pointer(buf))
	}
}

// Decode gives the text of token ids (invalid UTF-8 becomes U+FFFD).
func (t *Tokenizer) Decode(ids []int32, skipSpecial bool) (string, error) {
	r, err := t.lock()
	if err != nil {
		return "", err
	}
	defer t.mu.RUnlock()
	flags := C.uint32_t(0)
	if skipSpecial {
		flags = C.EP_DETOKENIZE_SKIP_SPECIAL
	}
	var p *C.int32_t
	if len(ids) > 0 {
		p = (*C.int32_t)(unsafe.Pointer(&ids[0]))
	}
	s, err := fillText("ep_detokenize", func(buf *C.char, capacity C.size_t, length *C.size_t) C.ep_status {
		return C.ep_detokenize(buf, capacity, length, r, p, C.size_t(len(ids)), flags)
	})
	runtime.KeepAlive(ids)
	return s, err
}

// cMessages is a C array of ep_chat_message in C memory.
type cMessages struct {
	arr   *C.ep_chat_message
	n     int
	frees []unsafe.Pointer
}

func toCMessages(msgs []ChatMessage) *cMessages {
	c := &cMessages{n: len(msgs)}
	if len(msgs) == 0 {
		return c
	}
	c.arr = (*C.ep_chat_message)(C.calloc(C.size_t(len(msgs)), C.sizeof_ep_chat_message))
	c.frees = append(c.frees, unsafe.Pointer(c.arr))
	arr := (*[1 << 20]C.ep_chat_message)(unsafe.Pointer(c.arr))[:len(msgs):len(msgs)]
	for i, m := range msgs {
		arr[i].role = C.CString(m.Role)
		arr[i].content = C.CString(m.Content)
		c.frees = append(c.frees, unsafe.Pointer(arr[i].role), unsafe.Pointer(arr[i].content))
		if m.ReasoningContent != "" {
			arr[i].reasoning_content = C.CString(m.ReasoningContent)
			c.frees = append(c.frees, unsafe.Pointer(arr[i].reasoning_content))
		}
	}
	return c
}

func (c *cMessages) free() {
	for _, p := range c.frees {
		C.free(p)
	}
}

func (o *ChatOptions) toC() C.ep_chat_options {
	var c C.ep_chat_options
	C.ep_chat_options_init(&c)
	if o != nil {
		c.chat_template = C.ep_chat_template(o.Template)
		c.thinking = C.int32_t(o.Thinking)
		c.add_generation_prompt = b2i(o.AddGenerationPrompt)
	}
	return c
}

// RenderChat renders a conversation with a chat template. opts nil means DefaultChatOptions().
func (t *Tokenizer) RenderChat(msgs []ChatMessage, opts *ChatOptions) (string, error) {
	r, err := t.lock()
	if err != nil {
		return "", err
	}
	defer t.mu.RUnlock()
	cm := toCMessages(msgs)
	defer cm.free()
	co := (*C.ep_chat_options)(C.malloc(C.sizeof_ep_chat_options))
	defer C.free(unsafe.Pointer(co))
	*co = opts.toC()
	return fillText("ep_chat_render", func(buf *C.char, capacity C.size_t, length *C.size_t) C.ep_status {
		return C.ep_chat_render(buf, capacity, length, r, cm.arr, C.size_t(cm.n), co)
	})
}

// TextGeneration is the result of GenerateText and GenerateChat.
type TextGeneration struct {
	Text      string // the streamed pieces joined
	Stats     GenerateStats
	Cancelled bool
}

type textState struct {
	f     func(string) bool
	text  []byte
	panic interface{}
}

//export epGoText
func epGoText(piece *C.char, length C.size_t, handle C.uintptr_t) C.int {
	st := cgo.Handle(handle).Value().(*textState)
	s := C.GoStringN(piece, C.int(length))
	st.text = append(st.text, s...)
	if st.f == nil {
		return 0
	}
	keepGoing := false
	func() {
		defer func() {
			if r := recover(); r != nil {
				st.panic = r
			}
		}()
		keepGoing = st.f(s)
	}()
	if !keepGoing {
		return 1
	}
	return 0
}

func (s *Session) textCall(op string, onText func(string) bool,
	f func(stats *C.ep_generate_stats, handle C.uintptr_t) C.ep_status) (*TextGeneration, error) {
	st := &textState{f: onText}
	h := cgo.NewHandle(st)
	defer h.Delete()
	var stats C.ep_generate_stats
	C.ep_generate_stats_init(&stats)
	err := call(op, func() C.ep_status { return f(&stats, C.uintptr_t(h)) })
	if st.panic != nil {
		panic(st.panic)
	}
	g := &TextGeneration{Text: string(st.text), Stats: statsFromC(&stats)}
	if errors.Is(err, ErrCancelled) {
		g.Cancelled = true
		err = nil
	}
	if err != nil {
		return nil, err
	}
	return g, nil
}

// GenerateText appends a text prompt and generates text, streaming complete UTF-8 pieces to
// onText (may be nil; returning false stops).
func (s *Session) GenerateText(tok *Tokenizer, prompt string, opts *GenerateOptions, onText func(piece string) bool) (*TextGeneration, error) {
	r, err := s.raw()
	if err != nil {
		return nil, err
	}
	tr, err := tok.lock()
	if err != nil {
		return nil, err
	}
	defer tok.mu.RUnlock()
	co := opts.toC()
	defer co.free()
	p := C.CString(prompt)
	defer C.free(unsafe.Pointer(p))
	return s.textCall("ep_generate_text", onText, func(stats *C.ep_generate_stats, h C.uintptr_t) C.ep_status {
		return C.ep_go_generate_text(stats, r, tr, p, co.o, h)
	})
}

// GenerateChat renders the conversation and generates the assistant's answer; use the same
// session for the next turn (the common prefix is reused). chat nil means DefaultChatOptions().
func (s *Session) GenerateChat(tok *Tokenizer, msgs []ChatMessage, chat *ChatOptions, opts *GenerateOptions, onText func(piece string) bool) (*TextGeneration, error) {
	r, err := s.raw()
	if err != nil {
		return nil, err
	}
	tr, err := tok.lock()
	if err != nil {
		return nil, err
	}
	defer tok.mu.RUnlock()
	co := opts.toC()
	defer co.free()
	cm := toCMessages(msgs)
	defer cm.free()
	cc := (*C.ep_chat_options)(C.malloc(C.sizeof_ep_chat_options))
	defer C.free(unsafe.Pointer(cc))
	*cc = chat.toC()
	return s.textCall("ep_generate_chat", onText, func(stats *C.ep_generate_stats, h C.uintptr_t) C.ep_status {
		return C.ep_go_generate_chat(stats, r, tr, cm.arr, C.size_t(cm.n), cc, co.o, h)
	})
}
