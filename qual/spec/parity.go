package spec

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/modelqual/modelqual/qual/manifest"
	"github.com/modelqual/modelqual/server/tokenizer"
)

// Reference is what the parity gate needs from a family-owned reference forward pass
// (families/<f>/reference): greedy decoding with the logits that chose each token, and the
// logits of every position of a sequence, streamed so a long sequence over a large vocabulary
// need not be held at once.
type Reference interface {
	GreedyLogits(ids []int32, steps int) ([]int32, [][]float64, error)
	EachLogits(ids []int32, fn func(pos int, row []float64) error) error
}

// ParityInput is the input of ParityGate and CheckParity.
type ParityInput struct {
	// API reaches the served model.
	API *API
	// Reference is the family's own forward pass over the same checkpoint.
	Reference Reference
	// Tokenizer turns corpus prompts (and rendered chat conversations) into token ids, and the
	// reference's tokens into the text the server must return.
	Tokenizer *tokenizer.Tokenizer
	// Corpus is the family's prompt corpus (corpus.jsonl).
	Corpus []Prompt
	// Thresholds are the family's tolerances: max_abs_logit_diff over every logit of every
	// position, greedy_steps compared, and corpus_min_pass, the corpus gate.
	Thresholds manifest.Thresholds
	// MaxContext, when set, is the served context; prompts that do not fit with greedy_steps
	// are an input error rather than a parity failure.
	MaxContext int
}

func (in *ParityInput) check(fn string) error {
	switch {
	case in.API == nil:
		return fmt.Errorf("%s: ParityInput.API is nil; pass the suite's API", fn)
	case in.Reference == nil:
		return fmt.Errorf("%s: ParityInput.Reference is nil; pass the family reference loaded on the suite's checkpoint", fn)
	case in.Tokenizer == nil:
		return fmt.Errorf("%s: ParityInput.Tokenizer is nil", fn)
	case len(in.Corpus) == 0:
		return fmt.Errorf("%s: ParityInput.Corpus is empty; read the family's corpus.jsonl", fn)
	case in.Thresholds.GreedySteps < 1:
		return fmt.Errorf("%s: ParityInput.Thresholds.GreedySteps %d must be at least 1", fn, in.Thresholds.GreedySteps)
	case !(in.Thresholds.MaxAbsLogitDiff > 0):
		return fmt.Errorf("%s: ParityInput.Thresholds.MaxAbsLogitDiff %v must be positive", fn, in.Thresholds.MaxAbsLogitDiff)
	case in.Thresholds.CorpusMinPass > len(in.Corpus):
		return fmt.Errorf("%s: ParityInput.Thresholds.CorpusMinPass %d exceeds the corpus size %d; fix thresholds.yaml", fn, in.Thresholds.CorpusMinPass, len(in.Corpus))
	}
	return nil
}

// PromptParity is the outcome of one corpus prompt.
type PromptParity struct {
	Name         string
	PromptTokens int
	// MaxAbsDiff is the largest |served − reference| logit over every position and token.
	MaxAbsDiff float64
	// WorstPos and WorstToken locate MaxAbsDiff.
	WorstPos, WorstToken int
	// Problems lists what failed; empty when the prompt passed.
	Problems []string
}

// Passed reports whether the prompt passed every check.
func (p PromptParity) Passed() bool { return len(p.Problems) == 0 }

// ParityResult is the outcome of a corpus.
type ParityResult struct {
	Prompts []PromptParity
	Passed  int
	MinPass int
	// MaxAbsDiff is the largest logit difference over the whole corpus.
	MaxAbsDiff float64
}

// Summary is a one-line account for reports.
func (r *ParityResult) Summary() string {
	return fmt.Sprintf("%d of %d prompts pass (gate: at least %d); max |Δlogit| %.3g", r.Passed, len(r.Prompts), r.MinPass, r.MaxAbsDiff)
}

