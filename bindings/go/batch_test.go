//go:build !expertpack_nobatch

package expertpack

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// The 0.2 session API (AppendMany, Sample, Fork, Tokens) against the synthetic model.

func newSession(t *testing.T, m *Model) *Session {
	s, err := m.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func mustTokens(t *testing.T, s *Session) []int32 {
	got, err := s.Tokens()
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func concat(a, b []int32) []int32 { return append(append([]int32{}, a...), b...) }

func sampledOptions(f fixture, n uint32) *GenerateOptions {
	o := DefaultGenerateOptions()
	o.MaxNewTokens, o.Temperature, o.Seed = n, f.temp, f.seed
	return &o
}

func TestSampleLoopMatchesCAPI(t *testing.T) {
	f := getFixture(t)
	m := open(t, f)
	s := newSession(t, m)
	if err := s.Append(f.prompt); err != nil {
		t.Fatal(err)
	}
	if got := mustTokens(t, s); !reflect.DeepEqual(got, f.prompt) {
		t.Fatalf("tokens %v, want %v", got, f.prompt)
	}
	var got []int32
	for i := 0; i < 8; i++ {
		tok, err := s.Sample(sampledOptions(f, 8))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, tok)
		if err := s.Append([]int32{tok}); err != nil {
			t.Fatal(err)
		}
	}
	if !reflect.DeepEqual(got, f.expected) {
		t.Fatalf("sampled %v, the C API generated %v", got, f.expected)
	}
	if all := mustTokens(t, s); !reflect.DeepEqual(all, concat(f.prompt, f.expected)) {
		t.Fatalf("session holds %v", all)
	}
}

func TestForkContinuesAsTheOriginal(t *testing.T) {
	f := getFixture(t)
	m := open(t, f)
	s := newSession(t, m)
	if err := s.Append(f.prompt); err != nil {
		t.Fatal(err)
	}
	fork, err := s.Fork()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); !errors.Is(err, ErrBusy) {
		t.Fatalf("closing the model with a fork open: %v", err)
	}
	// the fork copies the logits and the sampler position: both continue to the C API's tokens
	gf, err := fork.Generate(nil, sampledOptions(f, 8), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := mustTokens(t, s); !reflect.DeepEqual(got, f.prompt) {
		t.Fatalf("appending to the fork changed the original: %v", got)
	}
	fork.Close()
	gs, err := s.Generate(nil, sampledOptions(f, 8), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(gf.Tokens, f.expected) || !reflect.DeepEqual(gs.Tokens, f.expected) {
		t.Fatalf("fork %v, original %v, C API %v", gf.Tokens, gs.Tokens, f.expected)
	}
}

func TestAppendManyMatchesEachAlone(t *testing.T) {
	f := getFixture(t)
	m := open(t, f)
	prompts := [][]int32{f.prompt, {f.prompt[7], f.prompt[6], f.prompt[5], f.prompt[4], f.prompt[3]}}
	greedy := DefaultGenerateOptions()
	greedy.MaxNewTokens = 6
	var alone [][]int32
	for _, p := range prompts {
		g, err := newSession(t, m).Generate(p, &greedy, nil)
		if err != nil {
			t.Fatal(err)
		}
		alone = append(alone, g.Tokens)
	}
	if reflect.DeepEqual(alone[0], alone[1]) {
		t.Fatal("the two prompts should continue differently")
	}
	ss := []*Session{newSession(t, m), newSession(t, m)}
	if err := AppendMany(ss, prompts); err != nil {
		t.Fatal(err)
	}
	batched := make([][]int32, 2)
	for step := 0; step < 6; step++ {
		next, err := StepBatch(ss, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := range ss {
			batched[i] = append(batched[i], next[i])
		}
	}
	if !reflect.DeepEqual(batched, alone) {
		t.Fatalf("batched %v, alone %v", batched, alone)
	}
	for i, s := range ss {
		if got := mustTokens(t, s); !reflect.DeepEqual(got, concat(prompts[i], batched[i])) {
			t.Fatalf("session %d holds %v", i, got)
		}
	}
}

func TestBatchRefusals(t *testing.T) {
	f := getFixture(t)
	m := open(t, f)
	a, empty := newSession(t, m), newSession(t, m)
	if err := a.Append([]int32{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if err := AppendMany([]*Session{a, a}, [][]int32{{1}, {2}}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("one session twice: %v", err)
	}
	if err := AppendMany([]*Session{a, empty}, [][]int32{{1}, {}}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("no tokens for one session: %v", err)
	}
	if err := a.Append([]int32{100000000}); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "outside") {
		t.Fatalf("a token outside the vocabulary: %v", err)
	}
	if _, err := empty.Sample(nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("sampling an empty session: %v", err)
	}
	if err := AppendMany([]*Session{a}, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("mismatched lists: %v", err)
	}
	if got := mustTokens(t, a); !reflect.DeepEqual(got, []int32{1, 2, 3}) {
		t.Fatalf("refused calls changed the session: %v", got)
	}
	if got := mustTokens(t, empty); len(got) != 0 {
		t.Fatalf("empty session holds %v", got)
	}
}

func TestNewStoreCounters(t *testing.T) {
	f := getFixture(t)
	m := open(t, f)
	st, err := m.StoreStats()
	if err != nil {
		t.Fatal(err)
	}
	if st.HostSlots != 0 || st.Demotions != 0 || st.PrefetchIssued != 0 {
		t.Fatalf("no host tier and no prefetch by default: %+v", st)
	}
	d := DefaultModelOptions()
	if !d.OverlapReads || d.Prefetch || d.HostCacheBytes != 0 {
		t.Fatalf("library defaults: %+v", d)
	}
	info, _ := m.Info()
	half := uint64(info.NumLayers * info.NumExperts / 2)
	// a cache for half the experts, a host tier below it, prefetch and LRU: results are bitwise
	// the same as without any of it
	o := DefaultModelOptions()
	o.Device, o.CacheBudgetBytes, o.HostCacheBytes = DeviceCPU, st.SlotBytes*half, st.SlotBytes*half
	o.OverlapReads, o.Prefetch, o.CachePolicy = false, true, "lru"
	tiered, err := OpenModel(f.model, &o)
	if err != nil {
		t.Fatal(err)
	}
	defer tiered.Close()
	s := newSession(t, tiered)
	g, err := s.Generate(f.prompt, sampledOptions(f, 8), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g.Tokens, f.expected) {
		t.Fatalf("with a host tier %v, the C API %v", g.Tokens, f.expected)
	}
	s.Close()
	ts, err := tiered.StoreStats()
	if err != nil {
		t.Fatal(err)
	}
	if ts.HostSlots == 0 || ts.Demotions == 0 || ts.HostHits == 0 || ts.HostHits+ts.HostMisses != ts.CacheMisses ||
		ts.PrefetchIssued == 0 || ts.PrefetchUsed > ts.PrefetchIssued {
		t.Fatalf("host tier counters: %+v", ts)
	}
	o.CachePolicy = "no-such-policy"
	if _, err := OpenModel(f.model, &o); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "no-such-policy") {
		t.Fatalf("an unknown cache policy: %v", err)
	}
}
