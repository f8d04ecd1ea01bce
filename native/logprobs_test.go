package native

import (
	"math"
	"testing"

	"github.com/modelqual/modelqual/fixtures"
)

// logSoftmax is the float64 log_softmax of one logits row: the independent side of the
// logprobs tests (the engine computes it in C from its own logits row).
func logSoftmax(row []float32) []float64 {
	mx := math.Inf(-1)
	for _, v := range row {
		mx = math.Max(mx, float64(v))
	}
	var sum float64
	for _, v := range row {
		sum += math.Exp(float64(v) - mx)
	}
	lse := mx + math.Log(sum)
	out := make([]float64, len(row))
	for i, v := range row {
		out[i] = float64(v) - lse
	}
	return out
}

// TestLogprobsMatchLogits: every generated token's logprob and its top candidates are the
// log_softmax of the logits at its position (as Logits computes them), whether the token was
// chosen greedily or sampled (raw logprobs: temperature and top-p do not change them), alone
// or batched with a sequence that asked for none.
func TestLogprobsMatchLogits(t *testing.T) {
	for _, name := range []string{fixtures.Qwen3Tiny, fixtures.GPT2Tiny} {
		t.Run(name, func(t *testing.T) {
			e := openEngine(t, name, Params{})
			V := e.Info().VocabSize
			prompt := testPrompts[1]
			for _, s := range []Sampling{
				{MaxNewTokens: 8, IgnoreEOS: true, Logprobs: true, TopLogprobs: 5},
				{MaxNewTokens: 8, IgnoreEOS: true, Logprobs: true, TopLogprobs: 20, Temperature: 0.7, TopP: 0.9, Seed: 3},
				{MaxNewTokens: 8, IgnoreEOS: true, Logprobs: true, Temperature: 1.3, Seed: 4},
			} {
				other, err := e.Add(testPrompts[0], Sampling{MaxNewTokens: 8, IgnoreEOS: true})
				if err != nil {
					t.Fatal(err)
				}
				id, err := e.Add(prompt, s)
				if err != nil {
					t.Fatal(err)
				}
				var evs []Event
				for e.Active() > 0 {
					if _, err := e.Step(func(ev Event) {
						if ev.Seq == id && ev.Token >= 0 {
							evs = append(evs, ev)
						}
						if ev.Seq == other && ev.HasLogprob {
							t.Errorf("a sequence without logprobs got one")
						}
					}); err != nil {
						t.Fatal(err)
					}
				}
				if len(evs) != s.MaxNewTokens {
					t.Fatalf("%+v: %d token events, want %d", s, len(evs), s.MaxNewTokens)
				}
				all := append([]int32{}, prompt...)
				for _, ev := range evs {
					all = append(all, ev.Token)
				}
				lg, err := e.Logits(all[:len(all)-1])
				if err != nil {
					t.Fatal(err)
				}
				for k, ev := range evs {
					pos := len(prompt) - 1 + k
					want := logSoftmax(lg[pos*V : (pos+1)*V])
					if !ev.HasLogprob {
						t.Fatalf("%+v step %d: no logprob", s, k)
					}
					if d := math.Abs(float64(ev.Logprob) - want[ev.Token]); d > 1e-4 {
						t.Fatalf("%+v step %d: logprob of %d is %g, log_softmax of the logits %g", s, k, ev.Token, ev.Logprob, want[ev.Token])
					}
					rank := 1
					for _, w := range want {
						if w > want[ev.Token] {
							rank++
						}
					}
					if ev.Rank != rank {
						t.Fatalf("%+v step %d: rank %d, want %d", s, k, ev.Rank, rank)
					}
					if len(ev.Top) != s.TopLogprobs {
						t.Fatalf("%+v step %d: %d candidates, want %d", s, k, len(ev.Top), s.TopLogprobs)
					}
					for j, c := range ev.Top {
						if d := math.Abs(float64(c.Logprob) - want[c.ID]); d > 1e-4 {
							t.Fatalf("%+v step %d candidate %d: id %d logprob %g, want %g", s, k, j, c.ID, c.Logprob, want[c.ID])
						}
						if j > 0 && c.Logprob > ev.Top[j-1].Logprob {
							t.Fatalf("%+v step %d: candidates not in descending order: %v", s, k, ev.Top)
						}
					}
					if s.TopLogprobs > 0 {
						// The top candidate is the most likely token: nothing beats it.
						best := ev.Top[0].Logprob
						for v, w := range want {
							if w > float64(best)+1e-4 {
								t.Fatalf("%+v step %d: token %d (%g) beats the first candidate %v", s, k, v, w, ev.Top[0])
							}
						}
					}
				}
			}
		})
	}
}

// TestLogprobsMock: the mock's distribution is one-hot (logit 1 on its token, 0 elsewhere), so
// its token's logprob is 1 - log(e + V - 1).
func TestLogprobsMock(t *testing.T) {
	e := openEngine(t, "mock:0s", Params{})
	V := float64(e.Info().VocabSize)
	id, err := e.Add([]int32{1, 2}, Sampling{MaxNewTokens: 3, Logprobs: true, TopLogprobs: 2})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for e.Active() > 0 {
		if _, err := e.Step(func(ev Event) {
			if ev.Seq != id || ev.Token < 0 {
				return
			}
			n++
			want := 1 - math.Log(math.E+V-1)
			if math.Abs(float64(ev.Logprob)-want) > 1e-5 || len(ev.Top) != 2 || ev.Top[0].ID != ev.Token {
				t.Errorf("mock token %d: logprob %g top %v; want %g with the token first", ev.Token, ev.Logprob, ev.Top, want)
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	if n != 3 {
		t.Fatalf("%d tokens, want 3", n)
	}
}

func TestLogprobsRange(t *testing.T) {
	e := openEngine(t, "mock:0s", Params{})
	if _, err := e.Add([]int32{1}, Sampling{MaxNewTokens: 1, Logprobs: true, TopLogprobs: MaxTopLogprobs + 1}); err == nil {
		t.Fatal("top_logprobs 21 accepted")
	}
}
