package spec

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/onsi/ginkgo/v2"

	"github.com/modelqual/modelqual/server/tokenizer"
)

// expectedFinish is what an OpenAI-compatible server must answer for a greedy generation
// whose tokens are known from an independent implementation (a transformers golden).
type expectedFinish struct {
	Text   string
	Finish string // "stop" or "length"
	Tokens int    // completion tokens generated, the one that ended generation included
}

// openAIFinish is the reference of OpenAI's end-of-generation semantics over reference tokens,
// written apart from the server's stop matcher: generation ends at the first end-of-sequence
// token (which adds no text), or at the first token after which the decoded text contains a
// stop string (the answer is the text before the earliest occurrence of any stop string; the
// stop string itself is never returned, unless include: vLLM's include_stop_str_in_output,
// which keeps the matched stop string, the shortest of those starting there), or after
// maxTokens tokens (finish "length"). Every prefix is decoded whole, as it reads after the
// prompt (continuation), so a stop string split across tokens, or lying inside one, is found
// where it is.
func openAIFinish(tok *tokenizer.Tokenizer, prompt, ids []int32, eos map[int32]bool, maxTokens int, stops []string, include bool) expectedFinish {
	n := min(maxTokens, len(ids))
	for i := 0; i < n; i++ {
		if eos[ids[i]] {
			return expectedFinish{Text: continuation(tok, prompt, ids[:i]), Finish: "stop", Tokens: i + 1}
		}
		text := continuation(tok, prompt, ids[:i+1])
		cut, end := -1, 0
		for _, s := range stops {
			if j := strings.Index(text, s); j >= 0 && (cut < 0 || j < cut || j == cut && j+len(s) < end) {
				cut, end = j, j+len(s)
			}
		}
		if cut >= 0 {
			if include {
				cut = end
			}
			return expectedFinish{Text: text[:cut], Finish: "stop", Tokens: i + 1}
		}
	}
	return expectedFinish{Text: continuation(tok, prompt, ids[:n]), Finish: "length", Tokens: n}
}

// StopInput is the input of StopStrings and CheckStops.
type StopInput struct {
	// API reaches the served model.
	API *API
	// Golden is the fixture's transformers golden (its greedy tokens are the reference tokens);
	// Path is read when Golden is nil.
	Golden *Golden
	Path   string
	// Tokenizer decodes the golden tokens.
	Tokenizer *tokenizer.Tokenizer
	// MaxTokens is each request's max_tokens (16 when 0).
	MaxTokens int
	// SkipInclude leaves out the include_stop_str_in_output requests (vLLM's extension): for a
	// server that does not offer it. StopStrings (OpenAI's semantics) always leaves them out;
	// StopStringInclusion runs them alone.
	SkipInclude bool
	// RequireVendor: the server must offer the vendor extensions the gate tests (qual-server,
	// which the process and container launchers start, claims them); otherwise a server that
	// refuses or ignores one skips the vendor gate as not checkable.
	RequireVendor bool
	// TieMargin > 0 (a reduced-precision GPU run, thresholds greedy_tie_margin): a golden
	// prompt whose served greedy text leaves the golden's (at a near-tie, which the golden
	// gate judges) gives no stop cases; at least 5 cases must remain.
	TieMargin float64

	onlyInclude bool // StopStringInclusion: the include_stop_str_in_output requests alone
}

// stopCase is one request of the stop-string gate.
type stopCase struct {
	name   string
	prompt GoldenPrompt
	stops  []string
}

// stopCases derives stop strings from the golden tokens themselves, so they occur where the
// case says: inside the first token, exactly one later token's text, across a token boundary,
// several at once (the earliest wins), and one that never occurs.
func stopCases(tok *tokenizer.Tokenizer, g *Golden, maxTokens int) []stopCase {
	var out []stopCase
	var haveOne, haveAcross, haveFirst bool
	for _, gp := range g.Prompts {
		ids := gp.GreedyIDs
		if len(ids) > maxTokens {
			ids = ids[:maxTokens]
		}
		if len(ids) < 2 || !cleanTokens(tok, ids) {
			continue
		}
		// Each token's text as it reads in the answer (after the prompt and the tokens
		// before it): a SentencePiece piece "▁world" is " world" there.
		texts := make([]string, len(ids))
		for i := range ids {
			texts[i] = continuation(tok, append(slices.Clip(gp.PromptIDs), ids[:i]...), ids[i:i+1])
		}
		// Inside the first token: its text without the first and last character.
		if r := []rune(texts[0]); !haveFirst && len(r) >= 3 {
			haveFirst = true
			out = append(out, stopCase{name: gp.Name + ": a stop inside the first token", prompt: gp, stops: []string{string(r[1 : len(r)-1])}})
		}
		// Exactly one later token's text, first seen there.
		for j := 1; j < len(ids) && !haveOne; j++ {
			if texts[j] != "" && !strings.Contains(continuation(tok, gp.PromptIDs, ids[:j]), texts[j]) && strings.TrimSpace(texts[j]) != "" {
				haveOne = true
				out = append(out, stopCase{name: fmt.Sprintf("%s: a stop that is token %d's text", gp.Name, j), prompt: gp, stops: []string{texts[j]}})
			}
		}
		// Across the boundary of tokens 0 and 1: the last two characters of the first and the
		// first two of the second.
		a, b := []rune(texts[0]), []rune(texts[1])
		if !haveAcross && len(a) >= 2 && len(b) >= 2 {
			across := string(a[len(a)-2:]) + string(b[:2])
			if strings.Index(texts[0]+texts[1], across) == len(texts[0])-len(string(a[len(a)-2:])) {
				haveAcross = true
				out = append(out,
					stopCase{name: gp.Name + ": a stop across tokens 0 and 1", prompt: gp, stops: []string{across}},
					stopCase{name: gp.Name + ": several stops, the earliest wins", prompt: gp, stops: []string{"\x01never\x01", across, texts[len(texts)-1]}},
					stopCase{name: gp.Name + ": a stop that never occurs", prompt: gp, stops: []string{"\x01never\x01"}},
				)
			}
		}
	}
	return out
}

