//go:build !expertpack_notext && !expertpack_nobatch

package expertpack

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// hostLoop samples n tokens after "Hello" and turns them into text through a TextStream.
func hostLoop(t *testing.T, m *Model, tok *Tokenizer, f fixture, n int, stops []string) (string, bool) {
	s := newSession(t, m)
	defer s.Close()
	prompt, err := tok.Encode("Hello", true, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Append(prompt); err != nil {
		t.Fatal(err)
	}
	ts, err := NewTextStream(tok, stops)
	if err != nil {
		t.Fatal(err)
	}
	defer ts.Close()
	var sb strings.Builder
	for i := 0; i < n && !ts.Stopped(); i++ {
		next, err := s.Sample(sampledOptions(f, uint32(n)))
		if err != nil {
			t.Fatal(err)
		}
		piece, err := ts.Push(next)
		if err != nil {
			t.Fatal(err)
		}
		sb.WriteString(piece)
		if err := s.Append([]int32{next}); err != nil {
			t.Fatal(err)
		}
	}
	if !ts.Stopped() {
		rest, err := ts.Finish()
		if err != nil {
			t.Fatal(err)
		}
		sb.WriteString(rest)
	}
	return sb.String(), ts.Stopped()
}

func generateText(t *testing.T, m *Model, tok *Tokenizer, f fixture, n int, stops []string) string {
	o := sampledOptions(f, uint32(n))
	o.IgnoreEOS, o.StopStrings = true, stops
	g, err := newSession(t, m).GenerateText(tok, "Hello", o, nil)
	if err != nil {
		t.Fatal(err)
	}
	return g.Text
}

func TestTextStream(t *testing.T) {
	f := getFixture(t)
	m := open(t, f)
	tok := modelTokenizer(t, m)
	text, stopped := hostLoop(t, m, tok, f, 8, nil)
	if want := generateText(t, m, tok, f, 8, nil); stopped || text != want {
		t.Fatalf("stream %q (stopped %v), GenerateText %q", text, stopped, want)
	}
	if p := os.Getenv("EP_TEST_EXPECTED_TEXT_FILE"); p != "" {
		want, err := os.ReadFile(p)
		if err != nil || text != string(want) {
			t.Fatalf("stream %q, C API %q (%v)", text, want, err)
		}
	}
	full, _ := hostLoop(t, m, tok, f, 24, nil)
	runes := []rune(full)
	if len(runes) <= 8 {
		t.Fatalf("too little text to pick a stop string from: %q", full)
	}
	stop := string(runes[len(runes)/2 : len(runes)/2+3])
	cut, stopped := hostLoop(t, m, tok, f, 24, []string{stop})
	if !stopped || cut != full[:strings.Index(full, stop)] {
		t.Fatalf("stop %q: %q (stopped %v) from %q", stop, cut, stopped, full)
	}
	if want := generateText(t, m, tok, f, 24, []string{stop}); cut != want {
		t.Fatalf("stream %q, GenerateText %q", cut, want)
	}
	if _, err := NewTextStream(tok, []string{""}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("an empty stop string: %v", err)
	}
}
