//go:build !expertpack_nobatch && !expertpack_nologprobs && !expertpack_nosamplemany

package expertpack

import (
	"errors"
	"reflect"
	"testing"
)

// SampleMany against Sample / SampleLogprobs per session, step after step (the draw counters
// advance alike), with mixed settings; and its refusals.
func TestSampleManyEqualsEachAlone(t *testing.T) {
	f := getFixture(t)
	m := open(t, f)
	greedy := DefaultGenerateOptions()
	nucleus := DefaultGenerateOptions()
	nucleus.Temperature, nucleus.TopP, nucleus.Seed = 0.9, 0.8, 3
	penalized := DefaultGenerateOptions()
	penalized.Temperature, penalized.Seed, penalized.RepetitionPenalty = 1.2, 4, 1.3
	penalized.LogitBias = map[int32]float32{7: 2}
	opts := []*GenerateOptions{&greedy, &nucleus, &penalized}
	tops := []int{3, -1, 0}
	prompts := [][]int32{f.prompt, f.prompt[:3], {f.prompt[4], f.prompt[2], f.prompt[0]}}
	batched := make([]*Session, len(prompts))
	alone := make([]*Session, len(prompts))
	for i := range prompts {
		batched[i], alone[i] = newSession(t, m), newSession(t, m)
	}
	if err := AppendMany(batched, prompts); err != nil {
		t.Fatal(err)
	}
	if err := AppendMany(alone, prompts); err != nil {
		t.Fatal(err)
	}
	for step := 0; step < 5; step++ {
		got, err := SampleMany(batched, opts, tops)
		if err != nil {
			t.Fatal(err)
		}
		next := make([][]int32, len(prompts))
		for i, s := range alone {
			var want TokenLogprobs
			if tops[i] >= 0 {
				want, err = s.SampleLogprobs(opts[i], uint32(tops[i]))
			} else {
				want.Token, err = s.Sample(opts[i])
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got[i], want) {
				t.Fatalf("step %d session %d: batched %v, alone %v", step, i, got[i], want)
			}
			next[i] = []int32{want.Token}
		}
		if err := AppendMany(batched, next); err != nil {
			t.Fatal(err)
		}
		if err := AppendMany(alone, next); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := SampleMany([]*Session{batched[0], batched[0]}, nil, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a session twice gave %v, want ErrInvalidArgument", err)
	}
	empty := newSession(t, m)
	if _, err := SampleMany([]*Session{batched[0], empty}, nil, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a session without tokens gave %v, want ErrInvalidArgument", err)
	}
}