// PromptIDs turns a corpus prompt into the token ids a completions request carries: the raw
// prompt encoded without special tokens, or a conversation rendered with the checkpoint's own
// chat template and then encoded, exactly what transformers' goldens do.
func PromptIDs(tok *tokenizer.Tokenizer, p Prompt) ([]int32, error) {
	if !p.IsChat() {
		return tok.Encode(p.Prompt), nil
	}
	msgs := make([]tokenizer.Message, len(p.Messages))
	for i, m := range p.Messages {
		msgs[i] = tokenizer.Message(m)
	}
	text, err := tok.ApplyChatTemplate(msgs, p.AddGenerationPrompt, p.ChatTemplateKwargs)
	if err != nil {
		return nil, fmt.Errorf("render chat prompt %q: %w", p.Name, err)
	}
	return tok.Encode(text), nil
}

// CheckParity is ParityGate's core. For every corpus prompt it compares, with the prompt sent
// as token ids:
//
//   - generation: /v1/completions at temperature 0 with ignore_eos for greedy_steps tokens
//     must return exactly the text of the reference's greedy tokens, and usage must count
//     greedy_steps completion tokens;
//   - logits: /mq/v1/logits over the prompt followed by the reference's greedy tokens must pick
//     the reference's token at every generated step (greedy tokens exact) and stay within
//     max_abs_logit_diff of the reference at every position and every vocabulary entry.
//
// The corpus gate then requires corpus_min_pass prompts to pass. The error lists every failing
// prompt with its first problem.
func CheckParity(ctx context.Context, in ParityInput) (*ParityResult, error) {
	if err := in.check("spec.CheckParity"); err != nil {
		return nil, err
	}
	res := &ParityResult{MinPass: in.Thresholds.CorpusMinPass}
	if res.MinPass == 0 {
		res.MinPass = len(in.Corpus)
	}
	for _, p := range in.Corpus {
		pp, err := checkPromptParity(ctx, in, p)
		if err != nil {
			return res, err
		}
		res.Prompts = append(res.Prompts, pp)
		res.MaxAbsDiff = math.Max(res.MaxAbsDiff, pp.MaxAbsDiff)
		if pp.Passed() {
			res.Passed++
		}
	}
	if res.Passed < res.MinPass {
		var b strings.Builder
		fmt.Fprintf(&b, "parity gate: %d of %d corpus prompts pass, thresholds.yaml corpus_min_pass is %d (tolerance max_abs_logit_diff %.3g, greedy_steps %d):",
			res.Passed, len(res.Prompts), res.MinPass, in.Thresholds.MaxAbsLogitDiff, in.Thresholds.GreedySteps)
		for _, pp := range res.Prompts {
			if !pp.Passed() {
				fmt.Fprintf(&b, "\n  prompt %q (%d tokens): %s", pp.Name, pp.PromptTokens, strings.Join(pp.Problems, "; "))
			}
		}
		return res, errors.New(b.String())
	}
	return res, nil
}

