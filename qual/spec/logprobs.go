package spec

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/onsi/ginkgo/v2"

	"github.com/modelqual/modelqual/server/tokenizer"
)

// LogprobsInput is the input of LogprobsParity and CheckLogprobs.
type LogprobsInput struct {
	// API reaches the served model.
	API *API
	// Golden is the fixture's transformers golden; Path is read when Golden is nil. Its steps
	// must carry top5_logprobs (log_softmax of the float32 logits at top5_ids) unless
	// TokensOnly.
	Golden *Golden
	Path   string
	// Tokenizer turns golden ids into the token strings an OpenAI answer carries.
	Tokenizer *tokenizer.Tokenizer
	// Tolerance bounds |served − transformers| on a logprob (1e-3 when 0, as the logits gate).
	Tolerance float64
	// MaxSteps, when > 0, checks only the first MaxSteps greedy steps of each prompt.
	MaxSteps int
	// TieMargin: as GoldenInput's (a greedy divergence at a golden near-tie ends the prompt).
	TieMargin float64
	// TopN is the number of alternatives asked per token (10 when 0: more than the golden's 5,
	// so a near tie at the fifth place cannot push a golden candidate out of the answer).
	TopN int
	// TokensOnly compares the served tokens (read from the logprobs) with the golden's greedy
	// tokens and skips the absolute values: token-level parity for a golden without
	// top5_logprobs. The checks that need no top5_logprobs still run: differences between
	// logprobs equal transformers' differences between logits (top5_logits), and the served
	// alternatives' probabilities add up to at most 1.
	TokensOnly bool
	// Optional: a server that refuses logprobs (4xx) or answers without them is "not
	// applicable" (ErrNoLogprobs) rather than failed; for servers the harness did not build.
	Optional bool
}

// ErrNoLogprobs is returned by CheckLogprobs, with Optional, when the server offers no logprobs.
var ErrNoLogprobs = errors.New("the server offers no logprobs on /v1/completions")

// tokenText is the string an OpenAI answer gives token id (its bytes; an incomplete UTF-8
// character as U+FFFD), and whether it is exact (no replacement character).
func tokenText(tok *tokenizer.Tokenizer, id int32) (string, bool) {
	b := tok.TokenBytes(nil, id)
	if utf8.Valid(b) {
		return string(b), true
	}
	return strings.ToValidUTF8(string(b), "\uFFFD"), false
}

// GoldenHasLogprobs reports whether every step of g carries top5_logprobs aligned with
// top5_ids, naming the first step that does not.
func GoldenHasLogprobs(g *Golden) (bool, string) {
	for _, gp := range g.Prompts {
		for s, st := range gp.Steps {
			if len(st.Top5Logprobs) != len(st.Top5IDs) {
				return false, fmt.Sprintf("prompt %q step %d has %d top5_logprobs for %d top5_ids", gp.Name, s, len(st.Top5Logprobs), len(st.Top5IDs))
			}
		}
	}
	return true, ""
}

