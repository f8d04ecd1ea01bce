package spec

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/modelqual/modelqual/fixtures"
	"github.com/modelqual/modelqual/server/tokenizer"
)

// The transformers golden format lives in package fixtures, next to the script that writes
// it; these names keep the spec API that family suites use.
type (
	Golden       = fixtures.Golden
	GoldenPrompt = fixtures.GoldenPrompt
	GoldenStep   = fixtures.GoldenStep
)

var (
	ErrGoldenMissing = fixtures.ErrGoldenMissing
	GoldenPath       = fixtures.GoldenPath
	LoadGolden       = fixtures.LoadGolden
)

// GoldenInput is the input of GoldenParity and CheckGolden.
type GoldenInput struct {
	// API reaches the served model.
	API *API
	// Golden is the fixture's transformers golden; Path is used when Golden is nil.
	Golden *Golden
	Path   string
	// Revision, when set, must equal the golden's fixture revision (the manifest's pin).
	Revision string
	// Tokenizer decodes golden tokens into the text the server must return, and encodes
	// Corpus prompts to check that the client tokenizer reproduces the golden prompt ids.
	Tokenizer *tokenizer.Tokenizer
	Corpus    []Prompt
	// Tolerance bounds |served − transformers| on the golden top-5 logits (1e-3 when 0:
	// float32 on two different kernels).
	Tolerance float64
	// MaxSteps, when > 0, checks only the first MaxSteps greedy steps of each golden prompt:
	// a reduced-precision (bf16) engine agrees with a float32 golden within Tolerance but
	// may take another greedy path later.
	MaxSteps int
	// TieMargin, when > 0, accepts a greedy divergence at a step whose golden top-two logits
	// are within it (thresholds greedy_tie_margin); the prompt's greedy comparison ends there.
	TieMargin float64
}

// nearTie reports whether step st of a golden is a near-tie within margin: the chosen token's
// logit is within margin of the best other top-5 logit.
func nearTie(st GoldenStep, chosen int32, margin float64) bool {
	if margin <= 0 {
		return false
	}
	k := slices.Index(st.Top5IDs, chosen)
	if k < 0 {
		return false
	}
	for j, l := range st.Top5Logits {
		if j != k && st.Top5Logits[k]-l <= margin {
			return true
		}
	}
	return false
}

// divergenceStep is the reference token index at which served text leaves the reference
// tokens' text after prompt (len(refIDs) when it only runs longer), -1 when they are equal.
func divergenceStep(tok *tokenizer.Tokenizer, prompt, refIDs []int32, served string) int {
	if continuation(tok, prompt, refIDs) == served {
		return -1
	}
	for k := 1; k <= len(refIDs); k++ {
		if !strings.HasPrefix(served, continuation(tok, prompt, refIDs[:k])) {
			return k - 1
		}
	}
	return len(refIDs)
}