func checkPromptParity(ctx context.Context, in ParityInput, p Prompt) (PromptParity, error) {
	pp := PromptParity{Name: p.Name}
	ids, err := PromptIDs(in.Tokenizer, p)
	if err != nil {
		return pp, err
	}
	pp.PromptTokens = len(ids)
	steps := in.Thresholds.GreedySteps
	if in.MaxContext > 0 && len(ids)+steps > in.MaxContext {
		return pp, fmt.Errorf("spec.CheckParity: prompt %q has %d tokens; with greedy_steps %d it exceeds the served context %d: shorten the prompt or raise build.max_context",
			p.Name, len(ids), steps, in.MaxContext)
	}
	refIDs, _, err := in.Reference.GreedyLogits(ids, steps)
	if err != nil {
		return pp, fmt.Errorf("spec.CheckParity: reference on prompt %q: %w", p.Name, err)
	}

	// Generation through the OpenAI route; a divergence is judged after the reference's
	// logits say whether it fell on a near-tie.
	textStep := -1
	ans, err := in.API.Complete(ctx, "/v1/completions", map[string]any{
		"prompt": ids, "max_tokens": steps, "temperature": 0, "ignore_eos": true,
	})
	if err != nil {
		pp.Problems = append(pp.Problems, fmt.Sprintf("generation request failed: %v", err))
	} else {
		textStep = divergenceStep(in.Tokenizer, ids, refIDs, ans.Text)
		if ans.HasUsage && ans.CompletionTokens != steps {
			pp.Problems = append(pp.Problems, fmt.Sprintf("usage.completion_tokens %d, want %d (ignore_eos with max_tokens %d)", ans.CompletionTokens, steps, steps))
		}
	}

	// Logits through the engine's logits entry point, teacher-forced on the reference's tokens.
	seq := append(append([]int32(nil), ids...), refIDs[:steps-1]...)
	served, vocab, err := in.API.Logits(ctx, seq)
	if err != nil {
		pp.Problems = append(pp.Problems, fmt.Sprintf("logits request failed: %v", err))
		return pp, nil
	}
	tol := in.Thresholds.MaxAbsLogitDiff
	firstBad := -1
	var firstBadDiff float64
	greedyReported := false
	margin := in.Thresholds.GreedyTieMargin
	refTie := make([]bool, steps) // the reference's chosen token within margin of its runner-up
	err = in.Reference.EachLogits(seq, func(pos int, row []float64) error {
		if len(row) != vocab {
			return fmt.Errorf("spec.CheckParity: reference vocabulary %d, served %d: the server serves another checkpoint", len(row), vocab)
		}
		s := served[pos*vocab : (pos+1)*vocab]
		posMax, posTok, best := 0.0, 0, 0
		for j, r := range row {
			d := math.Abs(float64(s[j]) - r)
			if d > posMax || math.IsNaN(d) {
				posMax, posTok = d, j
			}
			if s[j] > s[best] {
				best = j
			}
		}
		if posMax > pp.MaxAbsDiff || math.IsNaN(posMax) {
			pp.MaxAbsDiff, pp.WorstPos, pp.WorstToken = posMax, pos, posTok
		}
		if (posMax > tol || math.IsNaN(posMax)) && firstBad < 0 {
			firstBad, firstBadDiff = pos, posMax
		}
		step := pos - (len(ids) - 1)
		if step >= 0 && margin > 0 {
			for j, r := range row {
				if int32(j) != refIDs[step] && row[refIDs[step]]-r <= margin {
					refTie[step] = true
					break
				}
			}
		}
		if step >= 0 && !greedyReported && int32(best) != refIDs[step] && !refTie[step] {
			greedyReported = true
			pp.Problems = append(pp.Problems, fmt.Sprintf("greedy step %d: the engine's argmax is token %d (logit %.6g), the reference chose %d (engine logit %.6g)",
				step, best, s[best], refIDs[step], s[refIDs[step]]))
		}
		return nil
	})
	if err != nil {
		return pp, err
	}
	if textStep >= 0 && (textStep >= steps || !refTie[textStep]) {
		pp.Problems = append(pp.Problems, textDivergence(in.Tokenizer, ids, refIDs, ans.Text))
	}
	if firstBad >= 0 {
		pp.Problems = append(pp.Problems, fmt.Sprintf("logits beyond max_abs_logit_diff %.3g from position %d of %d (|Δ| %.3g there); worst |Δ| %.3g at position %d token %d",
			tol, firstBad, len(seq), firstBadDiff, pp.MaxAbsDiff, pp.WorstPos, pp.WorstToken))
	}
	return pp, nil
}

// textDivergence explains where served text leaves the reference's: the first reference token
// whose text after prompt the served text no longer starts with.
func textDivergence(tok *tokenizer.Tokenizer, prompt, refIDs []int32, served string) string {
	for k := 1; k <= len(refIDs); k++ {
		if prefix := continuation(tok, prompt, refIDs[:k]); !strings.HasPrefix(served, prefix) {
			return fmt.Sprintf("served text differs from the reference's greedy tokens from step %d (reference token %d); reference %q, served %q",
				k-1, refIDs[k-1], clip(continuation(tok, prompt, refIDs), 120), clip(served, 120))
		}
	}
	return fmt.Sprintf("served text continues past the reference's %d tokens: reference %q, served %q", len(refIDs), clip(continuation(tok, prompt, refIDs), 120), clip(served, 120))
}

func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}