// CheckLogprobs compares the served logprobs with transformers': for every golden prompt, a
// greedy /v1/completions answer with `logprobs` carries one entry per golden step, whose token
// is the golden's greedy token, whose logprob is the golden's log_softmax at that token, and
// whose alternatives hold each golden top-5 token with its golden logprob, all within the
// tolerance. The reference is the golden (transformers, float32), never the server's logits.
func CheckLogprobs(ctx context.Context, in LogprobsInput) error {
	const fn = "spec.CheckLogprobs"
	switch {
	case in.API == nil:
		return fmt.Errorf("%s: LogprobsInput.API is nil", fn)
	case in.Tokenizer == nil:
		return fmt.Errorf("%s: LogprobsInput.Tokenizer is nil", fn)
	case in.Golden == nil && in.Path == "":
		return fmt.Errorf("%s: LogprobsInput.Golden and LogprobsInput.Path are both empty", fn)
	}
	g := in.Golden
	if g == nil {
		var err error
		if g, err = LoadGolden(in.Path); err != nil {
			return err
		}
	}
	if !in.TokensOnly {
		if ok, where := GoldenHasLogprobs(g); !ok {
			return fmt.Errorf("%s: golden %s lacks top5_logprobs (%s); regenerate it with fixtures/golden/make_golden.py, which records log_softmax of the float32 logits at top5_ids", fn, g.Fixture, where)
		}
	}
	tol := in.Tolerance
	if tol == 0 {
		tol = 1e-3
	}
	topN := in.TopN
	if topN == 0 {
		topN = 10
	}
	var problems, differs, reported []string
	worst, worstAt := 0.0, ""
	note := func(d float64, at string) {
		if d > worst || math.IsNaN(d) {
			worst, worstAt = d, at
		}
	}
	for _, gp := range g.Prompts {
		steps := len(gp.GreedyIDs)
		if in.MaxSteps > 0 && in.MaxSteps < steps {
			steps = in.MaxSteps
		}
		ans, err := in.API.Complete(ctx, "/v1/completions", map[string]any{
			"prompt": gp.PromptIDs, "max_tokens": steps, "temperature": 0, "ignore_eos": true, "logprobs": topN,
		})
		if in.Optional && (err != nil && StatusOf(err) >= 400 && StatusOf(err) < 500 || err == nil && ans.Logprobs == nil) {
			return fmt.Errorf("%w (%v)", ErrNoLogprobs, err)
		}
		if err != nil {
			problems = append(problems, fmt.Sprintf("prompt %q: request with logprobs %d failed: %v", gp.Name, topN, err))
			continue
		}
		al := alignTokens(in.Tokenizer, gp.GreedyIDs[:steps], ans.Logprobs)
		for _, r := range al.Reported {
			reported = append(reported, fmt.Sprintf("prompt %q: %s", gp.Name, r))
		}
		if al.Differs != "" && !nearTie(gp.Steps[min(al.At, steps-1)], gp.GreedyIDs[min(al.At, steps-1)], in.TieMargin) {
			// A near-tie broken the other way ends this prompt's comparison; anything else is
			// another generation.
			differs = append(differs, fmt.Sprintf("prompt %q: %s", gp.Name, al.Differs))
		}
		for _, pair := range al.Pairs {
			if pair.Merged() {
				continue // one entry for several reference tokens: its logprob is not one token's
			}
			s, got := pair.Ref, ans.Logprobs[pair.Served]
			st := gp.Steps[s]
			at := func(what string) string { return fmt.Sprintf("prompt %q step %d %s", gp.Name, s, what) }
			// Normalisation: probabilities of distinct tokens add up to at most 1.
			var mass float64
			for _, c := range got.Top {
				mass += math.Exp(c.Logprob)
			}
			if mass > 1+tol || got.Logprob > tol || math.IsNaN(mass) {
				problems = append(problems, fmt.Sprintf("%s: the served alternatives' probabilities sum to %.6g (token logprob %.6g): not a normalised distribution", at(""), mass, got.Logprob))
				break
			}
			texts := map[string]int{}
			for _, id := range st.Top5IDs {
				t, _ := tokenText(in.Tokenizer, id)
				texts[t]++
			}
			// Shift-free: lp(a) - lp(greedy) = logit(a) - logit(greedy), from top5_logits.
			gk := slices.Index(st.Top5IDs, gp.GreedyIDs[s])
			for k, id := range st.Top5IDs {
				t, exact := tokenText(in.Tokenizer, id)
				if gk < 0 || k == gk || !exact || texts[t] > 1 {
					continue
				}
				for _, c := range got.Top {
					if c.Token == t {
						note(math.Abs((c.Logprob-got.Logprob)-(st.Top5Logits[k]-st.Top5Logits[gk])), at(fmt.Sprintf("logprob difference %q - chosen", t)))
					}
				}
			}
			if in.TokensOnly {
				continue
			}
			for k, id := range st.Top5IDs {
				if id == gp.GreedyIDs[s] {
					note(math.Abs(got.Logprob-st.Top5Logprobs[k]), at("chosen token logprob"))
				}
				t, exact := tokenText(in.Tokenizer, id)
				if !exact || texts[t] > 1 {
					continue // two candidates with one text: the answer cannot tell them apart
				}
				found := false
				for _, c := range got.Top {
					if c.Token == t {
						found = true
						note(math.Abs(c.Logprob-st.Top5Logprobs[k]), at(fmt.Sprintf("alternative %q", t)))
						break
					}
				}
				// Missing: fine only as a tie at the answer's last place (a full list whose
				// last logprob is the golden one's within the tolerance).
				if !found && !(len(got.Top) >= topN && math.Abs(got.Top[len(got.Top)-1].Logprob-st.Top5Logprobs[k]) <= tol) {
					problems = append(problems, fmt.Sprintf("prompt %q step %d: transformers' top-5 token %q (id %d, logprob %.5g) is missing from the %d served alternatives",
						gp.Name, s, t, id, st.Top5Logprobs[k], len(got.Top)))
				}
			}
		}
	}
	if worst > tol || math.IsNaN(worst) {
		problems = append(problems, fmt.Sprintf("%s differs from transformers by %.3g > %.3g", worstAt, worst, tol))
	}
	ginkgo.GinkgoWriter.Printf("logprobs: %d prompts, worst |served - transformers| %.3g (%s)\n", len(g.Prompts), worst, worstAt)
	if len(reported) > 0 {
		ginkgo.GinkgoWriter.Printf("logprobs reported differently from the reference (not differences of generation):\n  %s\n", strings.Join(reported, "\n  "))
	}
	var parts []string
	if len(differs) > 0 {
		parts = append(parts, fmt.Sprintf("tokens differ from the reference on %d prompts:\n  %s", len(differs), strings.Join(differs, "\n  ")))
	}
	if len(problems) > 0 {
		parts = append(parts, fmt.Sprintf("logprobs differ from the reference on %d checks:\n  %s", len(problems), strings.Join(problems, "\n  ")))
	}
	if len(parts) > 0 {
		return fmt.Errorf("served logprobs disagree with transformers %s golden %s: %s",
			g.TransformersVersion, g.Fixture, strings.Join(parts, "\n"))
	}
	return nil
}