// cleanTokens reports whether each token decodes alone to valid UTF-8 without replacement
// characters, so that stop strings cut from their texts are exact.
func cleanTokens(tok *tokenizer.Tokenizer, ids []int32) bool {
	for _, id := range ids {
		s := tok.Decode([]int32{id})
		if !utf8.ValidString(s) || strings.ContainsRune(s, utf8.RuneError) {
			return false
		}
	}
	return true
}

// CheckStops is StopStrings' core. For stop strings cut from the golden's own greedy text (in
// the first token, one later token, across tokens, several, none), /v1/completions at
// temperature 0, streamed and not, must return what openAIFinish computes over the golden
// tokens: the text before the earliest stop (the stop itself excluded, or included with
// include_stop_str_in_output), finish_reason "stop"
// (or "length"), usage counting the tokens generated up to the one completing the stop, and
// streamed deltas that concatenate to the same text.
func CheckStops(ctx context.Context, in StopInput) error {
	const fn = "spec.CheckStops"
	switch {
	case in.API == nil:
		return fmt.Errorf("%s: StopInput.API is nil", fn)
	case in.Tokenizer == nil:
		return fmt.Errorf("%s: StopInput.Tokenizer is nil", fn)
	case in.Golden == nil && in.Path == "":
		return fmt.Errorf("%s: StopInput.Golden and StopInput.Path are both empty", fn)
	}
	g := in.Golden
	if g == nil {
		var err error
		if g, err = LoadGolden(in.Path); err != nil {
			return err
		}
	}
	maxTokens := in.MaxTokens
	if maxTokens == 0 {
		maxTokens = 16
	}
	if in.TieMargin > 0 {
		kept := *g
		kept.Prompts = nil
		for _, gp := range g.Prompts {
			n := min(maxTokens, len(gp.GreedyIDs))
			ans, err := in.API.Complete(ctx, "/v1/completions", map[string]any{"prompt": gp.PromptIDs, "max_tokens": n, "temperature": 0, "ignore_eos": true})
			if err != nil {
				return fmt.Errorf("%s: prompt %q without stops: %w", fn, gp.Name, err)
			}
			if ans.Text == continuation(in.Tokenizer, gp.PromptIDs, gp.GreedyIDs[:n]) {
				kept.Prompts = append(kept.Prompts, gp)
			}
		}
		ginkgo.GinkgoWriter.Printf("stop strings: %d of %d golden prompts keep the golden's greedy text on this reduced-precision run\n", len(kept.Prompts), len(g.Prompts))
		g = &kept
	}
	cases := stopCases(in.Tokenizer, g, maxTokens)
	if len(cases) < 5 {
		return fmt.Errorf("%s: golden %s yields %d stop cases, want at least 5 (in the first token, one token, across tokens, several, none): its greedy texts are too short or not clean UTF-8", fn, g.Fixture, len(cases))
	}
	var problems []string
	includes := []bool{false, true}
	if in.SkipInclude {
		includes = includes[:1]
	}
	if in.onlyInclude {
		includes = includes[1:]
	}
	for _, c := range cases {
		for _, include := range includes {
			want := openAIFinish(in.Tokenizer, c.prompt.PromptIDs, c.prompt.GreedyIDs, nil, maxTokens, c.stops, include)
			for _, stream := range []bool{false, true} {
				body := map[string]any{"prompt": c.prompt.PromptIDs, "max_tokens": maxTokens, "temperature": 0, "ignore_eos": true, "stop": c.stops, "stream": stream}
				if include {
					body["include_stop_str_in_output"] = true
				}
				if stream {
					body["stream_options"] = map[string]any{"include_usage": true}
				}
				ans, err := in.API.Complete(ctx, "/v1/completions", body)
				if p := finishProblem(ans, err, want, stream); p != "" {
					problems = append(problems, fmt.Sprintf("%s (stop %q, stream %v, include_stop_str_in_output %v): %s", c.name, c.stops, stream, include, p))
				}
			}
		}
	}
	if len(problems) > 0 {
		return errors.New("stop-string gate: the server ends generation differently from OpenAI's stop semantics over the transformers tokens:\n  " + strings.Join(problems, "\n  "))
	}
	return nil
}

