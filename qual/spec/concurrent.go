package spec

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/onsi/ginkgo/v2"

	"github.com/modelqual/modelqual/server/tokenizer"
)

// ConcurrentInput is the input of ConcurrentContent and CheckConcurrent.
type ConcurrentInput struct {
	// API reaches the served model.
	API *API
	// Tokenizer turns corpus prompts into ids.
	Tokenizer *tokenizer.Tokenizer
	// Corpus supplies prompts of mixed lengths (raw prompts and rendered conversations).
	Corpus []Prompt
	// Requests is how many requests are in flight together (8 to 32; 16 when 0).
	Requests int
	// MaxTokens is the longest answer; requests cycle through a quarter, half, three
	// quarters and all of it, so they finish at different steps (32 when 0).
	MaxTokens int
	// TieMargin > 0 (a reduced-precision GPU run, thresholds greedy_tie_margin): batched and
	// single decode steps round differently, so an answer may leave its single-request twin
	// at a near-tie: accepted where the single answer's logprobs put the concurrent token
	// within TieMargin of its own choice (the texts must agree up to that token).
	TieMargin float64
}

// CheckConcurrent is ConcurrentContent's core: each request's greedy answer is first taken
// alone, then all requests are sent at once (so the server batches their decode steps,
// joining and leaving the batch at different steps), and each concurrent answer must equal
// its own single-request answer, text and token count. A defect only in the batched path
// (attention over another sequence's cache, a scale applied per batch) changes some answers.
func CheckConcurrent(ctx context.Context, in ConcurrentInput) error {
	const fn = "spec.CheckConcurrent"
	n, maxTokens := in.Requests, in.MaxTokens
	if n == 0 {
		n = 16
	}
	if maxTokens == 0 {
		maxTokens = 32
	}
	switch {
	case in.API == nil:
		return fmt.Errorf("%s: ConcurrentInput.API is nil", fn)
	case in.Tokenizer == nil:
		return fmt.Errorf("%s: ConcurrentInput.Tokenizer is nil", fn)
	case len(in.Corpus) == 0:
		return fmt.Errorf("%s: ConcurrentInput.Corpus is empty", fn)
	case n < 8 || n > 32:
		return fmt.Errorf("%s: ConcurrentInput.Requests %d: use 8 to 32", fn, n)
	case maxTokens < 4:
		return fmt.Errorf("%s: ConcurrentInput.MaxTokens %d: use at least 4", fn, maxTokens)
	}
	type req struct {
		name string
		body map[string]any
		want *Answer
	}
	reqs := make([]req, n)
	for i := range reqs {
		p := in.Corpus[i%len(in.Corpus)]
		ids, err := PromptIDs(in.Tokenizer, p)
		if err != nil {
			return fmt.Errorf("%s: %w", fn, err)
		}
		steps := maxTokens * (1 + i%4) / 4
		reqs[i] = req{name: fmt.Sprintf("#%d %q (%d prompt tokens, %d steps)", i, p.Name, len(ids), steps),
			body: map[string]any{"prompt": ids, "max_tokens": steps, "temperature": 0, "ignore_eos": true}}
		if in.TieMargin > 0 {
			reqs[i].body["logprobs"] = 5
		}
	}
	for i := range reqs {
		ans, err := in.API.Complete(ctx, "/v1/completions", reqs[i].body)
		if err != nil {
			return fmt.Errorf("%s: single request %s: %w", fn, reqs[i].name, err)
		}
		reqs[i].want = ans
	}
	got := make([]*Answer, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			got[i], errs[i] = in.API.Complete(ctx, "/v1/completions", reqs[i].body)
		}()
	}
	close(start)
	wg.Wait()
	var problems []string
	for i, r := range reqs {
		switch {
		case errs[i] != nil:
			problems = append(problems, fmt.Sprintf("%s: concurrent request failed: %v", r.name, errs[i]))
		case got[i].Text != r.want.Text && !tieSplit(r.want, got[i], in.TieMargin):
			problems = append(problems, fmt.Sprintf("%s: concurrent answer %q differs from the single-request answer %q from byte %d",
				r.name, clip(got[i].Text, 60), clip(r.want.Text, 60), commonPrefix(got[i].Text, r.want.Text)))
		case got[i].CompletionTokens != r.want.CompletionTokens:
			problems = append(problems, fmt.Sprintf("%s: concurrent usage.completion_tokens %d, single %d", r.name, got[i].CompletionTokens, r.want.CompletionTokens))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("concurrency gate: %d of %d requests in flight together answered differently from the same request alone:\n  %s",
			len(problems), n, strings.Join(problems, "\n  "))
	}
	return nil
}

// tieSplit reports whether b leaves a at a near-tie: the first token where they differ, after
// an identical prefix, is one a's logprobs rank within margin of a's own choice.
func tieSplit(a, b *Answer, margin float64) bool {
	if margin <= 0 || len(a.Logprobs) == 0 || len(b.Logprobs) == 0 {
		return false
	}
	for i := range min(len(a.Logprobs), len(b.Logprobs)) {
		x, y := a.Logprobs[i], b.Logprobs[i]
		if x.Token == y.Token {
			continue
		}
		for _, c := range x.Top {
			if c.Token == y.Token {
				return x.Logprob-c.Logprob <= margin
			}
		}
		return false
	}
	return false
}

func commonPrefix(a, b string) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i
}

// ConcurrentContent asserts that requests in flight together answer as they do alone
// (CheckConcurrent).
func ConcurrentContent(ctx context.Context, input func() ConcurrentInput) {
	ginkgo.It("answers each of 16 concurrent mixed-length requests exactly as it answers that request alone", Gate(GateParity), Task(TaskText), func(sctx ginkgo.SpecContext) {
		c, cancel := specContext(ctx, sctx)
		defer cancel()
		passGate(CheckConcurrent(c, input()))
	})
}
