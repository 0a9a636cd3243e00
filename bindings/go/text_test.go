//go:build !expertpack_notext

package expertpack

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The tokenizer comes from EP_TEST_TOKENIZER (a tokenizer.json; scripts/test-bindings sets it to
// the DeepSeek-V3 tokenizer of tests/data); generation needs the model's own tokenizer.

func TestTokenizer(t *testing.T) {
	path := os.Getenv("EP_TEST_TOKENIZER")
	if path == "" {
		t.Skip("EP_TEST_TOKENIZER is not set")
	}
	tok, err := OpenTokenizer(path)
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Close()
	text := "Hello, world! Grüße — 你好"
	ids, err := tok.Encode(text, false, false)
	if err != nil || len(ids) == 0 {
		t.Fatal(ids, err)
	}
	back, err := tok.Decode(ids, false)
	if err != nil || back != text {
		t.Fatalf("%q %v", back, err)
	}
	chat := DefaultChatOptions()
	chat.Template = ChatTemplateDeepseekV4
	r, err := tok.RenderChat([]ChatMessage{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi there"}}, &chat)
	if err != nil || !strings.Contains(r, "Be brief.") || !strings.Contains(r, "Hi there") {
		t.Fatalf("%q %v", r, err)
	}
	_, err = OpenTokenizer(filepath.Join(env(t, "EP_TEST_DIR"), "no-such-tokenizer.json"))
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "no-such-tokenizer.json") {
		t.Fatal(err)
	}
}

// modelTokenizer opens the model's own tokenizer (closed at the end of the test), or skips the
// test when the model has none.
func modelTokenizer(t *testing.T, m *Model) *Tokenizer {
	tok, err := m.Tokenizer()
	if errors.Is(err, ErrNotFound) {
		t.Skip("the synthetic model has no tokenizer:", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tok.Close() })
	return tok
}

func TestGenerateText(t *testing.T) {
	f := getFixture(t)
	m := open(t, f)
	tok := modelTokenizer(t, m)
	s, _ := m.NewSession()
	defer s.Close()
	opts := DefaultGenerateOptions()
	opts.MaxNewTokens, opts.Temperature, opts.Seed, opts.IgnoreEOS = 8, f.temp, f.seed, true
	var sb strings.Builder
	g, err := s.GenerateText(tok, "Hello", &opts, func(p string) bool { sb.WriteString(p); return true })
	if err != nil {
		t.Fatal(err)
	}
	n, _ := s.Len()
	if sb.String() != g.Text || g.Stats.GeneratedTokens != 8 || g.Stats.SessionTokens != n {
		t.Fatalf("%q vs %q, %+v", sb.String(), g.Text, g.Stats)
	}
	// The C API's text (ep-run --prompt Hello, and --chat --prompt Hi) for the same options.
	if p := os.Getenv("EP_TEST_EXPECTED_TEXT_FILE"); p != "" {
		want, err := os.ReadFile(p)
		if err != nil || g.Text != string(want) {
			t.Fatalf("text %q, C API %q (%v)", g.Text, want, err)
		}
	}
	s.Reset()
	c, err := s.GenerateChat(tok, []ChatMessage{{Role: "user", Content: "Hi"}}, nil, &opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p := os.Getenv("EP_TEST_EXPECTED_CHAT_FILE"); p != "" {
		want, err := os.ReadFile(p)
		if err != nil || c.Text != string(want) {
			t.Fatalf("chat %q, C API %q (%v)", c.Text, want, err)
		}
	}
}
