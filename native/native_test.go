package native

import (
	"errors"
	"math"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/native/bundle"
)

// Bundles are built once into the content-keyed cache ($MODELQUAL_CACHE, else
// <repo>/.cache/modelqual) and opened once per test process.
var (
	bundleMu sync.Mutex
	opened   = map[string]*bundle.Bundle{}
)

func testBundle(t testing.TB, name string) *bundle.Bundle {
	t.Helper()
	bundleMu.Lock()
	defer bundleMu.Unlock()
	if b, ok := opened[name]; ok {
		return b
	}
	var path string
	var err error
	if strings.HasPrefix(name, "mock:") {
		var d time.Duration
		if d, err = time.ParseDuration(strings.TrimPrefix(name, "mock:")); err != nil {
			t.Fatal(err)
		}
		path, err = fixtures.MockBundle(fixtures.DefaultCacheDir(), d)
	} else {
		path, err = fixtures.Bundle(fixtures.DefaultCacheDir(), name)
	}
	if err != nil {
		t.Fatalf("build bundle %s: %v", name, err)
	}
	b, err := bundle.Open(path)
	if err != nil {
		t.Fatalf("open bundle %s: %v", name, err)
	}
	opened[name] = b
	return b
}

func openEngine(t testing.TB, name string, p Params) *Engine {
	t.Helper()
	return openOn(t, name, p.Device, p)
}

// result is what a sequence produced, collected from Step events.
type result struct {
	tokens []int32
	reason FinishReason
	timing Timing
	done   bool
}

// runAll steps until the engine is idle and returns every sequence's result.
func runAll(t testing.TB, e *Engine) map[SeqID]*result {
	t.Helper()
	res := map[SeqID]*result{}
	for steps := 0; e.Active() > 0; steps++ {
		if steps > 10000 {
			t.Fatal("engine did not finish within 10000 steps")
		}
		if _, err := e.Step(func(ev Event) { collect(res, ev) }); err != nil {
			t.Fatal(err)
		}
	}
	return res
}

func collect(res map[SeqID]*result, ev Event) {
	r := res[ev.Seq]
	if r == nil {
		r = &result{}
		res[ev.Seq] = r
	}
	if ev.Token >= 0 {
		r.tokens = append(r.tokens, ev.Token)
	}
	if ev.Done {
		r.done, r.reason, r.timing = true, ev.Reason, ev.Timing
	}
}

func generate(t testing.TB, e *Engine, prompt []int32, s Sampling) *result {
	t.Helper()
	id, err := e.Add(prompt, s)
	if err != nil {
		t.Fatal(err)
	}
	return runAll(t, e)[id]
}

// prompts of different lengths (ids valid in both fixture vocabularies).
var testPrompts = [][]int32{
	{15496, 11, 995},
	{40, 1842, 284, 4483, 257, 1492, 546, 262, 1110, 13, 383, 3290},
	{7},
	{464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13, 632, 373, 257, 3621, 1110, 290, 1123, 1907, 1234, 2406, 3436, 1165, 5332},
}

func argmax(row []float32) int32 {
	best := 0
	for i, v := range row {
		if v > row[best] {
			best = i
		}
	}
	return int32(best)
}

func maxAbsDiff(t testing.TB, got []float32, want [][]float64) float64 {
	t.Helper()
	V := len(want[0])
	if len(got) != len(want)*V {
		t.Fatalf("logits length %d, want %d positions x %d", len(got), len(want), V)
	}
	var worst float64
	for p := range want {
		for v := 0; v < V; v++ {
			worst = math.Max(worst, math.Abs(float64(got[p*V+v])-want[p][v]))
		}
	}
	return worst
}

// TestLogitsMatchReference: native logits at every position agree with the independent
// float64 reference within 1e-4 (the native-vs-reference tolerance).
func TestLogitsMatchReference(t *testing.T) {
	for _, name := range []string{fixtures.Qwen3Tiny, fixtures.GPT2Tiny, fixtures.Qwen3Odd} {
		t.Run(name, func(t *testing.T) {
			e := openEngine(t, name, Params{})
			ids := testPrompts[3]
			got, err := e.Logits(ids)
			if err != nil {
				t.Fatal(err)
			}
			want := refLogits(t, testBundle(t, name), ids)
			if d := maxAbsDiff(t, got, want); d > 1e-4 {
				t.Fatalf("%s: max |native - reference| logit = %.3g over %d positions, want <= 1e-4", name, d, len(ids))
			} else {
				t.Logf("%s: max |Δlogit| = %.3g", name, d)
			}
		})
	}
}