// CheckGolden compares the served model with the upstream implementation's golden outputs:
// for every golden prompt the served greedy generation returns the golden tokens' text, and
// the engine's logits, teacher-forced on the golden tokens, pick each golden token and agree
// on the golden top-5 logits within the tolerance.
func CheckGolden(ctx context.Context, in GoldenInput) error {
	const fn = "spec.CheckGolden"
	switch {
	case in.API == nil:
		return fmt.Errorf("%s: GoldenInput.API is nil", fn)
	case in.Tokenizer == nil:
		return fmt.Errorf("%s: GoldenInput.Tokenizer is nil", fn)
	case in.Golden == nil && in.Path == "":
		return fmt.Errorf("%s: GoldenInput.Golden and GoldenInput.Path are both empty", fn)
	}
	g := in.Golden
	if g == nil {
		var err error
		if g, err = LoadGolden(in.Path); err != nil {
			return err
		}
	}
	if in.Revision != "" && g.Revision != in.Revision {
		return fmt.Errorf("%s: golden %s was made from fixture revision %s, the manifest pins %s; rerun fixtures/golden/make_golden.py", fn, g.Fixture, g.Revision, in.Revision)
	}
	tol := in.Tolerance
	if tol == 0 {
		tol = 1e-3
	}
	byName := map[string]Prompt{}
	for _, p := range in.Corpus {
		byName[p.Name] = p
	}
	var problems []string
	for _, gp := range g.Prompts {
		if p, ok := byName[gp.Name]; ok {
			ids, err := PromptIDs(in.Tokenizer, p)
			if err != nil {
				return err
			}
			if !equalIDs(ids, gp.PromptIDs) {
				problems = append(problems, fmt.Sprintf("prompt %q: client tokenizer gives %d ids, transformers %d (first difference at %d)",
					gp.Name, len(ids), len(gp.PromptIDs), firstDiff(ids, gp.PromptIDs)))
			}
		}
		steps := len(gp.GreedyIDs)
		if in.MaxSteps > 0 && in.MaxSteps < steps {
			steps = in.MaxSteps
		}
		ans, err := in.API.Complete(ctx, "/v1/completions", map[string]any{
			"prompt": gp.PromptIDs, "max_tokens": steps, "temperature": 0, "ignore_eos": true,
		})
		if err != nil {
			problems = append(problems, fmt.Sprintf("prompt %q: generation failed: %v", gp.Name, err))
		} else if want := continuation(in.Tokenizer, gp.PromptIDs, gp.GreedyIDs[:steps]); ans.Text != want {
			if k := divergenceStep(in.Tokenizer, gp.PromptIDs, gp.GreedyIDs[:steps], ans.Text); k >= steps || !nearTie(gp.Steps[k], gp.GreedyIDs[k], in.TieMargin) {
				problems = append(problems, fmt.Sprintf("prompt %q: %s", gp.Name, textDivergence(in.Tokenizer, gp.PromptIDs, gp.GreedyIDs[:steps], ans.Text)))
			}
		}
		seq := append(append([]int32(nil), gp.PromptIDs...), gp.GreedyIDs[:steps-1]...)
		served, vocab, err := in.API.Logits(ctx, seq)
		if err != nil {
			problems = append(problems, fmt.Sprintf("prompt %q: logits failed: %v", gp.Name, err))
			continue
		}
		worst, worstStep := 0.0, -1
		for s := 0; s < steps; s++ {
			row := served[(len(gp.PromptIDs)-1+s)*vocab:][:vocab]
			best := 0
			for j := range row {
				if row[j] > row[best] {
					best = j
				}
			}
			for k, id := range gp.Steps[s].Top5IDs {
				if d := math.Abs(float64(row[id]) - gp.Steps[s].Top5Logits[k]); d > worst || math.IsNaN(d) {
					worst, worstStep = d, s
				}
			}
			if int32(best) != gp.GreedyIDs[s] {
				if nearTie(gp.Steps[s], gp.GreedyIDs[s], in.TieMargin) {
					continue // a near-tie broken the other way; the teacher-forced logits still count
				}
				problems = append(problems, fmt.Sprintf("prompt %q: greedy step %d: engine argmax %d, transformers chose %d", gp.Name, s, best, gp.GreedyIDs[s]))
				break
			}
		}
		if worst > tol || math.IsNaN(worst) {
			problems = append(problems, fmt.Sprintf("prompt %q: top-5 logit at step %d differs from transformers by %.3g > %.3g", gp.Name, worstStep, worst, tol))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("served model disagrees with transformers %s golden %s on %d checks:\n  %s",
			g.TransformersVersion, g.Fixture, len(problems), strings.Join(problems, "\n  "))
	}
	return nil
}

func equalIDs(a, b []int32) bool { return firstDiff(a, b) < 0 }

// firstDiff is the first index where a and b differ (or the shorter length), -1 if equal.
func firstDiff(a, b []int32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}