// LogprobsParity asserts CheckLogprobs: the served logprobs (OpenAI's `logprobs`) are
// transformers' log_softmax on the golden's greedy path.
func LogprobsParity(ctx context.Context, input func() LogprobsInput) {
	ginkgo.It("returns logprobs equal to transformers' log_softmax (greedy token and top-5 alternatives within thresholds)", Gate(GateParity), Task(TaskText), func(sctx ginkgo.SpecContext) {
		c, cancel := specContext(ctx, sctx)
		defer cancel()
		err := CheckLogprobs(c, input())
		if errors.Is(err, ErrNoLogprobs) {
			ginkgo.Skip(NotCheckable + err.Error())
		}
		passGate(err)
	})
}

// LogprobsInput is the logprobs gate's input for this suite: the family's golden, with the
// golden gate's tolerance; optional (skipped when refused) under the external launcher.
func (s *Suite) LogprobsInput() LogprobsInput {
	gi := s.GoldenInput()
	return LogprobsInput{API: s.API, Path: gi.Path, Tokenizer: s.Tokenizer, Tolerance: gi.Tolerance, MaxSteps: gi.MaxSteps, TieMargin: gi.TieMargin,
		Optional: s.State.Launcher == "external"}
}

// goldenThroughLogprobs is the golden gate for a server without /mq/v1/logits: the greedy
// tokens compared one by one through the answer's logprobs (and their values where the golden
// records them). A server that offers no logprobs skips with the reason.
func goldenThroughLogprobs(ctx context.Context, in GoldenInput) error {
	ginkgo.GinkgoHelper()
	g := in.Golden
	if g == nil {
		var err error
		if g, err = LoadGolden(in.Path); err != nil {
			return err
		}
	}
	values, _ := GoldenHasLogprobs(g)
	err := CheckLogprobs(ctx, LogprobsInput{API: in.API, Golden: g, Tokenizer: in.Tokenizer, Tolerance: in.Tolerance,
		MaxSteps: in.MaxSteps, TokensOnly: !values, Optional: true})
	if errors.Is(err, ErrNoLogprobs) {
		ginkgo.Skip(fmt.Sprintf("%sneeds qual-server's /mq/v1/logits or OpenAI logprobs (the server at %s has neither: %v)", NotCheckable, in.API.BaseURL, err))
	}
	return err
}