// TestFaultsBreakReferenceParity proves the parity check above bites: each planted qwen3
// fault moves the logits far past its tolerance.
func TestFaultsBreakReferenceParity(t *testing.T) {
	ids := testPrompts[3]
	want := refLogits(t, testBundle(t, fixtures.Qwen3Tiny), ids)
	for _, fault := range []string{"qwen3.rope_theta_x10", "qwen3.drop_q_norm"} {
		t.Run(fault, func(t *testing.T) {
			t.Setenv("MODELQUAL_FAULTS", "unrelated.fault, "+fault)
			e := openEngine(t, fixtures.Qwen3Tiny, Params{})
			got, err := e.Logits(ids)
			if err != nil {
				t.Fatal(err)
			}
			if d := maxAbsDiff(t, got, want); d <= 1e-4 {
				t.Fatalf("with MODELQUAL_FAULTS=%s the logits still match the reference (max diff %.3g): the fault is not applied", fault, d)
			} else {
				t.Logf("%s: max |Δlogit| = %.3g (tolerance 1e-4)", fault, d)
			}
		})
	}
}

// TestGreedyFollowsLogits: every greedy token is the argmax of the Logits entry point at the
// position that produced it, so the parity entry point sees what generation used.
func TestGreedyFollowsLogits(t *testing.T) {
	for _, name := range []string{fixtures.Qwen3Tiny, fixtures.GPT2Tiny, fixtures.Qwen3Odd} {
		t.Run(name, func(t *testing.T) {
			e := openEngine(t, name, Params{})
			prompt := testPrompts[1]
			r := generate(t, e, prompt, Sampling{MaxNewTokens: 12, IgnoreEOS: true})
			if len(r.tokens) != 12 || r.reason != FinishLength {
				t.Fatalf("got %d tokens, reason %q; want 12, length", len(r.tokens), r.reason)
			}
			all := append(append([]int32{}, prompt...), r.tokens...)
			lg, err := e.Logits(all[:len(all)-1])
			if err != nil {
				t.Fatal(err)
			}
			V := e.Info().VocabSize
			for s, tok := range r.tokens {
				pos := len(prompt) - 1 + s
				if a := argmax(lg[pos*V : (pos+1)*V]); a != tok {
					t.Fatalf("step %d: greedy token %d but Logits argmax at position %d is %d", s, tok, pos, a)
				}
			}
		})
	}
}

// TestGreedyArgmaxExact: the greedy path (bf16 screening + exact rescoring) picks exactly the
// argmax of the full fp32 logits, for many contexts decoded 8 at a time.
func TestGreedyArgmaxExact(t *testing.T) {
	for _, name := range []string{fixtures.Qwen3Tiny, fixtures.GPT2Tiny, fixtures.Qwen3Odd} {
		t.Run(name, func(t *testing.T) {
			e := openEngine(t, name, Params{MaxBatch: 8})
			V := e.Info().VocabSize
			rng := uint64(12345)
			next := func() int32 {
				rng = rng*6364136223846793005 + 1442695040888963407
				return int32((rng >> 33) % 50000)
			}
			for round := 0; round < 8; round++ {
				prompts := map[SeqID][]int32{}
				for i := 0; i < 8; i++ {
					p := make([]int32, 1+int(next()%20))
					for j := range p {
						p[j] = next()
					}
					id, err := e.Add(p, Sampling{MaxNewTokens: 1})
					if err != nil {
						t.Fatal(err)
					}
					prompts[id] = p
				}
				for id, r := range runAll(t, e) {
					p := prompts[id]
					lg, err := e.Logits(p)
					if err != nil {
						t.Fatal(err)
					}
					if want := argmax(lg[(len(p)-1)*V:]); r.tokens[0] != want {
						t.Fatalf("prompt %v: greedy token %d, fp32 logits argmax %d", p, r.tokens[0], want)
					}
				}
			}
		})
	}
}