// finishProblem compares an answer with the expected end of generation; "" when they agree.
func finishProblem(ans *Answer, err error, want expectedFinish, stream bool) string {
	if err != nil {
		return fmt.Sprintf("request failed: %v", err)
	}
	var p []string
	// An engine that holds back an incomplete UTF-8 character at the end generated the same
	// tokens and reports them differently: not a difference.
	if ans.Text != want.Text && !heldBackTail(ans.Text, want.Text) {
		p = append(p, fmt.Sprintf("text %q, want %q", clip(ans.Text, 80), clip(want.Text, 80)))
	}
	if ans.FinishReason != want.Finish {
		p = append(p, fmt.Sprintf("finish_reason %q, want %q", ans.FinishReason, want.Finish))
	}
	if ans.HasUsage && ans.CompletionTokens != want.Tokens {
		p = append(p, fmt.Sprintf("usage.completion_tokens %d, want %d", ans.CompletionTokens, want.Tokens))
	}
	if stream && strings.Join(ans.Deltas, "") != ans.Text {
		p = append(p, "streamed deltas do not concatenate to the text")
	}
	return strings.Join(p, "; ")
}

// StopStrings asserts that stop strings end generation as OpenAI's semantics say (CheckStops):
// OpenAI's `stop` alone, the stop text excluded. It tests OpenAI semantics only; vLLM's
// include_stop_str_in_output is StopStringInclusion's.
func StopStrings(ctx context.Context, input func() StopInput) {
	ginkgo.It("ends generation at stop strings as OpenAI does (in the first token, one token, across tokens, several; the stop text excluded)", Gate(GateParity), Task(TaskText), func(sctx ginkgo.SpecContext) {
		c, cancel := specContext(ctx, sctx)
		defer cancel()
		in := input()
		in.SkipInclude = true
		passGate(CheckStops(c, in))
	})
}

// StopStringInclusion asserts vLLM's include_stop_str_in_output (a vendor extension, not
// OpenAI's): with it, the matched stop string is kept at the end of the answer. A server that
// refuses or ignores the field skips as not checkable, unless StopInput.RequireVendor.
func StopStringInclusion(ctx context.Context, input func() StopInput) {
	ginkgo.It("keeps the matched stop string with include_stop_str_in_output (vLLM extension)", Gate(GateParity), Task(TaskText), func(sctx ginkgo.SpecContext) {
		c, cancel := specContext(ctx, sctx)
		defer cancel()
		in := input()
		if !in.RequireVendor {
			if why := probeStopInclusion(c, in); why != "" {
				ginkgo.Skip(NotCheckable + "include_stop_str_in_output " + why)
			}
		}
		in.onlyInclude = true
		passGate(CheckStops(c, in))
	})
}

// probeStopInclusion asks for one stop string of the golden's own greedy text with
// include_stop_str_in_output: "" when the answer keeps it, else why the extension is absent
// (refused, or ignored: the stop text dropped as OpenAI does).
func probeStopInclusion(ctx context.Context, in StopInput) string {
	if in.API == nil || in.Tokenizer == nil {
		return "" // CheckStops names the missing input
	}
	g := in.Golden
	if g == nil {
		var err error
		if g, err = LoadGolden(in.Path); err != nil {
			return ""
		}
	}
	for _, c := range stopCases(in.Tokenizer, g, 16) {
		want := openAIFinish(in.Tokenizer, c.prompt.PromptIDs, c.prompt.GreedyIDs, nil, 16, c.stops, true)
		plain := openAIFinish(in.Tokenizer, c.prompt.PromptIDs, c.prompt.GreedyIDs, nil, 16, c.stops, false)
		if want.Finish != "stop" || want.Text == plain.Text {
			continue
		}
		ans, err := in.API.Complete(ctx, "/v1/completions", map[string]any{"prompt": c.prompt.PromptIDs, "max_tokens": 16, "temperature": 0,
			"ignore_eos": true, "stop": c.stops, "include_stop_str_in_output": true})
		switch {
		case err != nil && StatusOf(err)/100 == 4:
			return fmt.Sprintf("was refused: %v", err)
		case err != nil:
			return "" // CheckStops reports the failure
		case ans.Text == plain.Text:
			return fmt.Sprintf("was ignored: asked to keep stop %q, the server answered the text without it, as OpenAI does", c.stops[0])
		}
		return ""
	}
	return ""
}
