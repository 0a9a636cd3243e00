//go:build !expertpack_nobatch && !expertpack_nologprobs

package expertpack

import (
	"errors"
	"reflect"
	"testing"
)

// The 0.4 log-probabilities and logit bias against the synthetic model.
func TestLogprobsAndLogitBias(t *testing.T) {
	f := getFixture(t)
	m := open(t, f)
	s := newSession(t, m)
	if err := s.Append(f.prompt); err != nil {
		t.Fatal(err)
	}
	greedy := DefaultGenerateOptions()
	lp, err := s.SampleLogprobs(&greedy, 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(lp.Top) != 5 || lp.Top[0] != lp.TokenLogprob {
		t.Fatalf("greedy %v is not the first of the alternatives %v", lp.TokenLogprob, lp.Top)
	}
	for i := 1; i < len(lp.Top); i++ {
		if lp.Top[i].Logprob > lp.Top[i-1].Logprob {
			t.Fatalf("alternatives not sorted: %v", lp.Top)
		}
	}
	forced := int32(7)
	if lp.Token == forced {
		forced = 8
	}
	biased := DefaultGenerateOptions()
	biased.LogitBias = map[int32]float32{forced: 100}
	if tok, err := s.Sample(&biased); err != nil || tok != forced {
		t.Fatalf("+100 on %d gave %d (%v)", forced, tok, err)
	}
	withBias, err := s.SampleLogprobs(&biased, 5)
	if err != nil || withBias.Token != forced || !reflect.DeepEqual(withBias.Top, lp.Top) {
		t.Fatalf("a bias moved the log-probabilities: %v, want the top %v (%v)", withBias, lp.Top, err)
	}
	biased.LogitBias = map[int32]float32{forced: 101}
	if _, err := s.Sample(&biased); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a bias of 101 gave %v, want ErrInvalidArgument", err)
	}
}