// TestBatchedEqualsUnbatched: sequences decoded together, and joining mid-flight, produce the
// tokens they produce alone.
func TestBatchedEqualsUnbatched(t *testing.T) {
	for _, name := range []string{fixtures.Qwen3Tiny, fixtures.GPT2Tiny, fixtures.Qwen3Odd} {
		t.Run(name, func(t *testing.T) {
			e := openEngine(t, name, Params{MaxBatch: 8})
			s := Sampling{MaxNewTokens: 16, IgnoreEOS: true}
			alone := make([][]int32, len(testPrompts))
			for i, p := range testPrompts {
				alone[i] = generate(t, e, p, s).tokens
			}
			// All at once.
			ids := make([]SeqID, len(testPrompts))
			for i, p := range testPrompts {
				var err error
				if ids[i], err = e.Add(p, s); err != nil {
					t.Fatal(err)
				}
			}
			res := runAll(t, e)
			for i := range testPrompts {
				if got := res[ids[i]].tokens; !equalIDs(got, alone[i]) {
					t.Fatalf("prompt %d batched: %v\nalone: %v", i, got, alone[i])
				}
			}
			// Staggered: one new sequence joins every 3 steps, so prefill and decode share steps.
			res = map[SeqID]*result{}
			next := 0
			for step := 0; next < len(testPrompts) || e.Active() > 0; step++ {
				if step%3 == 0 && next < len(testPrompts) {
					id, err := e.Add(testPrompts[next], s)
					if err != nil {
						t.Fatal(err)
					}
					ids[next] = id
					next++
				}
				if _, err := e.Step(func(ev Event) { collect(res, ev) }); err != nil {
					t.Fatal(err)
				}
			}
			for i := range testPrompts {
				if got := res[ids[i]].tokens; !equalIDs(got, alone[i]) {
					t.Fatalf("prompt %d staggered: %v\nalone: %v", i, got, alone[i])
				}
			}
		})
	}
}

func equalIDs(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// devices are the engine devices a test runs on: the CPU, and CUDA where libmodelqual_cuda.so
// loads (`make cuda` on a GPU runner); elsewhere the CUDA run skips with the load error.
var devices = []string{"cpu", "cuda"}

// openOn opens bundle name on device, skipping the test when the CUDA library is not built.
func openOn(t testing.TB, name, device string, p Params) *Engine {
	t.Helper()
	p.Device = device
	e, err := Open(testBundle(t, name), p)
	if err != nil && device == "cuda" && strings.Contains(err.Error(), "cannot load") {
		t.Skipf("no CUDA backend here: %v", err)
	}
	if err != nil {
		t.Fatalf("Open %s on %s: %v", name, device, err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// TestSeededSampling: the same seed reproduces sampled tokens, alone or batched with others;
// different seeds give different tokens; sampling differs from greedy. The batch-mates
// include a top-k request: on CUDA plain temperature is drawn on the device and top-k on the
// host, and that choice must be made per sequence (an engine that moved the whole step to the
// host sampler gave the seeded request other tokens).
func TestSeededSampling(t *testing.T) {
	for _, dev := range devices {
		t.Run(dev, func(t *testing.T) { testSeededSampling(t, dev) })
	}
}

func testSeededSampling(t *testing.T, dev string) {
	e := openOn(t, fixtures.Qwen3Tiny, dev, Params{})
	prompt := testPrompts[0]
	for _, s := range []Sampling{
		{MaxNewTokens: 16, Temperature: 1, Seed: 42, IgnoreEOS: true},
		{MaxNewTokens: 16, Temperature: 0.8, TopK: 50, Seed: 42, IgnoreEOS: true},
		{MaxNewTokens: 16, Temperature: 1.2, TopP: 0.9, Seed: 42, IgnoreEOS: true},
		{MaxNewTokens: 16, Temperature: 1, TopK: 200, TopP: 0.5, Seed: 42, IgnoreEOS: true},
	} {
		a := generate(t, e, prompt, s).tokens
		// Same seed, batched beside a greedy and a differently seeded sequence.
		id, _ := e.Add(prompt, s)
		other := s
		other.Seed = 43
		idOther, _ := e.Add(prompt, other)
		if _, err := e.Add(testPrompts[1], Sampling{MaxNewTokens: 5}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Add(testPrompts[2], Sampling{MaxNewTokens: 20, Temperature: 1, TopK: 5, Seed: 7}); err != nil {
			t.Fatal(err)
		}
		res := runAll(t, e)
		if !equalIDs(a, res[id].tokens) {
			t.Fatalf("%+v: same seed gave %v then %v", s, a, res[id].tokens)
		}
		if equalIDs(a, res[idOther].tokens) {
			t.Fatalf("%+v: seeds 42 and 43 gave the same 16 tokens %v", s, a)
		}
		greedy := generate(t, e, prompt, Sampling{MaxNewTokens: 16, IgnoreEOS: true}).tokens
		if equalIDs(a, greedy) {
			t.Fatalf("%+v: sampled tokens equal greedy tokens %v", s, a)
		}
		if s.TopK > 0 {
			// Every sampled token must be among the top-k of its step's distribution.
			all := append(append([]int32{}, prompt...), a...)
			lg, err := e.Logits(all[:len(all)-1])
			if err != nil {
				t.Fatal(err)
			}
			V := e.Info().VocabSize
			for i, tok := range a {
				rowv := lg[(len(prompt)-1+i)*V : (len(prompt)+i)*V]
				higher := 0
				for _, v := range rowv {
					if v > rowv[tok] {
						higher++
					}
				}
				if higher >= s.TopK {
					t.Fatalf("step %d: token %d has %d higher logits, outside top_k %d", i, tok, higher, s.TopK)
				}
			}
		}
	}
}

// eosPrompt returns a prompt whose greedy next token is an end-of-sequence id, and that id:
// a prompt of the fixture's EOS golden (fixtures/golden/<fixture>-eos.json, found by
// search_eos_prompts.py and decoded by transformers) extended by the greedy tokens transformers
// chose before it reached the id. The fixtures' random weights reach EOS only from such
// searched prompts.
func eosPrompt(t *testing.T, e *Engine, fixture string) ([]int32, int32) {
	t.Helper()
	g, err := fixtures.LoadGolden(filepath.Join("..", "fixtures", "golden", fixture+"-eos.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range g.Prompts {
		for k, tok := range p.GreedyIDs {
			if slices.Contains(e.Info().EOSIDs, tok) {
				return append(append([]int32{}, p.PromptIDs...), p.GreedyIDs[:k]...), tok
			}
		}
	}
	t.Fatalf("no prompt of the %s EOS golden reaches an end-of-sequence id %v; rerun fixtures/golden/search_eos_prompts.py", fixture, e.Info().EOSIDs)
	return nil, 0
}

func TestEOSStopAndIgnore(t *testing.T) {
	for _, name := range []string{fixtures.Qwen3Tiny, fixtures.GPT2Tiny} {
		t.Run(name, func(t *testing.T) {
			e := openEngine(t, name, Params{})
			p, eos := eosPrompt(t, e, name)
			r := generate(t, e, p, Sampling{MaxNewTokens: 8})
			if r.reason != FinishStop || len(r.tokens) != 1 || r.tokens[0] != eos || r.timing.OutputTokens != 1 {
				t.Fatalf("stop on EOS: got tokens %v reason %q output %d; want [%d] stop 1", r.tokens, r.reason, r.timing.OutputTokens, eos)
			}
			r = generate(t, e, p, Sampling{MaxNewTokens: 8, IgnoreEOS: true})
			if r.reason != FinishLength || len(r.tokens) != 8 || r.tokens[0] != eos {
				t.Fatalf("ignore_eos: got tokens %v reason %q; want 8 tokens starting with %d, length", r.tokens, r.reason, eos)
			}
		})
	}
}

func TestCancelFreesSlot(t *testing.T) {
	e := openEngine(t, fixtures.GPT2Tiny, Params{MaxBatch: 2})
	s := Sampling{MaxNewTokens: 100, IgnoreEOS: true}
	a, err := e.Add(testPrompts[0], s)
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.Add(testPrompts[1], s)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Add(testPrompts[2], s); !errors.Is(err, ErrBatchFull) {
		t.Fatalf("third Add with MaxBatch 2: err %v, want ErrBatchFull", err)
	}
	res := map[SeqID]*result{}
	for i := 0; i < 3; i++ {
		if _, err := e.Step(func(ev Event) { collect(res, ev) }); err != nil {
			t.Fatal(err)
		}
	}
	// Cancel from another goroutine, as a server's request handler would.
	done := make(chan struct{})
	go func() { e.Cancel(a); close(done) }()
	<-done
	var evA, evB []Event
	active, err := e.Step(func(ev Event) {
		switch ev.Seq {
		case a:
			evA = append(evA, ev)
		case b:
			evB = append(evB, ev)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(evA) != 1 || !evA[0].Done || evA[0].Reason != FinishCancelled || evA[0].Token != -1 {
		t.Fatalf("cancelled sequence events %+v; want one Done event, reason cancelled, token -1", evA)
	}
	if evA[0].Timing.OutputTokens != 3 || evA[0].Timing.PromptTokens != len(testPrompts[0]) {
		t.Fatalf("cancelled timing %+v; want 3 output tokens, %d prompt tokens", evA[0].Timing, len(testPrompts[0]))
	}
	if len(evB) != 1 || evB[0].Done || evB[0].Token < 0 {
		t.Fatalf("other sequence events %+v; want one token, not done", evB)
	}
	if active != 1 || e.Active() != 1 {
		t.Fatalf("active after cancel = %d (Active() %d), want 1", active, e.Active())
	}
	if _, err := e.Add(testPrompts[2], s); err != nil {
		t.Fatalf("Add after cancel freed a slot: %v", err)
	}
	e.Cancel(b)
	e.Cancel(12345) // unknown ids are ignored
	if _, err := e.Step(nil); err != nil {
		t.Fatal(err)
	}
	if e.Active() != 1 {
		t.Fatalf("Active() = %d after cancelling b, want 1", e.Active())
	}
}

func TestAddErrorsNameTheField(t *testing.T) {
	e := openEngine(t, fixtures.GPT2Tiny, Params{MaxContext: 64})
	V := int32(e.Info().VocabSize)
	for _, c := range []struct {
		prompt []int32
		s      Sampling
		want   string
	}{
		{nil, Sampling{MaxNewTokens: 4}, "prompt is empty"},
		{[]int32{1, V}, Sampling{MaxNewTokens: 4}, "prompt[1]"},
		{[]int32{1, -3}, Sampling{MaxNewTokens: 4}, "prompt[1] = -3"},
		{make([]int32, 60), Sampling{MaxNewTokens: 5}, "max_context 64"},
		{[]int32{1}, Sampling{MaxNewTokens: 0}, "max_new_tokens"},
		{[]int32{1}, Sampling{MaxNewTokens: 1, Temperature: -1}, "temperature"},
		{[]int32{1}, Sampling{MaxNewTokens: 1, TopK: -1}, "top_k"},
	} {
		_, err := e.Add(c.prompt, c.s)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Add(%d ids, %+v): err %v; want it to mention %q", len(c.prompt), c.s, err, c.want)
		}
	}
	if e.Active() != 0 {
		t.Fatalf("failed Adds left %d live sequences", e.Active())
	}
	if _, err := e.Add(make([]int32, 60), Sampling{MaxNewTokens: 4}); err != nil {
		t.Fatalf("prompt + max_new_tokens == max_context must be accepted: %v", err)
	}
	r := runAll(t, e)
	for _, v := range r {
		if len(v.tokens) != 4 {
			t.Fatalf("got %d tokens at the context limit, want 4", len(v.tokens))
		}
	}
	if _, err := e.Logits([]int32{1, V}); err == nil || !strings.Contains(err.Error(), "ids[1]") {
		t.Fatalf("Logits with an out-of-vocabulary id: err %v, want it to name ids[1]", err)
	}
}

func TestTimingAndCounts(t *testing.T) {
	e := openEngine(t, fixtures.Qwen3Tiny, Params{})
	r := generate(t, e, testPrompts[1], Sampling{MaxNewTokens: 5, IgnoreEOS: true})
	tm := r.timing
	if !r.done || tm.PromptTokens != len(testPrompts[1]) || tm.OutputTokens != 5 {
		t.Fatalf("timing %+v: want prompt %d, output 5", tm, len(testPrompts[1]))
	}
	if !(tm.AddedNs > 0 && tm.AddedNs <= tm.FirstTokenNs && tm.FirstTokenNs <= tm.DoneNs) {
		t.Fatalf("timing %+v: want 0 < added <= first token <= done", tm)
	}
}

// TestMockCadence: the mock emits its documented token cycle, one token per step, and a step
// never takes less than the configured delay.
func TestMockCadence(t *testing.T) {
	const delay = 2 * time.Millisecond
	e := openEngine(t, "mock:2ms", Params{})
	if info := e.Info(); info.StepDelay != delay || info.Family != "mock" {
		t.Fatalf("mock info %+v; want step delay %v", info, delay)
	}
	prompt := []int32{1, 2, 3}
	a, _ := e.Add(prompt, Sampling{MaxNewTokens: 10})
	b, _ := e.Add(prompt, Sampling{MaxNewTokens: 10, Temperature: 1, Seed: 9})
	start := time.Now()
	steps := 0
	res := map[SeqID]*result{}
	for e.Active() > 0 {
		perStep := 0
		if _, err := e.Step(func(ev Event) { collect(res, ev); perStep++ }); err != nil {
			t.Fatal(err)
		}
		if perStep != 2 {
			t.Fatalf("step %d produced %d events, want one per sequence (2)", steps, perStep)
		}
		steps++
	}
	if el := time.Since(start); el < 10*delay {
		t.Fatalf("10 mock steps took %v, less than 10 x %v", el, delay)
	}
	for _, id := range []SeqID{a, b} {
		r := res[id]
		if len(r.tokens) != 10 || r.reason != FinishLength {
			t.Fatalf("mock sequence: %d tokens, reason %q; want 10, length", len(r.tokens), r.reason)
		}
		for i, tok := range r.tokens {
			if want := int32(64 + (len(prompt)+i)%26); tok != want {
				t.Fatalf("mock token %d = %d, want %d (the a..z cycle)", i, tok, want)
			}
		}
	}
	lg, err := e.Logits(prompt)
	if err != nil {
		t.Fatal(err)
	}
	if got := argmax(lg[2*e.Info().VocabSize:]); got != res[a].tokens[0] {
		t.Fatalf("mock Logits argmax %d, want the token it generates (%d)", got, res[a].tokens[0])
	}
}

func TestOpenErrors(t *testing.T) {
	b := testBundle(t, fixtures.GPT2Tiny)
	if _, err := Open(b, Params{Device: "tpu"}); err == nil || !strings.Contains(err.Error(), "Device") {
		t.Fatalf("Open with device tpu: err %v, want one naming Device", err)
	}
	if _, err := Open(b, Params{MaxContext: 1 << 20}); err == nil || !strings.Contains(err.Error(), "MaxContext") {
		t.Fatalf("Open with MaxContext past n_positions: err %v, want one naming MaxContext", err)
	}
	t.Setenv("MODELQUAL_CUDA_LIB", "/nonexistent/libmodelqual_cuda.so")
	_, err := Open(b, Params{Device: "cuda"})
	if err == nil || !strings.Contains(err.Error(), "cannot load libmodelqual_cuda.so") || !strings.Contains(err.Error(), "make cuda") {
		t.Fatalf("Open with device cuda and no library: err %v, want a load error saying to run make cuda", err)
	}
}

// TestSamplingDistribution: the engine's draws follow softmax(logits / T) restricted by top-k
// and top-p as transformers defines them (top-k keeps the k largest logits, top-p the smallest
// set of most likely tokens whose mass reaches p), computed here in float64 from the engine's
// own logits for one context. 1,600 single-token requests per case; a chi-square test whose
// 99.9th-percentile bound the counts must stay under, and that the same counts must exceed
// against the distribution at 1.5 T (the planted defect: a wrong temperature). On CUDA plain
// temperature is drawn on the device (Gumbel-max) and top-k/top-p on the host.
func TestSamplingDistribution(t *testing.T) {
	for _, dev := range devices {
		t.Run(dev, func(t *testing.T) { testSamplingDistribution(t, dev) })
	}
}

func testSamplingDistribution(t *testing.T, dev string) {
	e := openOn(t, fixtures.Qwen3Tiny, dev, Params{MaxBatch: 32})
	prompt := testPrompts[0]
	lg, err := e.Logits(prompt)
	if err != nil {
		t.Fatal(err)
	}
	V := e.Info().VocabSize
	row := lg[(len(prompt)-1)*V : len(prompt)*V]
	order := byLogit(row)
	// T0: the temperature at which the most likely token has probability 0.5 (bisection), so
	// that a few dozen tokens carry the mass and the counts have power.
	lo, hi := 1e-4, 10.0
	for i := 0; i < 60; i++ {
		mid := math.Sqrt(lo * hi)
		if maxProb(wantDist(row, order, mid, 0, 0)) > 0.5 {
			lo = mid
		} else {
			hi = mid
		}
	}
	T0 := math.Sqrt(lo * hi)
	const draws = 1600
	for i, c := range []struct {
		temp float64
		k    int
		p    float64
	}{{T0, 0, 0}, {T0, 4, 0}, {T0, 0, 0.95}, {2 * T0, 12, 0.7}} {
		counts := make([]int, V)
		s := Sampling{MaxNewTokens: 1, Temperature: float32(c.temp), TopK: c.k, TopP: float32(c.p), IgnoreEOS: true}
		for n := 0; n < draws; {
			for ; n < draws; n++ {
				s.Seed = uint64(1000*i + n)
				if _, err := e.Add(prompt, s); errors.Is(err, ErrBatchFull) {
					break
				} else if err != nil {
					t.Fatal(err)
				}
			}
			for _, r := range runAll(t, e) {
				counts[r.tokens[0]]++
			}
		}
		want := wantDist(row, order, float64(float32(c.temp)), c.k, c.p)
		for id, n := range counts {
			if n > 0 && want[id] == 0 {
				t.Fatalf("case %+v: token %d drawn %d times, outside the top-k/top-p set", c, id, n)
			}
		}
		stat, dof := chi2(counts, want, draws)
		bound := float64(dof) + 3.1*math.Sqrt(2*float64(dof)) + 10
		bad, badDof := chi2(counts, wantDist(row, order, 1.5*float64(float32(c.temp)), c.k, c.p), draws)
		badBound := float64(badDof) + 3.1*math.Sqrt(2*float64(badDof)) + 10
		t.Logf("case %+v: chi2 %.1f (dof %d, bound %.1f); against 1.5 T: %.1f (dof %d)", c, stat, dof, bound, bad, badDof)
		if stat >= bound {
			t.Errorf("case %+v: draws do not follow the distribution: chi2 %.1f >= %.1f (dof %d)", c, stat, bound, dof)
		}
		if bad < badBound {
			t.Errorf("case %+v: the test cannot tell T from 1.5 T: chi2 %.1f < %.1f", c, bad, badBound)
		}
	}
}

// byLogit is row's token ids from the largest logit down; ties keep the lower id first.
func byLogit(row []float32) []int {
	ids := make([]int, len(row))
	for i := range ids {
		ids[i] = i
	}
	sort.SliceStable(ids, func(a, b int) bool { return row[ids[a]] > row[ids[b]] })
	return ids
}

// wantDist is transformers' sampling distribution over row (ids in byLogit order) at
// temperature T with top-k and top-p (0 = off), in float64; ties at a cut keep the lower id.
func wantDist(row []float32, ids []int, T float64, k int, p float64) []float64 {
	V := len(row)
	n := V
	if k > 0 && k < V {
		n = k
	}
	mx := float64(row[ids[0]]) / T
	w := make([]float64, V)
	sum := 0.0
	for _, id := range ids[:n] {
		w[id] = math.Exp(float64(row[id])/T - mx)
		sum += w[id]
	}
	if p > 0 && p < 1 {
		cum := 0.0
		keep := 0
		for keep < n {
			cum += w[ids[keep]]
			keep++
			if cum >= p*sum {
				break
			}
		}
		for _, id := range ids[keep:n] {
			w[id] = 0
		}
		sum = cum
	}
	for i := range w {
		w[i] /= sum
	}
	return w
}

func maxProb(w []float64) float64 {
	m := 0.0
	for _, v := range w {
		m = math.Max(m, v)
	}
	return m
}

// chi2 is Pearson's statistic of counts against probabilities want over n draws, with the
// tokens expected fewer than 5 times pooled into one bin.
func chi2(counts []int, want []float64, n int) (stat float64, dof int) {
	var poolObs, poolExp float64
	bins := 0
	for id, p := range want {
		e := p * float64(n)
		if e >= 5 {
			d := float64(counts[id]) - e
			stat += d * d / e
			bins++
		} else {
			poolObs += float64(counts[id])
			poolExp += e
		}
	}
	if poolExp > 0 {
		d := poolObs - poolExp
		stat += d * d / poolExp
		bins++
	} else if poolObs > 0 {
		stat = math.Inf(1) // draws where none were expected
	}
	return stat, bins - 1
}
